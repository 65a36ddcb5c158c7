"""Data- and tensor-parallel communication and memory: the fraction of step time each rank spends
blocked on communication (gradient reductions; with tensor parallelism also the collectives inside
forward and backward), with the bucket reductions overlapped with backward and without, with the
distributed optimizer, with tensor parallelism over the NP ranks with and without sequence
parallelism; and rank 0's peak memory by category in each run.

  python3 bench/dp_comm.py --megaton build/megaton [--model gpt2-124m] [--np 2] [--steps 5]
      [--batch 4] [--seq-len 256] [--threads 1] [--bucket-size 40000000] [--runs dp,tp]

Runs `mpirun -np NP megaton train` on the demo corpus (built on first use) with one data-parallel
micro-batch of B x T per rank per step, once with parallel.overlap_grad_reduce = true and once with
false, once with parallel.use_distributed_optimizer = true, plus the single-process run of the same
global batch; `--runs tp` instead (or as well) runs tp = NP and tp = NP with sequence_parallel on the
same global batch (micro-batches of B x T, all ranks one tensor-parallel group). From rank 0's
metrics.jsonl: the median over steps 2.. of step_time_s, of
comm_wait_s (timers around the waits for the bucket reductions, the tensor-parallel
collectives and the overlapped weight gathers) and of the wall time between step records (the
optimizer update and its blocking weight all-gather included), and the peak_memory_mb record of the
first step. The dp runs include the distributed optimizer with parallel.overlap_param_gather. Prints the CPU line first and one row per run.
"""
import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from mpi_runs import MPI_ENV, mpirun, run


def medians(run_dir: Path):
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "loss" in s and "step_time_s" in s][1:]  # the first step warms up
    if not steps:
        raise SystemExit(f"no step records in {run_dir}")
    step_time = statistics.median(s["step_time_s"] for s in steps)
    wait = statistics.median(s.get("comm_wait_s", 0.0) for s in steps)
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    # Wall time per step, the optimizer update (and a blocking weight all-gather) included: between
    # consecutive step records.
    wall = statistics.median(b["time"] - a["time"] for a, b in zip(steps, steps[1:])) if len(steps) > 1 else float("nan")
    return step_time, wait, wall, statistics.median(s["tokens_per_s"] for s in steps), first.get("peak_memory_mb", {})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--megaton", required=True)
    ap.add_argument("--model", default="gpt2-124m")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bucket-size", type=int, default=40_000_000)
    ap.add_argument("--runs", default="dp", help="comma-separated: dp (data parallel), tp (tensor parallel)")
    args = ap.parse_args()
    kinds = set(args.runs.split(","))
    if not kinds <= {"dp", "tp"}:
        raise SystemExit(f"--runs {args.runs}: expected dp, tp or dp,tp")
    binary = str(Path(args.megaton).resolve())
    env = dict(os.environ, **MPI_ENV, OMP_NUM_THREADS=str(args.threads))
    print(run([binary, "bench", "--cpu-info"], env).strip())
    common = ["--set", f"model.preset={args.model}", "--set", f"training.micro_batch_size={args.batch}",
              "--set", f"training.global_batch_size={args.batch * args.np}", "--set", f"training.seq_length={args.seq_len}",
              "--set", f"training.train_iters={args.steps}", "--set", f"training.threads={args.threads}",
              "--set", "logging.eval_iters=1", "--set", "sample.tokens=0", "--set", "optimizer.lr_warmup_iters=0", "--set", f"parallel.bucket_size={args.bucket_size}"]
    print(f"{args.model}, {args.np} ranks x B={args.batch} T={args.seq_len}, {args.threads} thread(s) per rank, "
          f"bucket_size {args.bucket_size}; medians over steps 2..{args.steps}")
    cats = ["params", "grads", "optimizer", "activations"]
    print(f"{'run':40} {'step s':>8} {'wait s':>8} {'wait %':>7} {'wall s':>8} {'tokens/s':>9}  peak MB: " + " ".join(cats))
    with tempfile.TemporaryDirectory() as tmp:
        runs = [("1 process, same global batch", [binary, "train"], [])]
        if "dp" in kinds:
            runs += [(f"dp{args.np} overlap_grad_reduce={o}", mpirun(args.np) + [binary, "train"],
                      ["--set", f"parallel.overlap_grad_reduce={o}"]) for o in ("true", "false")]
            runs.append((f"dp{args.np} distributed optimizer", mpirun(args.np) + [binary, "train"],
                         ["--set", "parallel.use_distributed_optimizer=true"]))
            runs.append((f"dp{args.np} dist. opt. + param gather overlap", mpirun(args.np) + [binary, "train"],
                         ["--set", "parallel.use_distributed_optimizer=true", "--set", "parallel.overlap_param_gather=true"]))
        if "tp" in kinds:
            runs += [(f"tp{args.np}{' + sequence parallel' if sp else ''}", mpirun(args.np) + [binary, "train"],
                      ["--set", f"tp={args.np}", "--set", f"parallel.sequence_parallel={'true' if sp else 'false'}"])
                     for sp in (False, True)]
        for name, prefix, extra in runs:
            run_dir = Path(tmp) / name.replace(" ", "_").replace(",", "").replace("+", "")
            run(prefix + common + extra + ["--set", f"logging.run_dir=\"{run_dir}\""], env)
            step_time, wait, wall, tok_s, mem = medians(run_dir)
            print(f"{name:40} {step_time:8.2f} {wait:8.3f} {100 * wait / step_time:6.1f}% {wall:8.2f} {tok_s:9.0f}  " +
                  " ".join(f"{mem.get(c, float('nan')):.0f}" for c in cats), flush=True)


if __name__ == "__main__":
    main()
