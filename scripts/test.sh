#!/usr/bin/env bash
# Fresh machine -> full test suite: set up, build, run every CTest test (GoogleTest binaries and
# the PyTorch / numpy reference checks).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
