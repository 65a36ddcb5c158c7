"""Quantised HF folders checked outside Megaton: `megaton convert --weights-dtype fp8-block|int8` of a
PyTorch-written folder, then

  * the stored codes and scales equal an independent quantisation of the f32 weights (fp8-block:
    fp8_reference.py's numpy DeepSeek-V3 128 x 128 blocks; int8: one symmetric scale per output row,
    a GPT-2 Conv1D's rows being its stored columns), the other tensors bf16;
  * `megaton eval` of the quantised folder gives the loss and every gradient of the PyTorch reference
    model built from the dequantised weights (code x scale_inv, DeepSeek's weight_dequant).

Usage (CTest runs it from the build directory): /usr/bin/python3 test_quantized_folder_torch.py --megaton PATH
"""
import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fp8_reference  # noqa: E402
from end_to_end import (GRAD_TOL, LOSS_TOL, Checker, MegatonCli, MegatonError, preprocess_corpus,  # noqa: E402
                        rel_diff, sample_corpus)
from torch_reference import (GPT2Config, LlamaConfig, TokenSamples, build_model, lm_loss, load_hf,  # noqa: E402
                             random_init, read_safetensors, save_hf, write_safetensors)

SEQ_LEN, SAMPLES = 32, 4
MODELS = {
    # 192-wide layers: two 128-column blocks, the second ragged; q / k / v and gate / up blocked apart.
    "llama": LlamaConfig(vocab_size=257, hidden_size=192, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5,
                         rope_theta=10000.0, max_position_embeddings=64, tie_word_embeddings=False),
    "gpt2": GPT2Config(vocab_size=257, n_positions=64, n_embd=192, n_layer=2, n_head=6),
}
E4M3 = {code: value for value, code in fp8_reference.value_table("e4m3").items()}


def quantised_name(name: str) -> bool:
    """The tensors Megaton stores in 8 bits: every layer's linear weights and an untied lm_head."""
    return name == "lm_head.weight" or (".h." in name or ".layers." in name) and name.endswith(
        ("proj.weight", "c_attn.weight", "c_fc.weight"))


def conv1d(name: str) -> bool:
    return ".h." in name  # GPT-2's Conv1D weights are stored [in, out]


def int8_reference(w: np.ndarray, transposed: bool):
    """Codes and scale_inv, one scale per output row: per stored row, or per stored column for a Conv1D."""
    rows = w.T if transposed else w
    amax = np.max(np.abs(rows), axis=1).astype(np.float32)
    scale = np.where(amax > 0, np.float32(127.0) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    codes = np.clip(np.rint(rows * scale[:, None]), -127, 127).astype(np.int8)
    scale_inv = (amax / np.float32(127.0)).astype(np.float32)
    return (codes.T, scale_inv[None, :]) if transposed else (codes, scale_inv[:, None])


def fp8_reference_blocks(w: np.ndarray):
    scales, codes = fp8_reference.quantize(w, "e4m3", "128x128", False, None)
    grid = (-(-w.shape[0] // 128), -(-w.shape[1] // 128))
    return codes, np.array(scales, dtype=np.float32).reshape(grid)


def dequantise(codes: np.ndarray, scale_inv: np.ndarray, fmt: str) -> np.ndarray:
    """code x scale_inv of its block: 128 x 128, or int8's one row (or column) of the grid's."""
    values = codes.astype(np.float32) if fmt == "int8" else np.vectorize(
        lambda c: (-1.0 if c & 0x80 else 1.0) * E4M3[c & 0x7F])(codes).astype(np.float32)
    if fmt == "int8":
        br, bc = codes.shape[0] // scale_inv.shape[0], codes.shape[1] // scale_inv.shape[1]
    else:
        br = bc = 128
    full = np.repeat(np.repeat(scale_inv, br, axis=0), bc, axis=1)[:codes.shape[0], :codes.shape[1]]
    return (values * full).astype(np.float32)


def check_folder(cli, chk, work, corpus, model_name, cfg, fmt):
    label = f"{model_name} {fmt}"
    source, folder = work / f"{model_name}_f32", work / f"{model_name}_{fmt}"
    if not source.exists():
        save_hf(random_init(build_model(cfg), 77), source)
    cli.run("convert", "--input", source, "--output", folder, "--weights-dtype", fmt,
            expect_files=[folder / "model.safetensors"])
    config = json.loads((folder / "config.json").read_text())
    want_qc = ({"quant_method": "megaton_int8_row"} if fmt == "int8" else
               {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]})
    if config.get("quantization_config") != want_qc:
        chk.fail(f"{label} config", f"quantization_config {config.get('quantization_config')}, expected {want_qc}")
    f32 = read_safetensors(source / "model.safetensors")
    dtypes = {}
    stored = read_safetensors(folder / "model.safetensors", dtypes)
    dequantised, quantised = {}, 0
    for name, w in f32.items():
        if not quantised_name(name):
            want = torch.from_numpy(w).to(torch.bfloat16).float().numpy()
            if dtypes.get(name) != "BF16" or not np.array_equal(stored[name], want):
                chk.fail(f"{label} {name}", f"stored as {dtypes.get(name)}, expected its bf16 rounding")
            dequantised[name] = stored[name]
            continue
        quantised += 1
        want_dtype = "I8" if fmt == "int8" else "F8_E4M3"
        codes, scale_inv = stored[name], stored.get(name + "_scale_inv")
        ref_codes, ref_scales = int8_reference(w, conv1d(name)) if fmt == "int8" else fp8_reference_blocks(w)
        if dtypes.get(name) != want_dtype or scale_inv is None or dtypes.get(name + "_scale_inv") != "F32":
            chk.fail(f"{label} {name}", f"stored as {dtypes.get(name)} with scales "
                     f"{dtypes.get(name + '_scale_inv')}, expected {want_dtype} with F32 scales")
            continue
        if scale_inv.shape != ref_scales.shape or not np.array_equal(scale_inv, ref_scales):
            chk.fail(f"{label} {name} scale_inv", f"shape {scale_inv.shape} vs reference {ref_scales.shape}, "
                     f"or values differ (max |diff| "
                     f"{np.max(np.abs(scale_inv - ref_scales)) if scale_inv.shape == ref_scales.shape else '-'})")
        if not np.array_equal(codes.view(np.uint8), ref_codes.view(np.uint8)):
            chk.fail(f"{label} {name} codes", f"{np.count_nonzero(codes.view(np.uint8) != ref_codes.view(np.uint8))} "
                     f"of {codes.size} differ from the reference quantisation")
        dequantised[name] = dequantise(codes, scale_inv, fmt)
    want_count = 4 * 2 if model_name == "gpt2" else 7 * 2 + 1
    if quantised != want_count:
        chk.fail(f"{label} count", f"{quantised} quantised tensors, expected {want_count}")
    print(f"  {label}: {quantised} tensors quantised, codes and scales checked")

    # The loss and every gradient of the quantised folder against PyTorch on the dequantised weights.
    ref_dir = work / f"{model_name}_{fmt}_dequantised"
    ref_dir.mkdir(exist_ok=True)
    ref_config = dict(config)
    ref_config.pop("quantization_config")
    (ref_dir / "config.json").write_text(json.dumps(ref_config))
    write_safetensors(ref_dir / "model.safetensors", dequantised)
    model = load_hf(ref_dir)
    inputs, labels = TokenSamples(corpus.tokens, SEQ_LEN).batch(range(SAMPLES))
    loss = lm_loss(model(inputs), labels)
    loss.backward()
    ref_grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
    grads_file = work / f"{model_name}_{fmt}_grads.safetensors"
    result = cli.eval(folder, corpus.prefix, SEQ_LEN, SAMPLES, grads_file)
    print(f"  {label} eval: megaton loss={result['loss']!r}, torch loss={loss.item()!r}")
    chk.value(f"{label} eval loss", rel_diff(result["loss"], loss.item()), LOSS_TOL)
    got = read_safetensors(grads_file)
    # A tied head has no tensor of its own in either dump; PyTorch's names are HF's.
    chk.tensors(f"{label} grad", got, {n: g for n, g in ref_grads.items() if n in got or n in f32}, GRAD_TOL)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megaton", required=True)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    work = Path(args.workdir or f"py_{Path(sys.argv[0]).stem}").resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    torch.manual_seed(0)
    chk = Checker()
    try:
        cli = MegatonCli(args.megaton)
        corpus = preprocess_corpus(cli, work, "corpus", sample_corpus())
        for model_name, cfg in MODELS.items():
            for fmt in ("fp8-block", "int8"):
                check_folder(cli, chk, work, corpus, model_name, cfg, fmt)
    except MegatonError as e:
        chk.fail("megaton", str(e))
    chk.exit()


if __name__ == "__main__":
    main()
