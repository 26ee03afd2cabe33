#!/usr/bin/env bash
# The first README command: install what kiln needs, build, run kiln on the default model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
make -j"$(nproc)"
model=$(bash scripts/default_model.sh)
./kiln run "$model" --temp 0 -n 200
