#!/usr/bin/env bash
# Fresh machine -> trained demo model: set up, build, then `megaton train` on the built-in default
# (a byte-level GPT on Debian's fortunes corpus; prints progress, validation loss and a sample).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/megaton train "$@"
