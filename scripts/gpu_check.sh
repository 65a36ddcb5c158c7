#!/usr/bin/env bash
# The GPU checks, as one call for the session's device machine (an H200): build the CUDA backend
# for sm_90 only and run every CUDA kernel test (they skip visibly without a device, so here a
# skip is a failure). Writes its logs under $OUT when set.
#
#   scripts/gpu_check.sh      (on the device machine; ~5 minutes with a cold build)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/megaton_gpu_check}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DMEGATON_NATIVE=ON \
  > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
grep -q "CUDA backend ON" "$out/configure.log" || { echo "CUDA backend not configured"; tail -30 "$out/configure.log"; exit 1; }
cmake --build build-gpu -j"$(nproc)" --target backend_test tensor_view_test > "$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log"; exit 1; }
# A "skipped" CUDA case on a GPU machine is a failure of this check.
build-gpu/tests/backend_test 2>&1 | tee "$out/backend_test.log"
if grep -q "skipped:" "$out/backend_test.log"; then echo "CUDA tests skipped on a GPU machine"; exit 1; fi
