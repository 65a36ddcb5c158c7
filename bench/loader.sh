#!/usr/bin/env bash
# Data loader throughput against the trainer's appetite: tokens/s the loader delivers as gpt2-124m training
# batches (micro-batch 4 x 256 tokens, Megatron GPTDataset sampling over the fortunes corpus, 2 prefetch
# threads) vs tokens/s one gpt2-124m training step consumes (`megaton bench`, same shape).
#
#   bench/loader.sh [MEGATON]      default: build/megaton; TRAINER_TOKENS_PER_S=N skips measuring the trainer
set -euo pipefail
megaton=$(realpath "${1:-build/megaton}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$megaton" bench --cpu-info

mapfile -t texts < <(find /usr/share/games/fortunes -type f ! -name '*.dat' ! -name '*.u8' | sort)
"$megaton" preprocess --input "${texts[@]}" --doc-separator % --append-eod --output-prefix "$work/fortunes" \
  --no-progress >/dev/null
# 200k samples: several epochs of the corpus, so the indices span epochs as in a long run.
loader=$("$megaton" data bench "$work/fortunes" --seq-length 256 --micro-batch-size 4 --num-workers 2 \
  --train-samples 200000 --seconds 5)
trainer=${TRAINER_TOKENS_PER_S:-$("$megaton" bench --model gpt2-124m --batch 4 --seq-len 256 --json |
  /usr/bin/python3 -c 'import json, sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["tokens_per_s"])')}
echo "loader: $loader"
/usr/bin/python3 - "$loader" "$trainer" <<'PY'
import json, sys
loader, trainer = json.loads(sys.argv[1])["tokens_per_s"], float(sys.argv[2])
print(f"loader {loader:,.0f} tokens/s; gpt2-124m training consumes {trainer:,.0f} tokens/s; ratio {loader / trainer:,.0f}x")
PY
