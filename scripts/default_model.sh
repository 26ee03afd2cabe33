#!/usr/bin/env bash
# Prints the path of the default model (stories260K): ../shared/models/stories260K when present,
# otherwise downloads the public originals (Karpathy's tinyllamas, MIT) into models/stories260K.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f ../shared/models/stories260K/stories260K.bin ]; then echo "../shared/models/stories260K"; exit 0; fi
dir=models/stories260K
mkdir -p "$dir"
base=https://huggingface.co/karpathy/tinyllamas/resolve/main/stories260K
for f in stories260K.bin tok512.bin; do
    [ -f "$dir/$f" ] || curl -fsSL -o "$dir/$f" "$base/$f" >&2
done
echo "$dir"
