#!/usr/bin/env python3
"""`megaton plan`'s predictions against real runs on this machine: for each layout, the planner's
step time and largest rank's peak memory next to the median measured step time (steps after the
first --skip) and the allocator's peak of the largest rank (metrics.jsonl's first step record), run
under mpirun with one thread per rank (a "device" is one core). Calibrate first, both under
OMPI_MCA_btl=self,tcp on a 2-core machine (Open MPI's shared-memory transport polls on the core the
computation needs; docs/performance.md):

    export OMPI_MCA_btl=self,tcp
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 build/megaton plan calibrate \\
        --output /tmp/cpu.toml --threads 1
    python3 bench/plan_validation.py --megaton build/megaton --system /tmp/cpu.toml

Prints the CPU's features, one row per layout and the median |error| of time and memory.
--search-check also runs the planner's top 3 layouts of one small search and says whether the
measured order is the predicted one."""
import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_runs import MPI_ENV, mpirun, run  # noqa: E402

COMMON = ["training.seq_length=128", "training.train_iters={steps}", "optimizer.lr_warmup_iters=0", "logging.log_interval=1000",
          "logging.eval_interval=0", "logging.eval_iters=1", "logging.save_interval=0", "sample.tokens=0",
          "checkpoint.async_save=false", "data.num_workers=1"]

# (name, ranks, settings). Model shapes: the tiny presets widened so a step is mostly the GEMMs the
# model times, not the fixed costs around them.
LAYOUTS = [
    ("gpt 1 rank", 1, ["model.preset=\"gpt-tiny\"", "training.micro_batch_size=8", "training.global_batch_size=16"]),
    ("gpt dp2", 2, ["model.preset=\"gpt-tiny\"", "training.micro_batch_size=8", "training.global_batch_size=16"]),
    ("gpt tp2", 2, ["model.preset=\"gpt-tiny\"", "tp=2", "training.micro_batch_size=8", "training.global_batch_size=16"]),
    ("gpt pp2 1f1b", 2, ["model.preset=\"gpt-tiny\"", "pp=2", "training.micro_batch_size=4",
                         "training.global_batch_size=16"]),
    ("gpt pp2 zb-h1", 2, ["model.preset=\"gpt-tiny\"", "pp=2", "parallel.pipeline_schedule=\"zb-h1\"",
                          "training.micro_batch_size=4", "training.global_batch_size=16"]),
    ("llama pp2 1f1b recompute full", 2,
     ["model.preset=\"llama-tiny\"", "pp=2", "training.micro_batch_size=4", "training.global_batch_size=16",
      "training.recompute_granularity=\"full\""]),
    ("llama dp2 distopt", 2, ["model.preset=\"llama-tiny\"", "parallel.use_distributed_optimizer=true",
                              "training.micro_batch_size=8", "training.global_batch_size=16"]),
    ("llama tp2 sp selective", 2,
     ["model.preset=\"llama-tiny\"", "tp=2", "parallel.sequence_parallel=true", "training.micro_batch_size=8",
      "training.global_batch_size=16", "training.recompute_granularity=\"selective\"",
      "training.recompute_modules=\"core_attn\""]),
    ("deepseek-v3-tiny 1 rank", 1, ["model.preset=\"deepseek-v3-tiny\"", "training.micro_batch_size=8",
                                    "training.global_batch_size=16"]),
    ("deepseek-v3-tiny ep2", 2, ["model.preset=\"deepseek-v3-tiny\"", "ep=2", "training.micro_batch_size=8",
                                 "training.global_batch_size=16"]),
    ("deepseek-v3-tiny pp2 interleaved", 2,
     ["model.preset=\"deepseek-v3-tiny\"", "model.num_layers=4", "model.mtp_num_layers=0", "pp=2", "parallel.pipeline_schedule=\"interleaved\"",
      "parallel.virtual_pipeline_model_parallel_size=2", "training.micro_batch_size=4", "training.global_batch_size=16"]),
]


def sets(items):
    return [a for s in items for a in ("--set", s)]


def cpu_features():
    flags = open("/proc/cpuinfo").read().split("\nflags")[1].split("\n")[0]
    keep = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags]
    model = [line for line in open("/proc/cpuinfo") if line.startswith("model name")][0].split(":")[1].strip()
    return f"{model} ({' '.join(keep)}), {os.cpu_count()} cores"


def predict(args, ranks, settings):
    out = run([args.megaton, "plan", "--system", args.system, "--devices", str(ranks), "--json"] + sets(settings),
              os.environ)
    return json.loads(out.strip().splitlines()[-1])


def measure_once(args, ranks, settings):
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, **MPI_ENV, OMP_NUM_THREADS="1")
        run(mpirun(ranks) + [args.megaton, "train", "--overwrite"] + sets(settings + [f"logging.run_dir=\"{d}/run\""]),
            env)
        records = [json.loads(line) for line in open(f"{d}/run/metrics.jsonl") if "step_time_s" in line]
    times = [r["step_time_s"] for r in records[args.skip:]]
    return statistics.median(times), records[0]["peak_memory_bytes"]


# The fastest of --repeats runs' medians: on 2 cores a multi-rank run is bimodal (identical runs at
# 0.14 s or 0.28 s a step), the slow mode being a rank's MPI progress thread polling inside a
# blocking collective on the core its compute thread needs.
def measure(args, ranks, settings):
    runs = [measure_once(args, ranks, settings) for _ in range(args.repeats)]
    return min(t for t, _ in runs), runs[0][1]


def row(args, name, ranks, settings):
    settings = [s.format(steps=args.steps) for s in COMMON] + settings
    p = predict(args, ranks, settings)
    t, mem = measure(args, ranks, settings)
    e_t, e_m = p["step_time_s"] / t - 1, p["peak_memory_bytes"] / mem - 1
    print(f"| {name} | {ranks} | {p['step_time_s']:.4f} | {t:.4f} | {100 * e_t:+.1f}% | "
          f"{p['peak_memory_bytes'] / 1e6:.1f} | {mem / 1e6:.1f} | {100 * e_m:+.1f}% |", flush=True)
    return e_t, e_m


def search_check(args):
    out = run([args.megaton, "plan", "--search", "--model", "gpt-tiny", "--system", args.system, "--devices", "2",
               "--global-batch", "16", "--seq-len", "128", "--top", "3", "--json"], os.environ)
    best = json.loads(out.strip().splitlines()[-1])["best"]
    measured = []
    for b in best:
        settings = [s.format(steps=args.steps) for s in COMMON] + [s for s in b["settings"].split(" ")]
        t, _ = measure(args, 2, settings)
        measured.append(t)
        print(f"| {b['settings']} | {b['step_time_s']:.4f} | {t:.4f} |", flush=True)
    same = sorted(range(len(measured)), key=lambda i: measured[i]) == list(range(len(measured)))
    print(f"measured order {'matches' if same else 'differs from'} the predicted one")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megaton", default="build/megaton")
    ap.add_argument("--system", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=2, help="first steps left out of the median")
    ap.add_argument("--repeats", type=int, default=3, help="runs per layout; the fastest run's median counts")
    ap.add_argument("--only", default="", help="comma-separated layout names")
    ap.add_argument("--search-check", action="store_true")
    args = ap.parse_args()
    print(f"cpu: {cpu_features()}")
    if args.search_check:
        print("| layout (search top 3) | predicted s | measured s |\n|---|---|---|")
        search_check(args)
        return
    print("| layout | ranks | predicted s | measured s | time error | predicted MB | measured MB | memory error |")
    print("|---|---|---|---|---|---|---|---|")
    errors = [row(args, n, r, s) for n, r, s in LAYOUTS if not args.only or n in args.only.split(",")]
    print(f"median |time error| {100 * statistics.median(abs(e) for e, _ in errors):.1f}%, "
          f"median |memory error| {100 * statistics.median(abs(m) for _, m in errors):.1f}%")


if __name__ == "__main__":
    main()
