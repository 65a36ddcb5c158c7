"""End-to-end harness of test_gpt_torch.py and test_llama_torch.py: runs the `megaton` CLI (preprocess,
eval --dump-grads, train) and compares what it reports and writes with the PyTorch reference of
torch_reference.py, the training data sampled as data_reference.py restates Megatron.

Per case: the starting model is a seeded random init saved as an HF folder or, for interleaved RoPE (which
an HF config cannot ask for), the model megaton builds from a preset and exports before training. Then
`megaton eval` (loss and every parameter gradient, HF folders only) and one `megaton train` run per
micro-batch size: the per-step loss, grad_norm and lr of metrics.jsonl and the exported weights must match
the reference trained as one full batch per step on the same samples at the same lr. Every comparison
fails on NaN or Inf.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from data_reference import megatron_train_samples, read_dataset
from torch_reference import (LlamaConfig, RowSamples, TokenSamples, TrainSettings, aux_loss, build_model, lm_loss,
                             load_hf, random_init, read_safetensors, rel_err, save_hf, train_reference)

# Tolerances from the test specification; LR_TOL is relative to the peak lr (both sides compute in double).
LOSS_TOL, GRAD_TOL = 1e-5, 1e-4
TRAIN_LOSS_TOL, GRAD_NORM_TOL, WEIGHT_TOL = 1e-4, 1e-3, 1e-4
LR_TOL = 1e-12
# BF16 cases (Megaton's [precision] bf16 against PyTorch's bf16 autocast): the two round different
# tensors to bf16 (Megaton keeps the residual stream and attention inputs in bf16, autocast the
# GEMM outputs only), so they agree to bf16's 8-bit mantissa, not to fp32: losses were seen within
# 1e-4, grad norms within 3e-2. The final weights get a loose bound: the attention's k bias has a
# true gradient of zero (softmax ignores a shift shared by every key), so AdamW turns each side's
# rounding noise into full-size steps there (8e-2 seen); other tensors agree within 2e-2.
BF16_TRAIN_LOSS_TOL, BF16_GRAD_NORM_TOL, BF16_WEIGHT_TOL = 1e-3, 5e-2, 1.5e-1

# The sampled data modes: data.split ratios, the blend "0.6 A 0.4 B", and training.seed, Megatron's
# shuffling seed (it also seeds the init of a model megaton builds itself).
SPLIT = "90,10,0"
BLEND_WEIGHTS = (0.6, 0.4)
DATA_SEED = 1234


# ----------------------------------------------------------------------------------------------
# Running megaton
# ----------------------------------------------------------------------------------------------

def last_json_with(text: str, key: str) -> dict | None:
    """The last line of `text` that parses as a JSON object holding `key` (CLI output mixes logs)."""
    for line in reversed(text.strip().splitlines()):
        try:
            result = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(result, dict) and key in result:
            return result
    return None


class MegatonError(RuntimeError):
    pass


class MegatonCli:
    """Runs `megaton <subcommand> ...`, turning every failure into a message naming the subcommand."""

    def __init__(self, binary):
        # Resolved: a bare relative name such as ./megaton would otherwise be looked up on PATH.
        self.binary = Path(binary).resolve()
        if not self.binary.is_file():
            raise MegatonError(f"megaton binary not found at {self.binary}")

    def run(self, subcommand: str, *args, expect_files=()) -> str:
        cmd = [str(self.binary), subcommand, *map(str, args)]
        print("$ " + " ".join(cmd), flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise MegatonError(f"`megaton {subcommand}` exited with code {proc.returncode} "
                               f"(subcommand missing or failing)\nstdout:\n{proc.stdout[-2000:]}\n"
                               f"stderr:\n{proc.stderr[-2000:]}")
        missing = [str(f) for f in expect_files if not Path(f).exists()]
        if missing:
            raise MegatonError(f"`megaton {subcommand}` exited 0 but did not create {missing} "
                               f"(subcommand '{subcommand}' not implemented?)\nstdout:\n{proc.stdout[-2000:]}")
        return proc.stdout

    def preprocess(self, text_file, prefix) -> None:
        self.run("preprocess", "--input", text_file, "--output-prefix", prefix, "--tokenizer", "byte",
                 "--append-eod", expect_files=[f"{prefix}.bin", f"{prefix}.idx"])

    def eval(self, model_dir, prefix, seq_len, max_samples, grads_file) -> dict:
        out = self.run("eval", "--model", model_dir, "--data", prefix, "--seq-len", seq_len,
                       "--max-samples", max_samples, "--dump-grads", grads_file, expect_files=[grads_file])
        result = last_json_with(out, "loss")
        if result is not None:
            return result
        raise MegatonError(f"`megaton eval` printed no JSON line with a \"loss\"; stdout:\n{out[-2000:]}")

    def train(self, config_file, run_dir) -> list[dict]:
        metrics = Path(run_dir) / "metrics.jsonl"
        final = Path(run_dir) / "final"
        self.run("train", "--config", config_file,
                 expect_files=[metrics, final / "config.json", final / "model.safetensors"])
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        return [r for r in rows if {"step", "loss", "grad_norm"} <= r.keys()]


# ----------------------------------------------------------------------------------------------
# Comparisons
# ----------------------------------------------------------------------------------------------

def rel_diff(got, want, scale=None) -> float:
    """|got - want| / |scale or want|; NaN (which fails every check) when a side is not a number, such as
    the null a JSON file holds for a NaN, or when the scale is zero."""
    try:
        return abs(float(got) - float(want)) / abs(float(scale if scale is not None else want))
    except (TypeError, ValueError, ZeroDivisionError):
        return math.nan


class Checker:
    """Collects named comparisons, prints one line each, and decides the exit status."""

    def __init__(self):
        self.failures = []

    def value(self, label: str, err: float, tol: float, detail: str = "") -> None:
        ok = err < tol  # False for NaN
        print(f"  [{'ok' if ok else 'FAIL'}] {label}: rel_err={err:.3e} (tol {tol:.0e}){' ' + detail if detail else ''}")
        if not ok:
            self.failures.append(f"{label}: rel_err={err:.3e} >= {tol:.0e} {detail}")

    def fail(self, label: str, message: str) -> None:
        print(f"  [FAIL] {label}: {message}")
        self.failures.append(f"{label}: {message.splitlines()[0] if message else ''}")

    def tensors(self, label: str, got: dict, want: dict, tol: float) -> None:
        """Compares two name -> array maps tensor by tensor (all names of `want` must be in `got`)."""
        for name in sorted(want):
            if name not in got:
                self.fail(f"{label} {name}", "missing")
            elif tuple(got[name].shape) != tuple(want[name].shape):
                self.fail(f"{label} {name}", f"shape {tuple(got[name].shape)}, expected {tuple(want[name].shape)}")
            else:
                self.value(f"{label} {name}", rel_err(got[name], want[name]), tol,
                           f"|ref|={np.linalg.norm(np.asarray(want[name], dtype=np.float64)):.3e}")
        extra = sorted(set(got) - set(want))
        if extra:
            self.fail(f"{label}", f"unexpected tensors {extra}")

    def step(self, label: str, got: dict, ref: dict, peak_lr: float, bf16: bool = False) -> None:
        """One metrics.jsonl row against the reference's step: loss, grad_norm and the lr it ran at."""
        loss_tol, norm_tol = (BF16_TRAIN_LOSS_TOL, BF16_GRAD_NORM_TOL) if bf16 else (TRAIN_LOSS_TOL, GRAD_NORM_TOL)
        self.value(f"{label} loss", rel_diff(got.get("loss"), ref["loss"]), loss_tol)
        self.value(f"{label} grad_norm", rel_diff(got.get("grad_norm"), ref["grad_norm"]), norm_tol)
        self.value(f"{label} lr", rel_diff(got.get("lr"), ref["lr"], scale=peak_lr), LR_TOL,
                   f"megaton {got.get('lr')!r}, reference {ref['lr']!r}")

    def exit(self) -> None:
        if self.failures:
            print(f"\n{len(self.failures)} check(s) FAILED:")
            for f in self.failures:
                print("  - " + f)
            sys.exit(1)
        print("\nall checks passed")
        sys.exit(0)


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------

def sample_corpus(n_lines: int = 60, shift: int = 0) -> list[str]:
    """Documents of a few dozen varied bytes each (ASCII, digits, multi-byte UTF-8); `shift` picks other
    words and lengths, so two corpora differ."""
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dogs", "naïve", "café",
             "Σ", "→", "tensor", "gradient", "Megaton", "{json}", "x^2", "œuvre", "日本", "\t"]
    documents = []
    for i in range(n_lines):
        picked = [words[(i * 7 + j * 3 + shift) % len(words)] for j in range(6 + (i + shift) % 5)]
        documents.append(f"{i}: " + " ".join(picked) + f" = {i * i % 97}.\n")
    return documents


@dataclass
class Corpus:
    """A preprocessed corpus: its prefix, its sequences (Megatron's documents) and their tokens in order."""
    prefix: Path
    sequences: list
    tokens: np.ndarray


def preprocess_corpus(cli: MegatronCli, work: Path, name: str, documents: list[str]) -> Corpus:
    """Writes the documents as JSON Lines (plain text would be one document) and preprocesses them."""
    jsonl = work / f"{name}.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents), encoding="utf-8")
    prefix = work / name
    cli.preprocess(jsonl, prefix)
    _, documents = read_dataset(str(prefix))
    sequences = [s.astype(np.int64) for doc in documents for s in doc]
    return Corpus(prefix, sequences, np.concatenate(sequences))


# data.shuffle = false over corpus A; Megatron's GPTDataset over A; the blend "0.6 A 0.4 B".
DATA_MODES = ("stream", "shuffled", "blend")


def data_toml(mode: str, a: Corpus, b: Corpus, cache_dir: Path) -> str:
    if mode == "stream":
        return f'data_path = "{a.prefix}"\nshuffle = false\n'
    path = a.prefix if mode == "shuffled" else f"{BLEND_WEIGHTS[0]} {a.prefix} {BLEND_WEIGHTS[1]} {b.prefix}"
    return f'data_path = "{path}"\nshuffle = true\nsplit = "{SPLIT}"\ndata_cache_path = "{cache_dir}"\n'


def reference_samples(mode: str, a: Corpus, b: Corpus, seq_len: int, num_samples: int):
    """The samples megaton's training reads in `mode`, sample i for global sample i."""
    if mode == "stream":
        return TokenSamples(a.tokens, seq_len)
    if mode == "shuffled":
        return RowSamples(megatron_train_samples([a.sequences], None, SPLIT, num_samples, seq_len, DATA_SEED))
    return RowSamples(megatron_train_samples([a.sequences, b.sequences], BLEND_WEIGHTS, SPLIT, num_samples,
                                             seq_len, DATA_SEED))


# ----------------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------------

@dataclass
class Case:
    """One end-to-end comparison: a model config, eval / train sizes, micro-batch variants, data mode."""
    name: str
    config: object
    seed: int = 0  # of the reference's random init (unused when megaton initializes the model)
    seq_len: int = 32
    eval_samples: int = 4
    train: TrainSettings = field(default_factory=TrainSettings)
    micro_batches: tuple = (4,)  # one `megaton train` run per micro_batch_size
    data: str = "stream"  # one of DATA_MODES
    bf16: bool = False  # train in bf16 mixed precision on both sides (eval is then skipped)

    def __post_init__(self):
        if self.data not in DATA_MODES:
            raise ValueError(f"{self.name}: data mode {self.data!r} is not one of {DATA_MODES}")

    @property
    def rope_layout(self) -> str:
        return getattr(self.config, "rope_layout", "half")

    @property
    def megaton_init(self) -> bool:
        """An HF config cannot ask for interleaved RoPE: megaton then builds the model from a preset with
        model.rope_layout, and both sides start from the weights it exports before training."""
        return self.rope_layout != "half"


def model_toml(case: Case, model_dir: Path | None) -> str:
    if not case.megaton_init:
        return f'load = "{model_dir}"\n'
    c = case.config
    if not isinstance(c, LlamaConfig) or c.rope_scaling is not None:
        raise ValueError(f"{case.name}: megaton builds only Llamas without rope_scaling here")
    return f"""preset = "llama-tiny"
num_layers = {c.num_hidden_layers}
hidden_size = {c.hidden_size}
num_attention_heads = {c.num_attention_heads}
num_query_groups = {c.num_key_value_heads}
kv_channels = {c.dim}
ffn_hidden_size = {c.intermediate_size}
vocab_size = {c.vocab_size}
max_position_embeddings = {c.max_position_embeddings}
rope_layout = "{c.rope_layout}"
rotary_base = {c.rope_theta!r}
norm_epsilon = {c.rms_norm_eps!r}
tie_embeddings = {str(c.tie_word_embeddings).lower()}
"""


def train_toml(case: Case, t: TrainSettings, model: str, data: str, run_dir: Path, micro_batch: int) -> str:
    return f"""[model]
{model}[data]
{data}[precision]
bf16 = {str(case.bf16).lower()}
[training]
micro_batch_size = {micro_batch}
global_batch_size = {t.batch}
seq_length = {case.seq_len}
train_iters = {t.steps}
seed = {DATA_SEED}
[optimizer]
lr = {t.lr!r}
min_lr = {t.min_lr!r}
lr_warmup_iters = {t.warmup}
lr_decay_iters = {t.decay_iters}
lr_decay_style = "{t.decay_style}"
weight_decay = {t.weight_decay!r}
adam_beta1 = {t.betas[0]!r}
adam_beta2 = {t.betas[1]!r}
adam_eps = {t.eps!r}
clip_grad = {t.clip!r}
[logging]
run_dir = "{run_dir}"
log_interval = 1
eval_interval = 0
eval_iters = 1
save_interval = 0
peak_tflops = 1.0
"""


def _initial_model(cli, chk, case, data, work) -> Path:
    """The HF folder both sides start from (see Case.megaton_init)."""
    if not case.megaton_init:
        model_dir = work / f"{case.name}_init"
        save_hf(random_init(build_model(case.config), case.seed), model_dir)
        return model_dir
    run_dir = work / f"{case.name}_init_run"
    config_file = work / f"{case.name}_init.toml"
    no_steps = replace(case.train, steps=0, decay_style="constant")  # a decay needs train_iters > warmup
    config_file.write_text(train_toml(case, no_steps, model_toml(case, None), data, run_dir, case.micro_batches[0]))
    cli.train(config_file, run_dir)
    built = load_hf(run_dir / "final", case.rope_layout).config
    if built != case.config:
        chk.fail(f"{case.name} init", f"megaton built {built}, expected {case.config}")
    return run_dir / "final"


def _check_eval(cli, chk, case, model_dir, corpus, work):
    if case.bf16:
        print("  eval: skipped (megaton eval runs in f32; the f32 cases check it)")
        return
    if case.megaton_init:
        print("  eval: skipped (megaton eval loads HF folders, whose RoPE layout is always half)")
        return
    model = load_hf(model_dir)
    inputs, labels = TokenSamples(corpus.tokens, case.seq_len).batch(range(case.eval_samples))
    loss = lm_loss(model(inputs), labels)
    (loss + aux_loss(model, labels)).backward()  # megaton's gradient includes the balancing losses'; its loss does not
    # A parameter without a gradient (DeepSeek's selection-only expert bias) has a zero one in megaton's dump.
    ref_grads = {n: p.grad.numpy() if p.grad is not None else np.zeros(tuple(p.shape), dtype=np.float32)
                 for n, p in model.named_parameters()}
    grads_file = work / f"{case.name}_grads.safetensors"
    result = cli.eval(model_dir, corpus.prefix, case.seq_len, case.eval_samples, grads_file)
    print(f"  eval: megaton loss={result['loss']!r} tokens={result.get('tokens')}, torch loss={loss.item()!r}")
    chk.value(f"{case.name} eval loss", rel_diff(result["loss"], loss.item()), LOSS_TOL)
    want_tokens = case.eval_samples * case.seq_len
    if result.get("tokens") != want_tokens:
        chk.fail(f"{case.name} eval tokens", f"{result.get('tokens')!r}, expected {want_tokens}")
    chk.tensors(f"{case.name} grad", read_safetensors(grads_file), ref_grads, GRAD_TOL)


def _check_train(cli, chk, case, model_dir, data, samples, work):
    model = load_hf(model_dir, case.rope_layout)
    history = train_reference(model, samples, case.train, bf16=case.bf16)
    final = {n: p.detach().numpy() for n, p in model.named_parameters()}
    for mb in case.micro_batches:
        label = f"{case.name} train(mbs={mb},gbs={case.train.batch})"
        run_dir = work / f"{case.name}_run_mbs{mb}"
        config_file = work / f"{case.name}_mbs{mb}.toml"
        config_file.write_text(train_toml(case, case.train, model_toml(case, model_dir), data, run_dir, mb))
        try:
            rows = {r["step"]: r for r in cli.train(config_file, run_dir)}
        except MegatonError as e:
            chk.fail(label, str(e))
            continue
        for ref in history:
            got = rows.get(ref["step"])
            if got is None:
                chk.fail(f"{label} step {ref['step']}", "no metrics.jsonl line")
                continue
            print(f"  step {ref['step']}: megaton loss={got['loss']!r} grad_norm={got['grad_norm']!r} lr={got.get('lr')!r}; "
                  f"torch loss={ref['loss']!r} grad_norm={ref['grad_norm']!r} lr={ref['lr']!r}")
            chk.step(f"{label} step {ref['step']}", got, ref, case.train.lr, case.bf16)
        try:
            exported = {n: p.detach().numpy() for n, p in load_hf(run_dir / "final", case.rope_layout).named_parameters()}
        except (ValueError, KeyError, OSError) as e:
            chk.fail(f"{label} final model", f"cannot load {run_dir / 'final'}: {e}")
            continue
        chk.tensors(f"{label} final", exported, final, BF16_WEIGHT_TOL if case.bf16 else WEIGHT_TOL)


def _run_case(cli, chk, case, a, b, work):
    data = data_toml(case.data, a, b, work / "cache")
    samples = reference_samples(case.data, a, b, case.seq_len, case.train.steps * case.train.batch)
    model_dir = _initial_model(cli, chk, case, data, work)
    for stage, check in (("eval", lambda: _check_eval(cli, chk, case, model_dir, a, work)),
                         ("train", lambda: _check_train(cli, chk, case, model_dir, data, samples, work))):
        try:
            check()
        except MegatonError as e:
            chk.fail(f"{case.name} {stage}", str(e))
        except Exception:  # keep going so every case reports; the traceback says what broke
            chk.fail(f"{case.name} {stage}", traceback.format_exc())


def run_cases(cases: list[Case], argv=None) -> None:
    """Entry point of the end-to-end tests: preprocess the corpora once, then per case eval + train checks."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megaton", required=True, help="path to the megaton binary")
    parser.add_argument("--workdir", default=None, help="scratch folder (default: ./py_<script name>)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    work = Path(args.workdir or f"py_{Path(sys.argv[0]).stem}").resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    chk = Checker()
    try:
        cli = MegatonCli(args.megaton)
        a = preprocess_corpus(cli, work, "corpus", sample_corpus())
        b = preprocess_corpus(cli, work, "corpus_b", sample_corpus(40, shift=5))
    except MegatonError as e:
        chk.fail("setup", str(e))
        chk.exit()
    for c in (a, b):
        print(f"dataset {c.prefix.name}: {len(c.sequences)} documents, {len(c.tokens)} tokens, "
              f"ids in [{c.tokens.min()}, {c.tokens.max()}]")
    for case in cases:
        print(f"\n== {case.name} ({case.data} data, lr {case.train.decay_style} warmup {case.train.warmup}): "
              f"{case.config}")
        if max(a.tokens.max(), b.tokens.max()) >= case.config.vocab_size:
            chk.fail(case.name, f"token ids outside [0, {case.config.vocab_size})")
        elif len(TokenSamples(a.tokens, case.seq_len)) < case.eval_samples:
            chk.fail(case.name, f"only {len(TokenSamples(a.tokens, case.seq_len))} samples of length {case.seq_len}")
        else:
            _run_case(cli, chk, case, a, b, work)
    chk.exit()
