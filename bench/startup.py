#!/usr/bin/python3
"""Start-up and memory of `megaton generate` on an HF model folder (issue 15), side by side.

For each binary (this build, and optionally a baseline such as main before a change), runs
`generate --model DIR --prompt-ids 1 --max-new-tokens N --temperature 0 --ignore-eos --json`
REPEATS times, the binaries interleaved, and prints the medians of:
  - load_s (the folder read into a model ready to run) and prefill_s (the first token: with mapped
    weights, the first touch of their pages lands here),
  - decode_tokens_per_s,
  - peak resident anonymous memory (RssAnon: what the process allocated and wrote) and peak resident
    file pages (RssFile: the page cache it maps, shared with other readers and reclaimable), sampled
    every 20 ms from /proc/PID/status.

  /usr/bin/python3 bench/startup.py --megaton build/megaton [--baseline MAIN/megaton] --model DIR
      [--precision fp32|bf16] [--tokens 128] [--repeats 5]

Make the folders with bench/decode.py's write_hf (HF's 8-byte data alignment) or `megaton convert`
(64-byte alignment, so that tensors can be mapped in place). Measure on a quiet machine.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time


def run(binary, model, precision, tokens):
    p = subprocess.Popen([binary, "generate", "--model", model, "--prompt-ids", "1", "--max-new-tokens", str(tokens),
                          "--temperature", "0", "--json", "--precision", precision, "--ignore-eos"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    peak = {"RssAnon": 0, "RssFile": 0}
    while p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    key = line.split(":")[0]
                    if key in peak:
                        peak[key] = max(peak[key], int(line.split()[1]))
        except OSError:  # exited between poll() and open()
            pass
        time.sleep(0.02)
    out, err = p.communicate()
    if p.returncode != 0:
        sys.exit(f"{binary} failed ({p.returncode}):\n{err}")
    j = json.loads(out)
    return {"load_s": j["load_s"], "prefill_s": j["prefill_s"], "decode tok/s": j["decode_tokens_per_s"],
            "RssAnon MB": peak["RssAnon"] / 1024, "RssFile MB": peak["RssFile"] / 1024}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megaton", required=True)
    ap.add_argument("--baseline")
    ap.add_argument("--model", required=True)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.tokens < 2 or args.repeats < 1:
        sys.exit("--tokens must be at least 2 and --repeats at least 1")
    print("load average:", open("/proc/loadavg").read().split()[:3])
    cpu = [l for l in open("/proc/cpuinfo") if l.startswith("model name")]
    flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
    print("cpu:", cpu[0].split(":")[1].strip() if cpu else "?",
          *[f"| {f}" for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags])
    builds = [("megaton", args.megaton)] + ([("baseline", args.baseline)] if args.baseline else [])
    runs = {label: [] for label, _ in builds}
    for _ in range(args.repeats):
        for label, binary in builds:
            runs[label].append(run(binary, args.model, args.precision, args.tokens))
    for label, rows in runs.items():
        medians = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"{label} {args.precision}: " + ", ".join(f"{k} {v:.3f}" if k.endswith("_s") else f"{k} {v:.1f}"
                                                      for k, v in medians.items()))


if __name__ == "__main__":
    main()
