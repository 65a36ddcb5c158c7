#!/usr/bin/env bash
# Fresh machine -> full test suite: set up, build, run every CTest test (GoogleTest binaries and
# the PyTorch / numpy reference checks); then the checking build: the unit tests under
# AddressSanitizer + UndefinedBehaviorSanitizer and every libFuzzer harness for a bounded time
# (MEGATON_CHECKING_BUILD=0 skips it, for a quick local run).
# Arguments go to the first ctest (e.g. -R regex).
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache keys on paths relative to the checkout, so a fresh clone elsewhere (CI's) reuses the cache;
# the checking build's line tables would otherwise hash the build directory too.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
scripts/setup.sh
(cd build && ctest --output-on-failure -j"$(nproc)" "$@")

# Measured on 2 cores: a cold build ~10.5 min (ccache then serves later runs), the sanitized unit
# tests ~2.5 min, the fuzzers ~1.5 min.
[[ "${MEGATON_CHECKING_BUILD:-1}" == 1 ]] || exit 0

# The checking build, clang 14 (libFuzzer needs clang; the version scripts/setup.sh installs), in its own
# directory; ccache serves it as it serves build/. Left out of its unit tests, to keep CI short: the
# Python reference checks and benchmarks, the multi-process runs (Open MPI's own allocations would be
# reported as leaks), the long model tests and the finite-difference gradient checks (the same kernels
# and library code as the short tests run, at many times the cost under the sanitizers: minutes each),
# and the calibration's timing check (instrumented kernels against uninstrumented OpenBLAS / oneDNN
# calls: their relative speed under the sanitizers says nothing).
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
      -DMEGATON_CUDA=OFF -DMEGATON_SANITIZE=address,undefined -DMEGATON_FUZZ=ON >/dev/null
cmake --build build-sanitize -j"$(nproc)"
cd build-sanitize
export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-14/bin/llvm-symbolizer UBSAN_OPTIONS=print_stacktrace=1
export LSAN_OPTIONS="suppressions=$(realpath ../scripts/lsan.supp)"
SLOW='^(py_|bench_)|_np[0-9]+$|^(DataParallel|DpResilience|DistributedOptimizer|AbortJob|CrashRestart|Determinism|Models/|MoeParallelRuns|PipelineParallel|TensorParallel|MemoryModelRuns[.]TensorAndPipelineParallel|QuickCalibration[.]OpOverhead)|^Fp8Runs[.]DelayedScaling(Agrees|Resumes)|^RecomputeRuns[.]TensorAndSequenceParallel|FiniteDifferences'
ctest --output-on-failure -j"$(nproc)" -LE fuzz -E "$SLOW"
ctest --output-on-failure -j"$(nproc)" -L fuzz
# Executions per harness, from libFuzzer's final statistics.
awk '/^[0-9]+\/[0-9]+ Test: fuzz_/ {name = $3} /stat::number_of_executed_units/ {print name ": " $2 " executions"}' \
    Testing/Temporary/LastTest.log
