#!/usr/bin/env bash
# Where a training step's time goes: samples `megaton bench` with perf (software cpu-clock event,
# which also works inside VMs without hardware counters) and prints the hottest symbols with
# their library, after the CPU line the bench prints. Needs Debian's linux-perf.
#
#   bench/profile.sh [MEGATON] [bench args...]   default: build/megaton --model gpt2-124m --batch 4 --seq-len 256
set -euo pipefail
megaton=$(realpath "${1:-build/megaton}")
shift || true
args=("$@")
((${#args[@]})) || args=(--model gpt2-124m --batch 4 --seq-len 256 --steps 3)
command -v perf >/dev/null || { echo "perf not found: apt-get install linux-perf" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

perf record -q -e cpu-clock -o "$work/perf.data" -- "$megaton" bench "${args[@]}"
# Warm-up and the sgemm-ceiling measurement are in the profile too: both are small next to the
# timed steps at the default shape (1 warm-up step + 3 timed, ceiling ~0.2 s).
perf report -i "$work/perf.data" --no-children --sort dso,symbol --stdio 2>/dev/null |
  grep -E '^ +[0-9]' | head -25
