#!/usr/bin/env bash
# Builds llama.cpp's OpenAI-compatible server (`llama-server`) outside the repository, for
# compare.py's `llamacpp` system. The source is the llama.cpp that the PyPI sdist of
# llama-cpp-python vendors in full (tools/server included), so a machine that reaches only
# PyPI builds it too; with GitHub at hand, a clone of ggml-org/llama.cpp at any tag works the same
# (LLAMACPP_SRC=that clone).
#
#   benchmarks/peers/setup_llamacpp.sh        # -> ~/.cache/inflight-peers/llama.cpp/build/bin/llama-server
#
# Environment: LLAMACPP_DIR (where the source and build go), LLAMACPP_PY_VERSION (the sdist whose
# vendored llama.cpp is built; default 0.3.36), LLAMACPP_SRC (a llama.cpp source tree to build
# instead), JOBS (parallel compile jobs). Needs cmake, gcc and g++.
set -euo pipefail

LLAMACPP_DIR="${LLAMACPP_DIR:-$HOME/.cache/inflight-peers/llama.cpp}"
LLAMACPP_PY_VERSION="${LLAMACPP_PY_VERSION:-0.3.36}"
JOBS="${JOBS:-$(nproc)}"

if [ -z "${LLAMACPP_SRC:-}" ]; then
    LLAMACPP_SRC="$LLAMACPP_DIR/src"
    if [ ! -f "$LLAMACPP_SRC/CMakeLists.txt" ]; then
        tmp="$(mktemp -d)"
        python3 -m pip download --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$LLAMACPP_PY_VERSION"
        tar xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
        mkdir -p "$LLAMACPP_DIR"
        rm -rf "$LLAMACPP_SRC"
        mv "$tmp"/llama_cpp_python-*/vendor/llama.cpp "$LLAMACPP_SRC"
        rm -rf "$tmp"
    fi
fi

# GGML_NATIVE: -march=native, so the build uses every vector unit of this CPU (AVX2, AVX-512,
# AVX-512-BF16, VNNI), as a user building it for their own machine gets. Except AMX: this
# llama.cpp's AMX kernels die of SIGILL at the first tile instruction on a Linux that grants
# the tiles per thread (its worker threads never ask; ggml-org/llama.cpp PR #26954), so on a CPU
# with AMX the build leaves the tiles out (GCC keeps an explicit -mno-* over -march=native) and
# runs its AVX-512 VNNI kernels. LLAMACPP_AMX=1 builds them anyway. No web UI (its prebuilt
# assets are downloaded from Hugging Face), no TLS, no tests or examples.
flags=""
if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null && [ "${LLAMACPP_AMX:-0}" != 1 ]; then
    flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
cmake -S "$LLAMACPP_SRC" -B "$LLAMACPP_DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
cmake --build "$LLAMACPP_DIR/build" --target llama-server -j "$JOBS"
"$LLAMACPP_DIR/build/bin/llama-server" --version
echo "llama-server ready: $LLAMACPP_DIR/build/bin/llama-server"
