"""Training throughput: Megaton vs plain eager PyTorch on the same GPT-2 shape.

  /usr/bin/python3 bench/torch_compare.py --megaton PATH [--model gpt2-124m] [--batch 4]
      [--seq-len 256] [--threads 2] [--steps 3] [--repeats 3] [--precision fp32|bf16]

PyTorch side: the torch_reference GPT-2 (fp32 weights, eager, plain softmax attention: torch 1.13 has
no F.scaled_dot_product_attention) with torch.set_num_threads(threads); with --precision bf16 the
forward and loss run under torch.autocast("cpu", dtype=torch.bfloat16) (matmuls in bf16 through
oneDNN, fp32 weights, grads and AdamW: PyTorch's mixed precision on CPUs), against
`megaton bench --precision bf16` (Megatron's --bf16). One training step is forward,
mean cross-entropy, backward and a torch.optim.AdamW step (no grad clipping); one warm-up step is
excluded, each repeat times --steps steps and takes their median, and the reported figure is the
median over repeats. Megaton side: `PATH bench --model M --batch B --seq-len T --threads N --json`,
run --repeats times, median tokens_per_s. Prints both and the ratio ours/theirs.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python"))
from end_to_end import last_json_with  # noqa: E402
from torch_reference import GPT2, GPT2Config, lm_loss, random_init, torch_adamw  # noqa: E402

MODELS = {
    "gpt-tiny": GPT2Config(vocab_size=257, n_positions=256, n_embd=192, n_layer=4, n_head=6),
    "gpt2-124m": GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12),
}


def torch_tokens_per_s(cfg: GPT2Config, batch: int, seq_len: int, steps: int, repeats: int,
                       bf16: bool) -> list[float]:
    """tokens/s of each repeat (median step time within the repeat), after one warm-up step."""
    model = random_init(GPT2(cfg), seed=0)
    opt = torch_adamw(model, lr=1e-4)
    rows = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), generator=torch.Generator().manual_seed(0))
    inputs, labels = rows[:, :-1], rows[:, 1:]

    def step() -> float:
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = lm_loss(model(inputs), labels)
        loss.backward()
        opt.step()
        return time.perf_counter() - start

    print(f"torch warm-up step: {step():.2f} s", flush=True)
    results = []
    for r in range(repeats):
        times = [step() for _ in range(steps)]
        results.append(batch * seq_len / statistics.median(times))
        print(f"torch repeat {r + 1}: step times {', '.join(f'{t:.2f}' for t in times)} s "
              f"-> {results[-1]:.1f} tokens/s", flush=True)
    return results


def megaton_bench(binary: str, model: str, batch: int, seq_len: int, threads: int, precision: str) -> dict:
    cmd = [binary, "bench", "--model", model, "--batch", str(batch), "--seq-len", str(seq_len),
           "--threads", str(threads), "--precision", precision, "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` exited with {proc.returncode}:\n{proc.stderr[-2000:]}")
    result = last_json_with(proc.stdout, "tokens_per_s")
    if result is not None:
        return result
    raise RuntimeError(f"`{' '.join(cmd)}` printed no JSON line with tokens_per_s; stdout:\n{proc.stdout[-2000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megaton", required=True, help="path to the megaton binary")
    parser.add_argument("--model", default="gpt2-124m", choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="timed PyTorch steps per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    cpu = subprocess.run([args.megaton, "bench", "--cpu-info", "--threads", str(args.threads)],
                         capture_output=True, text=True, check=True).stdout.strip()
    print(cpu)
    print(f"{args.model}: batch {args.batch}, seq_len {args.seq_len}, threads {args.threads}; "
          f"PyTorch {torch.__version__} eager {'bf16 autocast' if args.precision == 'bf16' else 'fp32'}, "
          f"plain attention (no SDPA), AdamW, no grad clipping")
    theirs = statistics.median(torch_tokens_per_s(MODELS[args.model], args.batch, args.seq_len,
                                                  args.steps, args.repeats, args.precision == "bf16"))
    print(f"PyTorch : {theirs:.1f} tokens/s (median of {args.repeats} repeats)", flush=True)

    try:
        runs = [megaton_bench(args.megaton, args.model, args.batch, args.seq_len, args.threads, args.precision)
                for _ in range(args.repeats)]
    except RuntimeError as e:
        print(f"megaton bench failed: {e}")
        return 1
    for r, run in enumerate(runs, 1):
        print(f"megaton repeat {r}: {json.dumps(run)}")
    ours = statistics.median(run["tokens_per_s"] for run in runs)
    print(f"Megaton : {ours:.1f} tokens/s (median of {args.repeats} runs; "
          f"achieved {statistics.median(run['achieved_gflops'] for run in runs):.1f} GFLOP/s, "
          f"sgemm {statistics.median(run['sgemm_gflops'] for run in runs):.1f} GFLOP/s)")
    print(f"ratio ours/theirs: {ours / theirs:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
