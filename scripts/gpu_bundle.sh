#!/usr/bin/env bash
# gpu_bundle.sh — prepares, on the development machine, what scripts/gpu_check.sh needs on a lent
# GPU machine that can build nothing kiln needs: that machine (docs/VULKAN.md "Running on a lent
# GPU") has a compiler but none of kiln's -dev libraries (jansson, PCRE2, ICU, libmicrohttpd,
# xxHash, cmocka), no glslc, perhaps no Vulkan loader, no package registry and no ../shared.
#   bash scripts/gpu_bundle.sh [SHARED_DIR]      (SHARED_DIR: ../shared by default)
# writes .gpu/kiln-gpu.tar.xz (ignored by git; name .gpu in the device tool's `carry`; xz because
# the device tool carries at most 64 MiB and ICU's data alone is 30 MB), holding:
#   kiln, tests/ops/test_backend_ops   built here without MPI (one process on the GPU machine),
#                                      stripped; every ISA chosen at run time, so they run on
#                                      whatever x86-64 CPU the GPU machine has
#   lib/                               every shared library they load that glibc does not provide,
#                                      and the Vulkan loader (libvulkan.so.1, opened at run time)
#   shared/                            the models the device tests read (stories260K with llama2.c's
#                                      outputs, tiny-dsv3)
#   kiln-base                          with GPU_BUNDLE_BASE=<commit>: that commit's kiln, built the
#                                      same way in a temporary worktree, for gpu_check's side-by-side
#                                      decode of the new binary against an old one (bench_base_ab)
# gpu_check.sh unpacks it when it is there (into $GPU_BUNDLE_DIR, /tmp/kiln-gpu by default), runs
# those binaries with LD_LIBRARY_PATH=lib and builds nothing.
# The binaries need glibc 2.34 or later (checked below and printed).
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${1:-${SHARED:-../shared}}
BUILD_DIR=build/gpu
B=$PWD/$BUILD_DIR/bundle
[ -f "$SHARED/models/stories260K/stories260K.bin" ] || { echo "gpu_bundle: no stories260K under $SHARED" >&2; exit 1; }
command -v glslc > /dev/null || { echo "gpu_bundle: glslc missing (bash scripts/install_deps.sh)" >&2; exit 1; }
# HAVE_MPI empty: the dist_absent.c build (no Open MPI libraries to carry)
make -j"$(nproc)" BUILD=$BUILD_DIR KILN_BIN=$BUILD_DIR/kiln HAVE_MPI= $BUILD_DIR/kiln $BUILD_DIR/tests/ops/test_backend_ops > /dev/null
"$BUILD_DIR/kiln" inspect --devices 2>&1 | grep -q "built without Vulkan" && { echo "gpu_bundle: this build has no Vulkan backend" >&2; exit 1; }

rm -rf "$B"
mkdir -p "$B/lib" "$B/tests/ops" "$B/shared/models"
strip -o "$B/kiln" "$BUILD_DIR/kiln"
strip -o "$B/tests/ops/test_backend_ops" "$BUILD_DIR/tests/ops/test_backend_ops"

# glibc's own libraries stay the GPU machine's (the binaries ask for at most the version below)
is_glibc() { case $(basename "$1") in ld-linux*|libc.so*|libm.so*|libmvec.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*) return 0 ;; esac; return 1; }
for bin in "$B/kiln" "$B/tests/ops/test_backend_ops"; do
    ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
        is_glibc "$lib" || cp -L "$lib" "$B/lib/"
    done
done
# (awk reads all of ldconfig's output: an early exit would fail the pipeline under pipefail)
loader=$(ldconfig -p | awk '$1 == "libvulkan.so.1" && /x86-64/ && !f {print $NF; f = 1}')
[ -n "$loader" ] || { echo "gpu_bundle: no libvulkan.so.1 here (libvulkan1)" >&2; exit 1; }
cp -L "$loader" "$B/lib/libvulkan.so.1"
# NVIDIA's Vulkan driver (libGLX_nvidia) is a GLVND vendor library: it loads libGLdispatch.so.0,
# which a machine without GLVND lacks
dispatch=$(ldconfig -p | awk '$1 == "libGLdispatch.so.0" && /x86-64/ && !f {print $NF; f = 1}')
if [ -n "$dispatch" ]; then cp -L "$dispatch" "$B/lib/libGLdispatch.so.0"; fi

cp -r "$SHARED/models/stories260K" "$SHARED/models/tiny-dsv3" "$B/shared/models/"

if [ -n "${GPU_BUNDLE_BASE:-}" ]; then
    base_tree=$(mktemp -d)/kiln-base
    git worktree add -q --detach "$base_tree" "$GPU_BUNDLE_BASE"
    (cd "$base_tree" && make -j"$(nproc)" BUILD=build/gpu KILN_BIN=build/gpu/kiln HAVE_MPI= build/gpu/kiln > /dev/null)
    strip -o "$B/kiln-base" "$base_tree/build/gpu/kiln"
    git worktree remove --force "$base_tree"
    echo "gpu_bundle: kiln-base is $(git rev-parse --short "$GPU_BUNDLE_BASE")"
fi

# every library the binaries load resolves inside the bundle or to glibc
for bin in "$B/kiln" "$B/tests/ops/test_backend_ops"; do
    missing=$(env LD_LIBRARY_PATH="$B/lib" ldd "$bin" | awk '$2 == "=>" && $3 == "not" {print $1}')
    [ -z "$missing" ] || { echo "gpu_bundle: $bin: unresolved $missing" >&2; exit 1; }
    env LD_LIBRARY_PATH="$B/lib" ldd "$bin" | awk '$2 == "=>" {print $3}' | while read -r lib; do
        case $lib in "$B"/lib/*) ;; *) is_glibc "$lib" || { echo "gpu_bundle: $bin loads $lib from outside the bundle" >&2; exit 1; } ;; esac
    done
done
glibc=$(objdump -T "$B/kiln" "$B/tests/ops/test_backend_ops" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
mkdir -p .gpu
tar -cJf .gpu/kiln-gpu.tar.xz -C "$B" .
echo "gpu_bundle: .gpu/kiln-gpu.tar.xz ready, $(du -h .gpu/kiln-gpu.tar.xz | cut -f1) ($(du -sh "$B" | cut -f1) unpacked), needs glibc ${glibc#GLIBC_} or later"
echo "  on the GPU machine: bash scripts/gpu_check.sh   (device tool: carry [\".gpu\"])"
