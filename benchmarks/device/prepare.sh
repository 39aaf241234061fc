#!/usr/bin/env bash
# Run HERE (where PyPI is reachable), once, before calling the device tool with carry [".whl"]:
# fetches the wheels the GPU image lacks for Python 3.12 into .whl/ (git-ignored locally).
# The image already has torch, triton, transformers, tokenizers, numpy, pytest (see
# /work/.library/device/KINDS.md); only gguf (for the tiny-GGUF CUDA-graph test) is missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl "gguf==0.19.0"
ls -la .whl
