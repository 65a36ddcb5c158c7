"""Checkpoint save stall: how long a save holds up training, asynchronous vs synchronous.

  /usr/bin/python3 bench/save_stall.py --megaton PATH [--model gpt2-124m] [--saves 5]
      [--interval 10] [--batch 1] [--seq-len 64] [--threads 2] [--work DIR]

Trains the preset twice with `megaton train` (checkpoint.async_save = true, then false), saving
every --interval steps, and reads each save's record from metrics.jsonl: stall_s is the time the
training loop was blocked by the save (the snapshot copy; with a synchronous save the whole write).
With async saves the writer thread also competes for the cores, so the steps that overlap a write
are slower; "overlap" adds that slowdown (their step time above the median step time) to the stall.
Reports the median over --saves saves of each, and the write time. Data: bytes of this repository's
sources, prepared with `megaton preprocess`.
"""
import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_train(megaton: str, work: Path, args, async_save: bool) -> dict:
    run_dir = work / ("async" if async_save else "sync")
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run; train refuses to start beside old checkpoints
    iters = args.interval * (args.saves + 1)  # the last measured save is followed by steps too
    sets = {
        "model.preset": f'"{args.model}"',
        "data.data_path": f'"{work / "data"}"',
        "training.micro_batch_size": args.batch,
        "training.global_batch_size": args.batch,
        "training.seq_length": args.seq_len,
        "training.train_iters": iters,
        "training.threads": args.threads,
        "logging.run_dir": f'"{run_dir}"',
        "logging.log_interval": iters,
        "logging.save_interval": args.interval,
        "logging.peak_tflops": 1.0,
        "checkpoint.keep_last": 2,
        "checkpoint.async_save": "true" if async_save else "false",
    }
    cmd = [megaton, "train"] + [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    saves = [r for r in rows if r.get("event") == "checkpoint"][: args.saves]
    median_step = statistics.median(r["step_time_s"] for r in steps)
    stalls, overlaps, writes = [], [], []
    for s in saves:
        # Steps running while the write did: end after it started, start before it ended.
        slowdown = sum(max(0.0, r["step_time_s"] - median_step) for r in steps
                       if r["time"] > s["write_start"] and r["time"] - r["step_time_s"] < s["write_end"])
        stalls.append(s["stall_s"])
        overlaps.append(s["stall_s"] + (slowdown if async_save else 0.0))
        writes.append(s["write_end"] - s["write_start"])
    return {"median_step_s": median_step, "stall_s": statistics.median(stalls),
            "stall_with_overlap_s": statistics.median(overlaps), "write_s": statistics.median(writes),
            "stalls": stalls}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--megaton", required=True)
    p.add_argument("--model", default="gpt2-124m")
    p.add_argument("--saves", type=int, default=5)
    p.add_argument("--interval", type=int, default=10)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work", help="scratch directory (default: a temporary one)")
    args = p.parse_args()
    subprocess.run([args.megaton, "bench", "--cpu-info", "--threads", str(args.threads)], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        sources = sorted(str(f) for f in (ROOT / "src").rglob("*.cpp"))
        subprocess.run([args.megaton, "preprocess", "--input", *sources, "--output-prefix", str(work / "data"),
                        "--append-eod"], check=True, stdout=subprocess.DEVNULL)
        results = {mode: run_train(args.megaton, work, args, mode == "async") for mode in ("sync", "async")}
    sync, asyn = results["sync"], results["async"]
    print(json.dumps({"model": args.model, **{f"{m}_{k}": v for m, r in results.items() for k, v in r.items()}}))
    print(f"{args.model}, median of {args.saves} saves (step {sync['median_step_s']:.3f} s): "
          f"synchronous stall {sync['stall_s']:.3f} s | asynchronous stall {asyn['stall_s']:.3f} s "
          f"({100 * asyn['stall_s'] / sync['stall_s']:.1f}% of synchronous), "
          f"{asyn['stall_with_overlap_s']:.3f} s counting the slowdown of overlapping steps "
          f"({100 * asyn['stall_with_overlap_s'] / sync['stall_s']:.1f}%) | write {asyn['write_s']:.2f} s in the background")


if __name__ == "__main__":
    main()
