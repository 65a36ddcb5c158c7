#!/usr/bin/env bash
# Issue 11's speed table: one preset's training steps (forward, backward, clip, AdamW on random
# tokens; `megaton bench`) in fp32, bf16, fp16 and each FP8 recipe, side by side in one run and
# interleaved over REPEATS rounds; prints per precision the median tokens/s, its ratio to fp32 and
# the peak memory by category (MB). FUSIONS (environment, default "on") lists `bench --fusion` values
# to run each precision with (e.g. FUSIONS="on off bias-act residual-norm"), RECOMPUTES (default
# "none") the `bench --recompute` values (none, selective, full), PRECISIONS overrides the
# precision list, LAYERS a number of decoder layers instead of the preset's (`bench --layers`: a
# large model's shape at a size this machine trains). Speed: measure on a quiet machine (`uptime`
# load well below the core count).
# Usage: [FUSIONS=...] [RECOMPUTES=...] [PRECISIONS=...] [LAYERS=...] bench/precision_speed.sh [MEGATON] [PRESET] [REPEATS] [BATCH] [SEQ_LEN]
set -euo pipefail
megaton=${1:-build/megaton}
preset=${2:-gpt2-124m}
repeats=${3:-3}
batch=${4:-4}
seq_len=${5:-256}
read -r -a precisions <<< "${PRECISIONS:-fp32 bf16 fp16 fp8-delayed fp8-tensorwise fp8-blockwise mxfp8}"
read -r -a fusions <<< "${FUSIONS:-on}"
read -r -a recomputes <<< "${RECOMPUTES:-none}"
layers=()
[[ -n "${LAYERS:-}" ]] && layers=(--layers "$LAYERS")
runs=()
for p in "${precisions[@]}"; do
  for f in "${fusions[@]}"; do
    for rc in "${recomputes[@]}"; do runs+=("$p:$f:$rc"); done
  done
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
"$megaton" bench --cpu-info
for ((r = 0; r < repeats; ++r)); do
  for run in "${runs[@]}"; do
    IFS=: read -r precision fusion recompute <<< "$run"
    "$megaton" bench --model "$preset" --batch "$batch" --seq-len "$seq_len" --steps 3 --precision "$precision" \
      --fusion "$fusion" --recompute "$recompute" "${layers[@]}" --json | tail -1 >> "$work/$run.jsonl"
  done
done
/usr/bin/python3 - "$work" "$preset" "$batch" "$seq_len" "${runs[@]}" <<'PY'
import json, statistics, sys
work, preset, batch, seq_len, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
rows = {n: [json.loads(l) for l in open(f"{work}/{n}.jsonl")] for n in names}
median = {n: statistics.median(r["tokens_per_s"] for r in rows[n]) for n in names}
first = names[0]
print(f"{preset} ({rows[first][0]['layers']} layers) batch {batch} x {seq_len}, median of {len(rows[first])} interleaved runs")
print(f"{'precision:fusion:recompute':<32} {'tokens/s':>9} {'vs ' + first:>18}  fwd s  bwd s  peak MB: params grads "
      "optimizer activations workspace total")
for n in names:
    m = rows[n][-1]["peak_memory_mb"]
    ph = {k: statistics.median(r["phase_s"][k] for r in rows[n]) for k in rows[n][0]["phase_s"]}
    print(f"{n:<32} {median[n]:9.1f} {median[n] / median[first]:17.3f}x  {ph.get('forward', 0):.3f}  "
          f"{ph.get('backward', 0):.3f}  {m['params']:.1f} {m['grads']:.1f} {m['optimizer']:.1f} "
          f"{m['activations']:.1f} {m['workspace']:.1f} {m['total']:.1f}")
PY
