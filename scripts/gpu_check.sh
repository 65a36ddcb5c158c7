#!/usr/bin/env bash
# The GPU checks, as one call for the session's device machine (an H200): every CUDA test (they
# skip visibly without a device, so here a skip is a failure) plain and under compute-sanitizer, then
# the per-shape GEMM benchmark in bf16 and f32 next to PyTorch on the same device, the FP8 GEMMs
# (per-tensor and blockwise) next to bf16 on llama3-1b's shapes, and the flash attention next to
# PyTorch's SDPA (FlashAttention-2, cuDNN, memory-efficient). Logs and JSON go under $OUT when set; the table
# comes last.
#
# The device's image has CUDA, cmake and PyTorch but not the Debian packages Megaton links
# (OpenBLAS, oneDNN, toml++, sentencepiece, gtest): build here with scripts/gpu_bundle.sh and carry
# .gpu/ (one compressed bundle).
# Without .gpu/ this script builds in place, which works only where those packages are installed.
#
#   scripts/gpu_bundle.sh                  (here)
#   scripts/gpu_check.sh [--tests-only]    (on the device machine, .gpu carried; ~3 minutes, ~1 tests only)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/megaton_gpu_check}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$out/gpu.txt"

if [[ -f .gpu/bundle.tar.gz ]]; then
  bundle=$(mktemp -d)
  tar -C "$bundle" -xzf .gpu/bundle.tar.gz
  bin=$bundle/bin
  cublas=$(find /usr/local/cuda/ /usr/local/cuda*/ /opt /usr/lib -name 'libcublasLt.so.13' 2>/dev/null | head -1)
  [[ -n "$cublas" ]] || { echo "libcublasLt.so.13 not found on this machine"; exit 1; }
  export LD_LIBRARY_PATH="$bundle/lib:$(dirname "$cublas")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ldd $bin/* | grep "not found"; then echo "a library the bundle needs is missing"; exit 1; fi
else
  bin=build-gpu/bin-links
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > "$out/configure.log" 2>&1 ||
    { tail -30 "$out/configure.log"; exit 1; }
  grep -q "CUDA backend ON" "$out/configure.log" || { echo "CUDA backend not configured"; exit 1; }
  cmake --build build-gpu -j"$(nproc)" --target megaton backend_test device_test fp8_cuda_test flash_attention_cuda_test attention_test rope_test > "$out/build.log" 2>&1 ||
    { tail -40 "$out/build.log"; exit 1; }
  mkdir -p $bin && ln -sf ../megaton ../tests/backend_test ../tests/device_test ../tests/fp8_cuda_test ../tests/flash_attention_cuda_test ../tests/attention_test \
    ../tests/rope_test $bin/
fi

status=0
# The CUDA suites, and the CUDA cases of the per-op suites (what the tensor API refuses on a GPU).
for t in device_test backend_test fp8_cuda_test flash_attention_cuda_test "attention_test --gtest_filter=Attention.TensorApiOnCudaRefusesWhatItLacks" \
         "rope_test --gtest_filter=Rope.TensorApiOnCudaRotatesF32Only"; do
  name=${t%% *}
  $bin/$t 2>&1 | tee "$out/$name.log" | tail -3
  [[ ${PIPESTATUS[0]} == 0 ]] || { echo "$name FAILED"; status=1; }
  if grep -q "skipped:" "$out/$name.log"; then echo "$name: CUDA cases skipped on a GPU machine"; status=1; fi
done

# The CUDA kernels under compute-sanitizer: out-of-bounds accesses, reads of unwritten memory, races.
# The caching pool is off there (MEGATON_CUDA_CACHING=0): each tensor its own cudaMalloc, so that an
# access past a tensor's end cannot land unseen in a neighbouring cached block.
if command -v compute-sanitizer > /dev/null; then
  for tool in memcheck initcheck racecheck; do
    for t in backend_test fp8_cuda_test flash_attention_cuda_test; do
      MEGATON_CUDA_CACHING=0 compute-sanitizer --tool $tool --error-exitcode 3 $bin/$t > "$out/sanitizer_${tool}_$t.log" 2>&1 ||
        { echo "compute-sanitizer $tool found errors in $t:"; grep -m5 "=========" "$out/sanitizer_${tool}_$t.log"; status=1; }
    done
  done
  echo "compute-sanitizer memcheck/initcheck/racecheck: done"
fi

if [[ "${1:-}" == "--tests-only" ]]; then  # the kernels' correctness alone, when the benchmarks are measured
  [[ $status == 0 ]] && echo "gpu_check (tests only): all passed" || echo "gpu_check (tests only): FAILURES above"
  exit $status
fi

# GEMM rates per linear shape: 8 x 1024 tokens, Megaton (cuBLASLt through the kernel API) vs torch.
tables=""
for spec in "gpt2-124m bf16" "llama3-1b bf16" "gpt2-124m f32"; do
  set -- $spec
  name="gemm_${1}_$2"
  if $bin/megaton bench --gemm-shapes --device cuda --dtype "$2" --model "$1" --batch 8 --seq-len 1024 --steps 10 \
      --json > "$out/$name.jsonl" 2> "$out/$name.err" &&
     python3 bench/torch_gemm_compare.py < "$out/$name.jsonl" > "$out/$name.txt" 2>&1; then
    tables+=$'\n'"== $1 $2, 8192 tokens"$'\n'"$(cat "$out/$name.txt")"
  else
    echo "$name FAILED:"; cat "$out/$name.err" "$out/$name.txt" 2>/dev/null | tail -5; status=1
  fi
done
# FP8 GEMMs (cuBLASLt, per-tensor and DeepSeek-V3 blocks) next to bf16 on llama3-1b's shapes.
for recipe in fp8-tensorwise fp8-blockwise; do
  name="gemm_llama3-1b_$recipe"
  if $bin/megaton bench --gemm-shapes --device cuda --dtype $recipe --model llama3-1b --batch 8 --seq-len 1024 \
      --steps 10 > "$out/$name.txt" 2>&1; then
    tables+=$'\n'"== llama3-1b $recipe vs bf16, 8192 tokens"$'\n'"$(grep -v '^cpu:' "$out/$name.txt")"
  else
    echo "$name FAILED:"; tail -5 "$out/$name.txt"; status=1
  fi
done
# The flash attention kernels (bf16, causal) next to PyTorch's SDPA backends on the same shapes.
for spec in "gpt2-124m 8 1024" "llama3-8b 2 4096" "deepseek-v3-671b 1 4096"; do
  set -- $spec
  name="attention_$1"
  if $bin/megaton bench --attention --device cuda --dtype bf16 --model "$1" --batch "$2" --seq-len "$3" --steps 10 \
      --json > "$out/$name.jsonl" 2> "$out/$name.err" &&
     python3 -W ignore bench/torch_attention_compare.py < "$out/$name.jsonl" > "$out/$name.txt" 2>> "$out/$name.err"; then
    tables+=$'\n'"== attention $1, batch $2 x $3"$'\n'"$(cat "$out/$name.txt")"
  else
    echo "$name FAILED:"; cat "$out/$name.err" "$out/$name.txt" 2>/dev/null | tail -5; status=1
  fi
done
echo "$tables"
[[ $status == 0 ]] && echo "gpu_check: all passed" || echo "gpu_check: FAILURES above"
exit $status
