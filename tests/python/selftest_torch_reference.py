"""Self-tests of the PyTorch reference (torch_reference.py) and of the end-to-end comparisons
(end_to_end.py): a reference has to be shown right before its verdict on megaton means anything.

Checks the file formats, the models' invariants (causality, GQA, interleaved vs half RoPE), the llama3
frequencies and the lr schedules against values worked out by hand, the AdamW restatement against
torch.optim.AdamW, the tolerances against the same training in fp64 (an fp32 engine doing everything
right must pass them), and that every comparison fails on NaN or Inf.

Usage (CTest runs it): /usr/bin/python3 tests/python/selftest_torch_reference.py
"""
import contextlib
import io
import json
import math
import struct
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from data_reference import run_tests
from end_to_end import GRAD_NORM_TOL, TRAIN_LOSS_TOL, WEIGHT_TOL, Checker, rel_diff
from torch_reference import (GPT2, LLAMA3_SCALING, MMIDIDX_MAGIC, AdamW, GPT2Config, Llama, LlamaConfig,
                             TokenSamples, TrainSettings, build_model, decays, hf_tensors, lm_loss, load_hf,
                             random_init, read_megatron_tokens, read_safetensors, rel_err, rope_inv_freq, save_hf,
                             scheduled_lr, torch_adamw, train_reference, write_safetensors)

TOKENS = torch.randint(0, 257, (2, 33), generator=torch.Generator().manual_seed(3))


def tiny_gpt2(tied=True) -> GPT2Config:
    return GPT2Config(vocab_size=257, n_positions=64, n_embd=48, n_layer=2, n_head=4, tie_word_embeddings=tied)


def tiny_llama(tied=False, scaling=None, rope_layout="half") -> LlamaConfig:
    return LlamaConfig(vocab_size=257, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                       num_attention_heads=6, num_key_value_heads=2, head_dim=8, rope_theta=10000.0,
                       rope_scaling=scaling, max_position_embeddings=1024, tie_word_embeddings=tied,
                       rope_layout=rope_layout)


ALL_CONFIGS = (tiny_gpt2(), tiny_gpt2(tied=False), tiny_llama(), tiny_llama(True, LLAMA3_SCALING),
               tiny_llama(rope_layout="interleaved"))


def worst(errors) -> float:
    """The largest error, NaN if any is NaN (Python's max() drops a NaN that does not come first)."""
    return float(np.max(np.asarray(list(errors), dtype=np.float64)))


def describe(cfg) -> str:
    return f"{type(cfg).__name__}(tied={cfg.tie_word_embeddings}, rope={getattr(cfg, 'rope_layout', '-')})"


def test_safetensors(tmp: Path) -> None:
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b.c": np.array([-1, 7], dtype=np.int64)}
    write_safetensors(tmp / "t.safetensors", arrays, {"format": "pt"})
    back = read_safetensors(tmp / "t.safetensors")
    assert back.keys() == arrays.keys() and all(np.array_equal(back[k], arrays[k]) for k in arrays)
    header_len = struct.unpack("<Q", (tmp / "t.safetensors").read_bytes()[:8])[0]
    assert header_len % 8 == 0
    bf16 = np.array([1.5, -2.25], dtype=np.float32).view(np.uint32) >> 16
    hdr = json.dumps({"x": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    (tmp / "bf.safetensors").write_bytes(struct.pack("<Q", len(hdr)) + hdr + bf16.astype("<u2").tobytes())
    assert read_safetensors(tmp / "bf.safetensors")["x"].tolist() == [1.5, -2.25]


def test_megatron_tokens_and_stream_samples(tmp: Path) -> None:
    # Two sequences written with pointers out of order, read back in index order.
    seqs = [np.array([5, 6, 256], dtype=np.uint16), np.array([7, 8, 9, 256], dtype=np.uint16)]
    (tmp / "d.bin").write_bytes(seqs[1].tobytes() + seqs[0].tobytes())
    idx = MMIDIDX_MAGIC + struct.pack("<QBQQ", 1, 8, 2, 3)
    idx += np.array([3, 4], dtype="<i4").tobytes() + np.array([8, 0], dtype="<i8").tobytes()
    idx += np.array([0, 1, 2], dtype="<i8").tobytes()
    (tmp / "d.idx").write_bytes(idx)
    tokens = read_megatron_tokens(tmp / "d")
    assert tokens.tolist() == [5, 6, 256, 7, 8, 9, 256], tokens
    x, y = TokenSamples(tokens, 3).batch([1, 0, 2])  # 2 samples: sample 2 wraps around to sample 0
    assert x.tolist() == [[7, 8, 9], [5, 6, 256], [5, 6, 256]], x
    assert y.tolist() == [[8, 9, 256], [6, 256, 7], [6, 256, 7]], y


def test_init_loss_and_hf_round_trip(tmp: Path) -> None:
    # Losses at init are near ln(V) (a tied RMSNorm model sits a little above: each input token's own
    # embedding leaks into its logit).
    for cfg in ALL_CONFIGS:
        model = random_init(build_model(cfg), seed=1)
        loss = lm_loss(model(TOKENS[:, :-1]), TOKENS[:, 1:]).item()
        assert abs(loss - math.log(257)) < 0.1, (cfg, loss)
        folder = tmp / f"m_{describe(cfg)}"
        save_hf(model, folder)
        again = load_hf(folder, getattr(cfg, "rope_layout", "half"))
        assert again.config == cfg, again.config
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters()))
        print(f"  {describe(cfg)}: loss at init {loss:.4f} (ln V = {math.log(257):.4f}), HF folder round trip")


def test_gpt2_bare_names(tmp: Path) -> None:
    bare = {n.removeprefix("transformer."): p for n, p in random_init(GPT2(tiny_gpt2()), 2).named_parameters()}
    bare["h.0.attn.bias"] = torch.ones(1, 1, 64, 64)  # legacy mask buffer: ignored
    (tmp / "bare").mkdir()
    (tmp / "bare" / "config.json").write_text(json.dumps(tiny_gpt2().to_hf()))
    write_safetensors(tmp / "bare" / "model.safetensors", bare)
    assert torch.equal(load_hf(tmp / "bare").transformer.wte.weight, bare["wte.weight"])


def test_causal_masking(tmp: Path) -> None:
    # Changing the last token leaves earlier logits unchanged.
    for cfg in (tiny_gpt2(), tiny_llama(), tiny_llama(rope_layout="interleaved")):
        model = random_init(build_model(cfg), seed=4)
        changed = TOKENS[:1, :32].clone()
        changed[0, -1] = (changed[0, -1] + 1) % 257
        a, b = model(TOKENS[:1, :32]), model(changed)
        assert torch.allclose(a[:, :-1], b[:, :-1], atol=1e-6) and not torch.allclose(a[:, -1], b[:, -1]), cfg


def test_gqa_equals_repeated_kv_heads(tmp: Path) -> None:
    gqa = random_init(Llama(tiny_llama()), seed=5)
    mha = Llama(LlamaConfig(**{**asdict(tiny_llama()), "num_key_value_heads": 6}))
    with torch.no_grad():
        for name, p in mha.named_parameters():
            src = dict(gqa.named_parameters())[name]
            if name.endswith(("k_proj.weight", "v_proj.weight")):
                src = src.view(2, 1, 8, 48).expand(2, 3, 8, 48).reshape(48, 48)
            p.copy_(src)
    assert torch.allclose(gqa(TOKENS), mha(TOKENS), atol=1e-5)


def test_interleaved_rope_equals_half_on_permuted_rows(tmp: Path) -> None:
    # The two RoPE layouts are one model up to the order of each head's q/k rows: an HF folder loaded
    # with interleaved RoPE (rows taken out of HF order) computes what the half-RoPE load computes.
    # The two rotations are written independently (complex product vs rotate_half), so this checks both.
    for scaling in (None, LLAMA3_SCALING):
        save_hf(random_init(Llama(tiny_llama(scaling=scaling)), seed=8), tmp / "half")
        half, interleaved = load_hf(tmp / "half"), load_hf(tmp / "half", "interleaved")
        q = "model.layers.0.self_attn.q_proj.weight"
        moved = dict(interleaved.named_parameters())[q]
        assert not torch.equal(moved, dict(half.named_parameters())[q]), "q rows must be permuted"
        # Row 2i + s of a head holds HF row s * D/2 + i (D = 8): head 0's first rows are HF rows 0, 4, 1, 5.
        assert torch.equal(moved[:4], dict(half.named_parameters())[q][[0, 4, 1, 5]])
        assert torch.allclose(half(TOKENS), interleaved(TOKENS), atol=1e-5)
        assert all(torch.equal(hf_tensors(half)[n], t) for n, t in hf_tensors(interleaved).items())


def test_llama3_scaling(tmp: Path) -> None:
    # For head_dim 8 / theta 1e4 / original 128 the four frequencies fall in the kept, interpolated and
    # divided bands; compare with values worked out by hand.
    inv = rope_inv_freq(tiny_llama(scaling=LLAMA3_SCALING)).double()
    base = 1e4 ** -(torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    smooth = (128 / (2 * math.pi / base[1]) - 1) / 3
    want = torch.stack([base[0], (1 - smooth) * base[1] / 8 + smooth * base[1], base[2] / 8, base[3] / 8])
    assert torch.allclose(inv, want, rtol=1e-6), (inv, want)


def test_weight_decay_groups(tmp: Path) -> None:
    flags = decays(GPT2(tiny_gpt2(tied=False)))
    assert flags["lm_head.weight"] and flags["transformer.h.0.attn.c_attn.weight"]
    assert not any(flags[n] for n in ("transformer.wte.weight", "transformer.wpe.weight",
                                      "transformer.h.0.ln_1.weight", "transformer.h.0.mlp.c_fc.bias",
                                      "transformer.ln_f.bias"))
    flags = decays(Llama(tiny_llama()))
    assert flags["lm_head.weight"] and flags["model.layers.1.mlp.down_proj.weight"]
    assert not any(flags[n] for n in ("model.embed_tokens.weight", "model.norm.weight",
                                      "model.layers.0.input_layernorm.weight"))


def test_lr_schedules_by_hand(tmp: Path) -> None:
    # Megatron's get_lr at hand-picked steps: peak 1, min 0.1, 10 warmup steps, decay over steps 10..110.
    s = TrainSettings(lr=1.0, min_lr=0.1, warmup=10, decay_iters=110)
    want = {
        "constant": {1: 0.1, 5: 0.5, 10: 1.0, 11: 1.0, 110: 1.0, 1000: 1.0},  # min_lr unused
        "linear": {5: 0.5, 10: 1.0, 35: 0.775, 60: 0.55, 110: 0.1, 111: 0.1, 1000: 0.1},
        # cosine at a quarter of the decay: 0.1 + 0.9 * (1 + cos(pi/4)) / 2
        "cosine": {5: 0.5, 10: 1.0, 35: 0.1 + 0.45 * (1 + math.sqrt(0.5)), 60: 0.55, 110: 0.1, 1000: 0.1},
    }
    for style, values in want.items():
        for step, lr in values.items():
            got = scheduled_lr(replace(s, decay_style=style), step)
            assert abs(got - lr) < 1e-15, (style, step, got, lr)
    # Without warmup the first update runs at the peak; lr_decay_iters 0 means the training length.
    assert scheduled_lr(TrainSettings(lr=2.0, decay_style="linear", steps=4), 1) == 1.5
    assert scheduled_lr(TrainSettings(lr=2.0, decay_style="linear", steps=4), 4) == 0.0


def test_adamw_equals_torch(tmp: Path) -> None:
    # Bitwise equal over 4 clipped steps at changing learning rates.
    for cfg in (tiny_gpt2(), tiny_llama()):
        ours, theirs = random_init(build_model(cfg), 6), random_init(build_model(cfg), 6)
        opt_ours, opt_theirs = AdamW(ours, 1e-2), torch_adamw(theirs, 1e-2)
        for k in range(4):
            x, y = TOKENS[:, k:k + 16], TOKENS[:, k + 1:k + 17]
            lr = 1e-2 / (k + 1)
            opt_ours.lr = lr
            for group in opt_theirs.param_groups:
                group["lr"] = lr
            for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
                model.zero_grad()
                lm_loss(model(x), y).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                opt.step()
        diff = worst((p - q).abs().max().item() for p, q in zip(ours.parameters(), theirs.parameters()))
        assert diff == 0.0, (cfg, diff)


def test_tolerances_above_fp32_floor(tmp: Path) -> None:
    # The fp32 reference against the same math in fp64 must pass the end-to-end tolerances, or they
    # would be unfair to any correct fp32 engine. With warmup and a cosine decay, as the tests train.
    samples = TokenSamples(TOKENS.flatten().numpy(), 8)
    s = TrainSettings(batch=2, min_lr=1e-4, warmup=2, decay_style="cosine")
    for cfg in ALL_CONFIGS:
        m32 = random_init(build_model(cfg), 7)
        m64 = random_init(build_model(cfg), 7).double()
        h32, h64 = train_reference(m32, samples, s), train_reference(m64, samples, s)
        loss_err = worst(rel_diff(a["loss"], b["loss"]) for a, b in zip(h32, h64))
        norm_err = worst(rel_diff(a["grad_norm"], b["grad_norm"]) for a, b in zip(h32, h64))
        w_err = {n: rel_err(p.detach().numpy(), q.detach().numpy())
                 for (n, p), (_, q) in zip(m32.named_parameters(), m64.named_parameters())}
        name = max(w_err, key=w_err.get)
        print(f"  {describe(cfg)} fp32 vs fp64 after {s.steps} steps: loss {loss_err:.1e}, "
              f"grad_norm {norm_err:.1e}, worst weight {name} {worst(w_err.values()):.1e}")
        assert loss_err < TRAIN_LOSS_TOL and norm_err < GRAD_NORM_TOL and worst(w_err.values()) < WEIGHT_TOL


def test_comparisons_fail_on_nan_and_inf(tmp: Path) -> None:
    # Every way a comparison sees a number: as megaton's value, as the reference's, at the first or a
    # later element; with NaN, +-Inf, or a JSON null (how a NaN reaches metrics.jsonl). The [FAIL] lines
    # the checks print are expected, so they are kept out of the log.
    with contextlib.redirect_stdout(io.StringIO()):
        nan_and_inf_fail()


def nan_and_inf_fail() -> None:
    bad_values = (math.nan, math.inf, -math.inf)
    good = {"loss": 5.0, "grad_norm": 1.0, "lr": 1e-3}
    for key in good:
        for bad in (*bad_values, None):
            chk = Checker()
            chk.step("step", {**good, key: bad}, good, 1e-3)
            assert len(chk.failures) == 1, (key, bad, chk.failures)
        for bad in bad_values:
            chk = Checker()
            chk.step("step", good, {**good, key: bad}, 1e-3)
            assert len(chk.failures) == 1, (key, bad, "in the reference")
    chk = Checker()
    chk.step("step", {k: v for k, v in good.items() if k != "lr"}, good, 1e-3)
    assert len(chk.failures) == 1, "a missing lr must fail"
    for bad in bad_values:
        for at in (0, 5):
            spoiled = np.ones(6, dtype=np.float32)
            spoiled[at] = bad
            for got, want in ((spoiled, np.ones(6, dtype=np.float32)), (np.ones(6, dtype=np.float32), spoiled)):
                chk = Checker()
                chk.tensors("t", {"w": got}, {"w": want}, 1e-4)
                assert len(chk.failures) == 1, (bad, at, got, want)
    for got, want, scale in ((1.0, 1.0, 0.0), (1.0, 0.0, None)):
        chk = Checker()
        chk.value("zero scale", rel_diff(got, want, scale), 1.0)
        assert len(chk.failures) == 1
    # The self-tests' own maximum (fp32 vs fp64, AdamW) keeps a NaN wherever it is.
    for errors in ([math.nan, 0.0], [0.0, math.nan, 1.0]):
        assert math.isnan(worst(errors)), errors


def main() -> int:
    tests = [(name.removeprefix("test_"), fn) for name, fn in globals().items() if name.startswith("test_")]
    return run_tests(tests, "torch_reference_selftest_")


if __name__ == "__main__":
    sys.exit(main())
