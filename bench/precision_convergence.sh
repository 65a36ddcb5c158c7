#!/usr/bin/env bash
# Issue 11's convergence check: gpt-tiny and llama-tiny on the built-in fortunes demo corpus, 300
# steps, the same seed and data order, in fp32, bf16, fp16 (dynamic loss scaling) and each FP8
# recipe (on bf16 compute); prints one line per run with the final validation loss and its
# difference from the fp32 run's. fp16 starts from Megatron's initial loss scale 2^32 and skips the
# steps that overflow on the way down; fp16-scale16 starts at 2^16 (--initial-loss-scale 65536, the
# usual override). PRECISIONS and MODELS (environment) pick the runs; fp32, the reference, is always
# first. SEED (environment) sets training.seed (init and data order) for every run of an invocation.
# Usage: [PRECISIONS=...] bench/precision_convergence.sh [MEGATON] [STEPS]
# Loss values, not speed: a loaded machine gives the same numbers.
set -euo pipefail
megaton=${1:-build/megaton}
steps=${2:-300}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$megaton" bench --cpu-info
for model in ${MODELS:-gpt-tiny llama-tiny}; do
  ref=""
  for precision in fp32 ${PRECISIONS:-bf16 fp16 fp16-scale16 fp8-delayed fp8-tensorwise fp8-blockwise mxfp8}; do
    case $precision in
      fp32) sets=() ;;
      bf16) sets=(--set precision.bf16=true) ;;
      fp16) sets=(--set precision.fp16=true) ;;
      fp16-scale16) sets=(--set precision.fp16=true --set precision.initial_loss_scale=65536) ;;
      fp8-delayed) sets=(--set precision.bf16=true --set precision.fp8=hybrid --set precision.fp8_recipe=delayed
                         --set precision.fp8_amax_history_len=16 --set precision.fp8_amax_compute_algo=max) ;;
      fp8-tensorwise) sets=(--set precision.bf16=true --set precision.fp8=hybrid --set precision.fp8_recipe=tensorwise) ;;
      fp8-blockwise) sets=(--set precision.bf16=true --set precision.fp8=e4m3 --set precision.fp8_recipe=blockwise) ;;
      mxfp8) sets=(--set precision.bf16=true --set precision.fp8=e4m3 --set precision.fp8_recipe=mxfp8) ;;
      *) echo "unknown precision '$precision'" >&2; exit 2 ;;
    esac
    [[ -n ${SEED:-} ]] && sets+=(--set training.seed="$SEED")
    run="$work/$model-$precision"
    "$megaton" train --set "model.preset=\"$model\"" --set training.train_iters="$steps" \
      --set logging.eval_interval=0 --set sample.tokens=0 --set logging.save_interval=0 \
      --set "logging.run_dir=\"$run\"" "${sets[@]}" > "$run.log" 2>&1 || { tail -5 "$run.log"; exit 1; }
    loss=$(grep -o '"final":true[^}]*"val_loss":[0-9.]*' "$run/metrics.jsonl" | grep -o '[0-9.]*$')
    [[ -z $ref ]] && ref=$loss
    python3 -c "import sys; l, r = float('$loss'), float('$ref'); print(f'$model $precision: final validation loss {l:.4f} ({100 * (l - r) / r:+.2f}% vs fp32)')"
  done
done
