#!/usr/bin/env bash
# OpenBLAS's OpenMP build (what Megaton links) vs its pthread build, same binary, same shape:
# the pthread build is swapped in through LD_LIBRARY_PATH (the binary's RUNPATH yields to it).
# With the pthread build, OpenBLAS's own thread pool and the OpenMP pool of Megaton's kernels
# spin against each other on the same cores. Repeats each variant and prints every tokens/s.
# Needs Debian's libopenblas0-pthread (the runtime of the pthread build) besides the OpenMP one.
#
#   bench/openblas_variants.sh [MEGATON] [REPEATS]   default: build/megaton 3
set -euo pipefail
megaton=$(realpath "${1:-build/megaton}")
repeats=${2:-3}
pthread_dir=/usr/lib/x86_64-linux-gnu/openblas-pthread
[ -e "$pthread_dir/libopenblas.so.0" ] || { echo "missing $pthread_dir: apt-get install libopenblas0-pthread" >&2; exit 1; }

bench() {  # $1: LD_LIBRARY_PATH ("" = as linked)
  LD_LIBRARY_PATH="$1" "$megaton" bench --model gpt2-124m --batch 4 --seq-len 256 --steps 3 --json |
    /usr/bin/python3 -c 'import json, sys; print(round(json.loads(sys.stdin.read().strip().splitlines()[-1])["tokens_per_s"], 1))'
}
"$megaton" bench --model gpt-tiny --batch 1 --seq-len 8 --steps 1 | head -1  # the cpu line
for variant in openmp pthread; do
  dir=""
  [ "$variant" = pthread ] && dir=$pthread_dir
  # ldd shows which libopenblas the loader really picks, so a silent fallback cannot mislabel a row.
  picked=$(LD_LIBRARY_PATH="$dir" ldd "$megaton" | awk '/libopenblas/ {print $3}')
  runs=()
  for _ in $(seq "$repeats"); do runs+=("$(bench "$dir")"); done
  echo "$variant ($picked): tokens/s ${runs[*]}"
done
