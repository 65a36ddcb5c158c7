#!/usr/bin/python3
"""Expert parallelism's communication (issue 12): the fraction of step time each rank is blocked on
the MoE token dispatcher, at ep2 and ep4, each dispatcher, with the shared expert computing while
the tokens travel (model.moe_shared_expert_overlap) and without; plus the same global batch in one
process and at dp = NP without expert parallelism (every rank holding every expert) for reference.

  /usr/bin/python3 bench/expert_parallel.py --megaton build/megaton [--eps 2,4] [--steps 8] [--batch 2]
      [--seq-len 128] [--threads 1] [--repeats 3]

The model is deepseek-v3-tiny scaled up so the experts weigh something (hidden 256, 8 heads, 4
layers, 8 routed experts of width 512 top-2 in 4 groups, a shared expert of 512, MTP off). Each run
is `mpirun -np EP megaton train` with data parallel = EP (one micro-batch of B x T per rank). From
rank 0's metrics.jsonl, medians over steps 2..: step_time_s, the dispatcher wait (the MoE layers'
dispatch_wait_s summed) and tokens/s; each figure is the median over --repeats runs. Prints the
CPU line first. On a machine with fewer cores than ranks the ranks share cores: the waits then
include waiting for a descheduled peer, so compare rows of one run only.
"""
import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from mpi_runs import MPI_ENV, mpirun, run

MODEL = ["model.preset=\"deepseek-v3-tiny\"", "model.hidden_size=256", "model.num_attention_heads=8",
         "model.num_query_groups=8", "model.num_layers=4", "model.moe_ffn_hidden_size=512",
         "model.moe_shared_expert_intermediate_size=512", "model.ffn_hidden_size=1024", "model.mtp_num_layers=0"]


def medians(run_dir: Path):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "loss" in r and "step_time_s" in r][1:]  # the first step warms up
    if not steps:
        raise SystemExit(f"no step records in {run_dir}")
    step = statistics.median(s["step_time_s"] for s in steps)
    wait = statistics.median(sum(layer.get("dispatch_wait_s", 0.0) for layer in s.get("moe", [])) for s in steps)
    return step, wait, statistics.median(s["tokens_per_s"] for s in steps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--megaton", required=True)
    ap.add_argument("--eps", default="2,4")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    binary = str(Path(args.megaton).resolve())
    env = dict(os.environ, **MPI_ENV, OMP_NUM_THREADS=str(args.threads))
    print(run([binary, "bench", "--cpu-info"], env).strip())
    sets = [*MODEL, f"training.micro_batch_size={args.batch}", f"training.seq_length={args.seq_len}",
            f"training.train_iters={args.steps}", f"training.threads={args.threads}", "logging.eval_interval=0",
            "sample.tokens=0", "logging.save_interval=0", "optimizer.lr_warmup_iters=0"]
    print(f"deepseek-v3-tiny scaled ({' '.join(MODEL[1:])}), B={args.batch} T={args.seq_len} per rank, "
          f"{args.threads} thread(s) per rank; medians over steps 2..{args.steps}, then over {args.repeats} runs")
    print(f"{'run':44} {'step s':>8} {'dispatch wait s':>16} {'wait %':>7} {'tokens/s':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for ep in (int(e) for e in args.eps.split(",")):
            gbs = [f"training.global_batch_size={args.batch * ep}"]
            runs = [(f"1 process, global batch of ep{ep}", 1, [])]
            runs.append((f"dp{ep}, every rank all experts", ep, []))
            for dispatcher in ("alltoall", "allgather"):
                for overlap in ("true", "false"):
                    runs.append((f"ep{ep} {dispatcher}, shared overlap {overlap}", ep,
                                 [f"parallel.expert_model_parallel_size={ep}",
                                  f"model.moe_token_dispatcher_type=\"{dispatcher}\"",
                                  f"model.moe_shared_expert_overlap={overlap}"]))
            for i, (name, np, extra) in enumerate(runs):
                results = []
                for r in range(args.repeats):
                    run_dir = Path(tmp) / f"ep{ep}_{i}_{r}"
                    cmd = (mpirun(np) if np > 1 else []) + [binary, "train"]
                    for s in [*sets, *gbs, *extra, f'logging.run_dir="{run_dir}"']:
                        cmd += ["--set", s]
                    run(cmd, env)
                    results.append(medians(run_dir))
                step, wait, tok = (statistics.median(x[k] for x in results) for k in range(3))
                print(f"{name:44} {step:8.3f} {wait:16.4f} {100 * wait / step:6.1f}% {tok:9.0f}", flush=True)


if __name__ == "__main__":
    main()
