#!/usr/bin/env bash
# Builds the CUDA backend here (portable x86-64, sm_90) and packs what scripts/gpu_check.sh needs on
# the device machine into .gpu/bundle.tar.gz: the megaton binary, the CUDA tests, and the shared
# libraries of Debian packages that the device's image lacks (OpenBLAS, oneDNN, toml++,
# sentencepiece, the CUDA runtime). Compressed, since OpenBLAS and oneDNN alone exceed what a
# device call carries (64 MiB); cuBLASLt is far larger and is taken from the device's own CUDA 13.
#
#   scripts/gpu_bundle.sh    then run scripts/gpu_check.sh there with .gpu carried
set -euo pipefail
cd "$(dirname "$0")/.."
configure=$(cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DMEGATON_NATIVE=OFF)
grep -q "CUDA backend ON" <<<"$configure" || { echo "gpu_bundle: nvcc not found, no CUDA backend to bundle"; exit 1; }
cmake --build build-gpu -j"$(nproc)" --target megaton backend_test device_test fp8_cuda_test flash_attention_cuda_test attention_test rope_test
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
cp build-gpu/megaton build-gpu/tests/{backend_test,device_test,fp8_cuda_test,flash_attention_cuda_test,attention_test,rope_test} "$stage/bin/"
# Every shared library the binaries load, except the C runtime the device's newer glibc provides
# and cuBLAS(Lt), which the device's CUDA installation provides.
ldd "$stage"/bin/* | awk '/=> \// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcublas[^/]*)\.so' |
  xargs -I{} cp -L {} "$stage/lib/"
rm -rf .gpu && mkdir .gpu
tar -C "$stage" -czf .gpu/bundle.tar.gz bin lib
du -sh .gpu/bundle.tar.gz
