#!/usr/bin/python3
"""Batch-1 greedy decode speed against the memory-bandwidth limit (issue 15), side by side.

For random Llama weights of the stories110M and stories15M shapes (fp32, tied embeddings, as the
llama2.c checkpoints) and of llama3-1b (16 layers, 2048 wide, GQA 32 / 8 heads, 128256-token vocabulary,
tied; RoPE base 10000 as run.c hard-codes), this writes an HF folder (config.json + model.safetensors)
and the same weights as a llama2.c checkpoint, then times greedy decoding from a lone BOS (id 1) with:
  - megaton (this build: GEMV + decode attention for one token per step), fp32 and bf16 weights,
    and 8-bit weights (--weights-dtype int8 / fp8-block, fp32 activations),
  - optionally a megaton built before them (--before: every step on the GEMM path),
  - optionally llama2.c's run.c (--llama2c-run, built by you in /tmp; never part of this repo). Its
    tokenizer.bin has 32000 pieces; for another vocabulary the script writes one whose piece for id i is
    " i". Only the 32000-id shapes compare the two tools' text (--sp-model): with another vocabulary
    megaton's greedy choice is limited to the ids its tokenizer can decode, run.c's is not,
and measures a streaming-read memory bandwidth in the same run (a small C program, 2 threads, the best
of three read patterns).

Decode rate = (256 - 16) / (median wall time of a 256-step run - that of a 16-step run), the same
for every tool, so start-up and prefill cancel. Fraction of the limit = weight bytes read per token
x rate / bandwidth. Megaton's own decode_tokens_per_s (generate --json) and load_s are printed too.

  /usr/bin/python3 bench/decode.py --megaton build-dev/megaton [--before OLD/megaton] [--baseline MAIN/megaton]
      [--weights fp32,bf16,int8,fp8-block]
      [--llama2c-run /tmp/llama2.c/run --llama2c-tokenizer /tmp/llama2.c/tokenizer.bin]
      [--sp-model /tmp/llama2.c/tokenizer.model] [--shapes 110m,15m,llama3-1b] [--threads 2] [--repeats 3]
      [--long 256]

Needs numpy (Debian's /usr/bin/python3) and a C compiler with OpenMP. Measure only on a quiet
machine (`uptime` load well below the core count).
"""
import argparse
import json
import os
import signal
import struct
import subprocess
import statistics
import sys
import tempfile
import time

import numpy as np

SHAPES = {  # dim, layers, heads, vocab, hidden, kv heads
    "110m": (768, 12, 12, 32000, 2048, 12),
    "15m": (288, 6, 6, 32000, 768, 6),
    "llama3-1b": (2048, 16, 32, 128256, 8192, 8),  # GQA; run.c gets a tokenizer of id pieces
}
SEQ_LEN = 512  # positions: room for the 256-step runs
SHORT, LONG = 16, 256

STREAM_READ_C = r"""
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
// Reads a 1 GiB float array (far past the caches) with every OpenMP thread, three ways, and prints
// GB/s per pass for each: one stream per thread; two streams (rows of 8 KiB side by side, as decode's
// GEMV reads two weight rows at a time); and those two with software prefetch 8 KiB ahead into L2 (as
// the GEMV prefetches 8-bit rows). Each stream keeps four vector sums, so that the adds never limit
// the reads (a plain `s += a[i]` loop, vectorised with one sum, read ~20% less). The best of the three
// is the limit: a decode must not be credited with more than 100% of it by reading its weights in
// a way the limit's loop does not.
typedef float v16 __attribute__((vector_size(64)));
static inline v16 ld(const float* p) {
  v16 v;
  memcpy(&v, p, sizeof v);
  return v;
}
enum { ROW = 2048 };
static float rows_sum(const float* a, size_t lo, size_t hi, int streams, int prefetch) {
  v16 s[2][4];
  memset(s, 0, sizeof s);
  for (size_t r = lo; r + streams * ROW <= hi; r += streams * ROW)
    for (size_t i = 0; i < ROW; i += 64)
      for (int k = 0; k < streams; ++k) {
        const float* p = a + r + k * ROW + i;
        if (prefetch)
          for (int c = 0; c < 4; ++c) __builtin_prefetch(p + 2048 + 16 * c, 0, 2);
        for (int c = 0; c < 4; ++c) s[k][c] += ld(p + 16 * c);
      }
  const v16 t = s[0][0] + s[0][1] + s[0][2] + s[0][3] + s[1][0] + s[1][1] + s[1][2] + s[1][3];
  float x = 0;
  for (int j = 0; j < 16; ++j) x += t[j];
  return x;
}
int main(void) {
  const size_t n = (size_t)1 << 28;
  float* a = malloc(n * sizeof(float));
  if (!a) return 1;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) a[i] = (float)(i & 7);
  for (int pass = 0; pass < 7; ++pass) {
    for (int mode = 0; mode < 3; ++mode) {
      const int streams = mode == 0 ? 1 : 2, prefetch = mode == 2;
      double t = omp_get_wtime();
      float s = 0;
      size_t bytes = 0;
#pragma omp parallel reduction(+ : s, bytes)
      {
        const size_t step = streams * ROW, per = n / omp_get_num_threads() / step * step;
        const size_t lo = per * omp_get_thread_num();
        s += rows_sum(a, lo, lo + per, streams, prefetch);
        bytes += per * sizeof(float);
      }
      t = omp_get_wtime() - t;
      printf("%d %f %f\n", mode, bytes / t / 1e9, s);
    }
  }
  return 0;
}
"""


def random_weights(dim, layers, heads, vocab, hidden, kv_heads, seed):
    """HF Llama tensors (name -> fp32 array), normal(0, 0.02) matrices, unit norms."""
    rng = np.random.default_rng(seed)
    mat = lambda rows, cols: rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(0.02)
    t = {"model.embed_tokens.weight": mat(vocab, dim), "model.norm.weight": np.ones(dim, np.float32)}
    kv = kv_heads * (dim // heads)
    for l in range(layers):
        p = f"model.layers.{l}."
        for name, rows in (("q_proj", dim), ("k_proj", kv), ("v_proj", kv), ("o_proj", dim)):
            t[p + f"self_attn.{name}.weight"] = mat(rows, dim)
        t[p + "mlp.gate_proj.weight"] = mat(hidden, dim)
        t[p + "mlp.up_proj.weight"] = mat(hidden, dim)
        t[p + "mlp.down_proj.weight"] = mat(dim, hidden)
        t[p + "input_layernorm.weight"] = np.ones(dim, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(dim, np.float32)
    return t


def write_hf(folder, tensors, dim, layers, heads, vocab, hidden, kv_heads):
    os.makedirs(folder, exist_ok=True)
    config = {"model_type": "llama", "vocab_size": vocab, "hidden_size": dim, "intermediate_size": hidden,
              "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "max_position_embeddings": SEQ_LEN, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": True}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for a in tensors.values():
            f.write(a.tobytes())


def interleaved_rope_rows(w, heads):
    """HF q/k rows rotate each head's halves (i, i + D/2); llama2.c rotates adjacent pairs (2i, 2i+1):
    row (h, half, i) of the HF matrix is row (h, i, half) of llama2.c's."""
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def write_llama2c(path, t, dim, layers, heads, vocab, hidden, kv_heads):
    """llama2.c's checkpoint: 7 int32 (dim, hidden, layers, heads, kv heads, vocab > 0 = shared
    classifier, seq_len), then fp32 arrays grouped by kind over all layers."""
    layer = lambda l, name: t[f"model.layers.{l}.{name}"]
    with open(path, "wb") as f:
        f.write(struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab, SEQ_LEN))
        f.write(t["model.embed_tokens.weight"].tobytes())
        groups = [("input_layernorm.weight", None), ("self_attn.q_proj.weight", heads),
                  ("self_attn.k_proj.weight", kv_heads), ("self_attn.v_proj.weight", None),
                  ("self_attn.o_proj.weight", None), ("post_attention_layernorm.weight", None),
                  ("mlp.gate_proj.weight", None), ("mlp.down_proj.weight", None), ("mlp.up_proj.weight", None)]
        for name, rope_heads in groups:
            for l in range(layers):
                w = layer(l, name)
                f.write((interleaved_rope_rows(w, rope_heads) if rope_heads else w).tobytes())
        f.write(t["model.norm.weight"].tobytes())
        f.write(np.zeros(SEQ_LEN * (dim // heads), np.float32).tobytes())  # the unused rope tables


def write_id_tokenizer(path, vocab):
    """A llama2.c tokenizer.bin (max piece length, then per id: float score, int length, bytes) whose
    piece for id i is " i", so that run.c prints the ids it generates."""
    pieces = [f" {i}".encode() for i in range(vocab)]
    with open(path, "wb") as f:
        f.write(struct.pack("<i", max(map(len, pieces))))
        for piece in pieces:
            f.write(struct.pack("<fi", 0.0, len(piece)) + piece)


def weight_bytes_per_token(t, kind="fp32"):
    """Every matrix a decode step multiplies: the layers' and the (tied) classifier, as stored for
    `kind`: fp32, bf16, int8 (a byte per weight + an fp32 scale per row) or fp8-block (a byte per
    weight + an fp32 scale per 128 x 128 block)."""
    def stored(rows, cols):
        if kind == "int8":
            return rows * cols + 4 * rows
        if kind == "fp8-block":
            return rows * cols + 4 * -(-rows // 128) * -(-cols // 128)
        return rows * cols * (2 if kind == "bf16" else 4)
    return sum(stored(*a.shape) for a in t.values() if a.ndim == 2)


def stream_read_gbps(work, threads):
    """The best of the three read patterns' medians, and each of them."""
    src, exe = os.path.join(work, "stream_read.c"), os.path.join(work, "stream_read")
    with open(src, "w") as f:
        f.write(STREAM_READ_C)
    subprocess.run(["cc", "-O3", "-ffast-math", "-march=native", "-fopenmp", src, "-o", exe], check=True)
    out = subprocess.run([exe], check=True, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": str(threads)}).stdout
    by_mode = {}
    for line in out.split("\n"):
        if line:
            mode, gbps, _ = line.split()
            by_mode.setdefault(int(mode), []).append(float(gbps))
    medians = [statistics.median(by_mode[m]) for m in sorted(by_mode)]
    return max(medians), medians


def timed(cmd, env):
    start = time.perf_counter()
    # Random weights decode to arbitrary bytes under the byte tokenizer.
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env)
    seconds = time.perf_counter() - start
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return seconds, r.stdout


def measure(name, command_for, repeats, env):
    """Median wall times of SHORT- and LONG-step runs, interleaved; returns the rate and last outputs."""
    times, outputs = {SHORT: [], LONG: []}, {}
    for _ in range(repeats):
        for steps in (SHORT, LONG):
            seconds, outputs[steps] = timed(command_for(steps), env)
            times[steps].append(seconds)
    t_short, t_long = statistics.median(times[SHORT]), statistics.median(times[LONG])
    rate = (LONG - SHORT) / (t_long - t_short)
    print(f"  {name}: {SHORT} steps {t_short:.3f} s, {LONG} steps {t_long:.3f} s -> decode {rate:.1f} tok/s")
    return rate, outputs


def megaton_command(binary, folder, tokenizer, threads, before=False, precision="fp32", weights="auto"):
    # run.c -n N runs N forwards from the BOS and prints N tokens; megaton's prefill of the BOS yields the
    # first new token, so --max-new-tokens N is the same N forwards and N tokens. A binary from
    # before the decode kernels has neither --prompt-ids nor --json: a one-character text prompt and
    # plain output instead (the rate is a difference of wall times, which does not need them).
    prompt = ["--prompt", "O"] if before else ["--prompt-ids", "1", "--json", "--precision", precision,
                                               "--weights-dtype", weights, "--ignore-eos"]
    return lambda steps: [binary, "generate", "--model", folder, "--temperature", "0", "--max-new-tokens",
                          str(steps), "--threads", str(threads), "--tokenizer", tokenizer] + prompt


def main():
    global LONG
    # A stopped run (SIGTERM) still removes its ~1 GB of weight files: exit through Python's cleanup.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megaton", required=True)
    ap.add_argument("--before", help="a megaton binary built without the decode kernels")
    ap.add_argument("--baseline", help="another megaton build with this one's options (main before a change): "
                    "the same rows, measured the same way in the same run")
    ap.add_argument("--weights", default="fp32,bf16,int8,fp8-block", help="which megaton rows to measure")
    ap.add_argument("--llama2c-run")
    ap.add_argument("--llama2c-tokenizer")
    ap.add_argument("--sp-model", help="llama2.c's tokenizer.model, so megaton prints text too")
    ap.add_argument("--shapes", default="110m,15m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--long", type=int, default=256, help="steps of the long run (fewer for a slow shape)")
    args = ap.parse_args()
    if not SHORT < args.long <= SEQ_LEN - 1:
        sys.exit(f"--long must be in ({SHORT}, {SEQ_LEN - 1}]")
    LONG = args.long
    if bool(args.llama2c_run) != bool(args.llama2c_tokenizer):
        sys.exit("--llama2c-run and --llama2c-tokenizer go together")
    if args.threads < 1 or args.repeats < 1:
        sys.exit("--threads and --repeats must be at least 1")
    weights = args.weights.split(",")
    for w in weights:
        if w not in ("fp32", "bf16", "int8", "fp8-block"):
            sys.exit(f"unknown --weights row '{w}' (fp32, bf16, int8, fp8-block)")
    if args.sp_model and "fp32" not in weights:
        sys.exit("--sp-model compares megaton's fp32 text with run.c's: keep fp32 in --weights")
    shapes = args.shapes.split(",")
    for s in shapes:
        if s not in SHAPES:
            sys.exit(f"unknown shape '{s}' (known: {', '.join(SHAPES)})")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    tokenizer = f"sentencepiece:{args.sp_model}" if args.sp_model else "byte"
    print("load average:", open("/proc/loadavg").read().split()[:3])
    cpu = [l for l in open("/proc/cpuinfo") if l.startswith("model name")]
    flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
    print("cpu:", cpu[0].split(":")[1].strip() if cpu else "?", "| avx2" if "avx2" in flags else "",
          "| avx512f" if "avx512f" in flags else "", f"| {args.threads} threads")
    with tempfile.TemporaryDirectory() as work:
        bandwidth, patterns = stream_read_gbps(work, args.threads)
        print(f"streaming read: {bandwidth:.2f} GB/s (best of 3 patterns' medians of 7 passes over 1 GiB: plain "
              f"{patterns[0]:.2f}, two streams {patterns[1]:.2f}, two prefetched streams {patterns[2]:.2f})")
        for shape in shapes:
            dims = SHAPES[shape]
            tensors = random_weights(*dims, seed=15)
            folder, ckpt = os.path.join(work, shape), os.path.join(work, shape + ".bin")
            write_hf(folder, tensors, *dims)
            bytes_per_token = weight_bytes_per_token(tensors)
            limit = bandwidth * 1e9 / bytes_per_token
            print(f"{shape}: {bytes_per_token / 1e6:.1f} MB of fp32 weights per token, bandwidth limit "
                  f"{limit:.1f} tok/s (bf16: twice that)")
            row = {}
            builds = [("megaton", args.megaton)] + ([("baseline", args.baseline)] if args.baseline else [])
            for kind in weights:
                for label, binary in builds:
                    name = label if kind == "fp32" else f"{label} {kind}"
                    options = {"precision": "bf16"} if kind == "bf16" else {"weights": kind} if kind != "fp32" else {}
                    rate, out = measure(name, megaton_command(binary, folder, tokenizer, args.threads, **options),
                                        args.repeats, env)
                    jm = json.loads(out[LONG])
                    print(f"    {name} --json: decode_tokens_per_s {jm['decode_tokens_per_s']:.1f}, "
                          f"load_s {jm['load_s']:.3f}")
                    if label == "megaton" and kind == "fp32":
                        j = jm
                    row[name] = {"rate": rate, "limit": bandwidth * 1e9 / weight_bytes_per_token(tensors, kind),
                                 "json_rate": jm["decode_tokens_per_s"]}
            if args.before:
                rate, _ = measure("megaton before (GEMM path)",
                                  megaton_command(args.before, folder, tokenizer, args.threads, before=True), args.repeats, env)
                row["before"] = {"rate": rate, "limit": limit}
            if args.llama2c_run:
                write_llama2c(ckpt, tensors, *dims)
                own_vocab = dims[3] == 32000  # run.c's tokenizer.bin has 32000 pieces
                pieces = args.llama2c_tokenizer if own_vocab else os.path.join(work, shape + ".tokenizer.bin")
                if not own_vocab:
                    write_id_tokenizer(pieces, dims[3])
                rate, out_c = measure("llama2.c run.c", lambda steps: [args.llama2c_run, ckpt, "-t", "0", "-n",
                                                                       str(steps), "-z", pieces],
                                      args.repeats, env)
                row["llama2c"] = {"rate": rate, "limit": limit}
                if not own_vocab and len(out_c[LONG].split()) < LONG:  # one piece per generated id
                    sys.exit(f"run.c stopped after {len(out_c[LONG].split())} of {LONG} tokens (it ends on "
                             f"id 1): its rate would not be a {LONG}-step rate")
                if own_vocab and args.sp_model:
                    same = "".join(out_c[LONG].split()) == "".join(j["text"].split())
                    print(f"    same text as run.c (whitespace aside): {same}")
            for tool, r in row.items():
                # A slow outlier among the short runs (start-up varies more than decoding) can skew the
                # difference of medians; megaton's own decode timing is the check.
                off = abs(r["rate"] / r["json_rate"] - 1) if r.get("json_rate") else 0
                note = f" (UNSTEADY: --json says {r['json_rate']:.1f}; rerun or read --json)" if off > 0.15 else ""
                print(f"    {tool}: {r['rate']:.1f} tok/s = {r['rate'] / r['limit']:.0%} of its bandwidth limit{note}")


if __name__ == "__main__":
    main()
