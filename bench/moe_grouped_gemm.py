#!/usr/bin/python3
"""The routed experts as one grouped GEMM vs a loop over experts (issue 12): training tokens/s of the
scaled deepseek-v3-tiny of expert_parallel.py in one process, model.moe_grouped_gemm = true (the
experts' GEMMs side by side, one thread each, when there are at least as many active experts as
threads) against false (one expert after the other, each GEMM on all threads), at each thread count
and batch size given. Runs alternate between the two so drift on a shared machine hits both alike.

  /usr/bin/python3 bench/moe_grouped_gemm.py --megaton build/megaton [--threads 1,2] [--batches 2,8]
      [--seq-len 128] [--steps 8] [--repeats 3]

From metrics.jsonl, the median tokens/s over steps 2.., then the median over --repeats runs.
Prints the CPU line first.
"""
import argparse
import os
import statistics
import tempfile
from pathlib import Path

from expert_parallel import MODEL, medians
from mpi_runs import run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--megaton", required=True)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batches", default="2,8")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    binary = str(Path(args.megaton).resolve())
    print(run([binary, "bench", "--cpu-info"], dict(os.environ)).strip())
    print(f"deepseek-v3-tiny scaled ({' '.join(MODEL[1:])}), T={args.seq_len}; tokens/s medians over steps "
          f"2..{args.steps}, then over {args.repeats} runs")
    print(f"{'threads':>7} {'B':>3} {'grouped tok/s':>14} {'loop tok/s':>11} {'grouped/loop':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        for threads in (int(t) for t in args.threads.split(",")):
            env = dict(os.environ, OMP_NUM_THREADS=str(threads))
            for batch in (int(b) for b in args.batches.split(",")):
                tokens = {"true": [], "false": []}
                for r in range(args.repeats):
                    for grouped in tokens:
                        run_dir = Path(tmp) / f"t{threads}_b{batch}_{grouped}_{r}"
                        cmd = [binary, "train"]
                        for s in [*MODEL, f"training.micro_batch_size={batch}", f"training.global_batch_size={batch}",
                                  f"training.seq_length={args.seq_len}", f"training.train_iters={args.steps}",
                                  f"training.threads={threads}", "logging.eval_interval=0", "sample.tokens=0",
                                  "logging.save_interval=0", "optimizer.lr_warmup_iters=0",
                                  f"model.moe_grouped_gemm={grouped}", f'logging.run_dir="{run_dir}"']:
                            cmd += ["--set", s]
                        run(cmd, env)
                        tokens[grouped].append(medians(run_dir)[2])
                g, l = statistics.median(tokens["true"]), statistics.median(tokens["false"])
                print(f"{threads:7} {batch:3} {g:14.0f} {l:11.0f} {g / l:13.2f}", flush=True)


if __name__ == "__main__":
    main()
