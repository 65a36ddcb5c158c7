"""Pipeline schedules measured next to the simulator's prediction from the same run's op costs.

  python3 bench/pipeline_schedules.py --megaton build/megaton [--pp 2] [--microbatches 8] [--steps 4]
      [--layers 8] [--hidden 512] [--seq-len 256] [--micro-batch 2] [--kinds 1f1b,interleaved,...]

For each schedule kind, trains `mpirun -np PP megaton train` with logging.trace = true (one thread
per rank; gpt-tiny's byte-level vocabulary scaled to --layers x --hidden, so that the output head
does not make the last stage's F several times the others': the simulator takes one cost per op kind) and reads RUN/trace.json: every rank's ops, timed. Measured: the median over steps 2.. of
the step's span (first op start to last op end over all ranks; the optimizer update between steps
is not in it) and its bubble (1 - busy time / (ranks x span); an op's time leaves out its wait for
inputs from other stages). Predicted: `megaton schedule` of the
same kind with the run's own median op costs (F, B, W and F&B per op; a B that ran its W in the
same call is split in the ratio of the zb-h1 run's separate B and W, measured first). Prints the CPU
line first, then one row per schedule.
"""
import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from mpi_runs import MPI_ENV, mpirun, run


def is_compute(name):
    return "&" in name or name[0] in "FBW"


def measure(trace_path, steps):
    trace = json.loads(Path(trace_path).read_text())
    ranks = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            ranks.setdefault(e["pid"], []).append(e)
    spans, bubbles = [], []
    per_step = {r: len(ops) // steps for r, ops in ranks.items()}
    for s in range(1, steps):  # step 1 warms up
        chunk = {r: ops[s * per_step[r]:(s + 1) * per_step[r]] for r, ops in ranks.items()}
        start = min(ops[0]["ts"] for ops in chunk.values())
        end = max(ops[-1]["ts"] + ops[-1]["dur"] for ops in chunk.values())
        busy = sum(e["dur"] for ops in chunk.values() for e in ops if is_compute(e["name"]))
        spans.append((end - start) / 1e6)
        bubbles.append(1 - busy / (len(chunk) * (end - start)))
    groups = {"F": [], "B": [], "W": [], "B+W": [], "FB": [], "FB+W": []}
    for r, ops in ranks.items():
        for e in ops[per_step[r]:]:  # step 1 warms up
            name, dur = e["name"], e["dur"] / 1e6
            with_w = name.endswith("+W")
            if "&" in name:
                groups["FB+W" if with_w else "FB"].append(dur)
            elif name[0] == "B":
                groups["B+W" if with_w else "B"].append(dur)
            elif name[0] in "FW":
                groups[name[0]].append(dur)
    costs = {k: statistics.median(v) for k, v in groups.items() if v}
    return statistics.median(spans), statistics.median(bubbles), costs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--megaton", required=True)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--kinds", default="zb-h1,1f1b,interleaved,zb-h2,zbv,dualpipe,dualpipev")
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    if kinds[0] != "zb-h1":
        kinds = ["zb-h1"] + [k for k in kinds if k != "zb-h1"]  # its B / W split is the reference
    binary = str(Path(args.megaton).resolve())
    env = dict(os.environ, **MPI_ENV, OMP_NUM_THREADS="1")
    print(run([binary, "bench", "--cpu-info"], env).strip())
    heads = args.hidden // 64
    common = ["--set", "model.preset=gpt-tiny", "--set", f"model.num_layers={args.layers}",
              "--set", f"model.hidden_size={args.hidden}", "--set", f"model.num_attention_heads={heads}",
              "--set", f"model.num_query_groups={heads}", "--set", f"model.ffn_hidden_size={4 * args.hidden}",
              "--set", f"training.micro_batch_size={args.micro_batch}",
              "--set", f"training.global_batch_size={args.micro_batch * args.microbatches}",
              "--set", f"training.seq_length={args.seq_len}", "--set", f"training.train_iters={args.steps}",
              "--set", "training.threads=1", "--set", "logging.eval_iters=1", "--set", "sample.tokens=0",
              "--set", "optimizer.lr_warmup_iters=0", "--set", "logging.trace=true", "--set", f"pp={args.pp}"]
    print(f"{args.layers} layers x hidden {args.hidden}, pp{args.pp}, {args.microbatches} micro-batches of "
          f"{args.micro_batch} x {args.seq_len}, 1 thread per rank; medians over steps 2..{args.steps}")
    print(f"{'schedule':12} {'measured s':>10} {'bubble':>7} {'predicted s':>11} {'bubble':>7} {'error':>7}  op costs (s)")
    b_share = None
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            vpp = 2 if kind in ("interleaved", "zbv", "dualpipe", "dualpipev") else 1  # chunks per rank
            run_dir = Path(tmp) / kind
            extra = ["--set", f"parallel.pipeline_schedule=\"{kind}\"", "--set", f"logging.run_dir=\"{run_dir}\""]
            if kind == "interleaved":
                extra += ["--set", f"parallel.virtual_pipeline_model_parallel_size={vpp}"]
            run(mpirun(args.pp) + [binary, "train"] + common + extra, env)
            span, bubble, c = measure(run_dir / "trace.json", args.steps)
            if kind == "zb-h1":
                b_share = c["B"] / (c["B"] + c["W"])
            if "B" not in c and "B+W" in c:  # every B ran its W in the same call
                c["B"], c["W"] = c["B+W"] * b_share, c["B+W"] * (1 - b_share)
            if "FB" not in c and "FB+W" in c:
                c["FB"] = c["FB+W"] - c["W"]
            costs = f"F={c['F']:.6f},B={c['B']:.6f},W={c['W']:.6f},T=0"
            if "FB" in c:
                costs += f",FB={c['FB']:.6f}"
            sim = json.loads(run([binary, "schedule", "--kind", kind, "--pp", str(args.pp), "--vpp", str(vpp),
                                  "--microbatches", str(args.microbatches), "--costs", costs, "--json"], env))
            err = sim["step_time"] / span - 1
            print(f"{kind:12} {span:10.3f} {100 * bubble:6.1f}% {sim['step_time']:11.3f} "
                  f"{100 * sim['bubble_fraction']:6.1f}% {100 * err:+6.1f}%  {costs}", flush=True)


if __name__ == "__main__":
    main()
