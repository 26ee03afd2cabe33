#!/usr/bin/env bash
# Installs the Debian packages kiln builds and tests with, when they are missing, and the npm
# packages of the test suite (package.json) when it exists. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(build-essential pkg-config libjansson-dev libpcre2-dev libxxhash-dev libmicrohttpd-dev libcmocka-dev libicu-dev
      python3 python3-numpy python3-torch python3-jinja2 nodejs npm
      clang libclang-rt-dev libomp-dev   # clang + libFuzzer + its OpenMP: make fuzz, the short fuzz pass of make test
      libvulkan-dev glslc mesa-vulkan-drivers   # the vulkan backend; lavapipe runs its tests on the CPU
      openmpi-bin libopenmpi-dev                # scale-out over MPI (--tp under mpirun)
      chromium                                  # the chat page's browser test (playwright-core drives it)
      prometheus)                               # promtool checks /metrics
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# nodejs/npm may come from outside Debian's packages (a preinstalled Node.js): accept them as present.
if command -v node >/dev/null && command -v npm >/dev/null; then
    missing=($(printf '%s\n' "${missing[@]}" | grep -v -x -e nodejs -e npm || true))
fi
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    echo "installing: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
if [ -f package.json ] && command -v npm >/dev/null; then
    if [ -f package-lock.json ]; then npm ci --no-audit --no-fund --loglevel=error; else npm install --no-audit --no-fund --loglevel=error; fi
fi
