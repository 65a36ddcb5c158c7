#!/usr/bin/env bash
# Issue 11's speed table: one preset's training steps (forward, backward, clip, AdamW on random
# tokens; `megaton bench`) in fp32, bf16, fp16 and each FP8 recipe, side by side in one run and
# interleaved over REPEATS rounds; prints per precision the median tokens/s, its ratio to fp32 and
# the peak memory by category (MB). Speed: measure on a quiet machine (`uptime` load well below the
# core count). Usage: bench/precision_speed.sh [MEGATON] [PRESET] [REPEATS] [BATCH] [SEQ_LEN]
set -euo pipefail
megaton=${1:-build/megaton}
preset=${2:-gpt2-124m}
repeats=${3:-3}
batch=${4:-4}
seq_len=${5:-256}
precisions=(fp32 bf16 fp16 fp8-delayed fp8-tensorwise fp8-blockwise mxfp8)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
"$megaton" bench --cpu-info
for ((r = 0; r < repeats; ++r)); do
  for p in "${precisions[@]}"; do
    "$megaton" bench --model "$preset" --batch "$batch" --seq-len "$seq_len" --steps 3 --precision "$p" --json \
      | tail -1 >> "$work/$p.jsonl"
  done
done
/usr/bin/python3 - "$work" "$preset" "$batch" "$seq_len" "${precisions[@]}" <<'PY'
import json, statistics, sys
work, preset, batch, seq_len, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
rows = {n: [json.loads(l) for l in open(f"{work}/{n}.jsonl")] for n in names}
fp32 = statistics.median(r["tokens_per_s"] for r in rows["fp32"])
print(f"{preset} batch {batch} x {seq_len}, median of {len(rows['fp32'])} interleaved runs")
print(f"{'precision':<15} {'tokens/s':>9} {'vs fp32':>8}  peak MB: params grads optimizer activations workspace total")
for n in names:
    tps = statistics.median(r["tokens_per_s"] for r in rows[n])
    m = rows[n][-1]["peak_memory_mb"]
    print(f"{n:<15} {tps:9.1f} {tps / fp32:7.2f}x  {m['params']:.1f} {m['grads']:.1f} {m['optimizer']:.1f} "
          f"{m['activations']:.1f} {m['workspace']:.1f} {m['total']:.1f}")
PY
