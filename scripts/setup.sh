#!/usr/bin/env bash
# Installs the Debian packages Megaton needs (when missing) and builds it into build/.
# Usage: scripts/setup.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake pkg-config ccache libopenblas-openmp-dev libdnnl-dev nlohmann-json3-dev
          libtomlplusplus-dev libcli11-dev libgtest-dev python3-torch python3-numpy fortunes zlib1g-dev libzstd-dev
          libxxhash-dev libpcre2-dev libsentencepiece-dev sentencepiece python3-regex libopenmpi-dev openmpi-bin
          libcpp-httplib-dev
          clang-14 libclang-rt-14-dev libomp-14-dev llvm-14)
# clang-14 and its runtimes (libFuzzer, the sanitizers, OpenMP, llvm-symbolizer) for the checking build of
# scripts/test.sh: one LLVM version throughout, as a compiler only links the runtimes of its own version.
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
