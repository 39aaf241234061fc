#!/usr/bin/env bash
# Issue 8 on a GPU machine, as one command from the repository root, inside 10 minutes:
#   bash benchmarks/device/run_all.sh
# 1. installs the carried wheels (.whl/, made by benchmarks/device/prepare.sh) into /tmp/site;
# 2. runs the Triton kernel and CUDA-graph tests on the GPU (compiled, not interpreted);
# 3. runs benchmarks/device_bench.py (embedded-size model, Llama 1B and 8B configs, bf16)
#    with a deadline that ends it before the 10-minute limit.
# Results under $OUT (default ./device-out): env.txt, tests.log, bench.log, device_bench.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-device-out}
LIMIT_S=${LIMIT_S:-570}  # what this script may use of the device tool's 600 s
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
PY=${PY:-python3}

if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || echo "WARNING: wheel install failed" >&2
  export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv || true
  $PY -c "import sys, torch, triton; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda,
'triton', triton.__version__, torch.cuda.get_device_name(0))"
  $PY -c "import gguf; print('gguf', gguf.__version__ if hasattr(gguf, '__version__') else 'ok')" || echo "gguf missing: GPU graph test will fail"
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# Kernel tests on the GPU: first use compiles each kernel variant (about 1 s each).
echo "== tests =="
timeout 200 $PY -m pytest -q -p no:cacheprovider --durations=8 \
  tests/test_triton_kernels.py tests/test_cuda_graphs.py 2>&1 | tee "$OUT/tests.log"
echo "tests exit: ${PIPESTATUS[0]}" | tee -a "$OUT/tests.log"

left=$((LIMIT_S - SECONDS))
echo "== device_bench ($left s left) =="
# The bench stops starting phases at --deadline-s; the timeout is the backstop.
timeout $((left - 5)) $PY benchmarks/device_bench.py --out "$OUT" --deadline-s $((left - 45)) "$@" 2>&1 \
  | tee "$OUT/bench.log"
echo "bench exit: ${PIPESTATUS[0]}; total ${SECONDS} s" | tee -a "$OUT/bench.log"
