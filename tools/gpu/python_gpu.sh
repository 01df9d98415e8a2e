#!/usr/bin/env bash
# The PyTorch frontend on the GPUs of one machine, in one device call: the C++ GPU tests
# (optional), the Python GPU tests (every torch.ops.weft op eagerly, in a CUDA graph and under
# torch.compile; symmetric tensors; the MLP block's modules), then the TP MLP benchmark against
# PyTorch eager + NCCL and PyTorch's async TP. Uses the machine's PyTorch; pytest travels as
# wheels (.whl), the library as .gpu/libweft_c.so (tools/gpu/build.sh; pack.sh compresses).
#   here:   bash tools/gpu/build.sh && bash tools/gpu/pack.sh .gpu
#           (and the pytest wheels into .whl: see the device README)
#   device: bash tools/gpu/python_gpu.sh .gpu     (carry .gpu and .whl)
# Environment: SKIP_CPP_TESTS=1, SKIP_PYTEST=1, SKIP_BENCH=1; CPP_FILTER (a gtest filter); PYTEST_FILES
# (default tests/python/test_torch_gpu.py); PYTEST_ARGS (e.g. "-k moe");
# BENCH_ARGS (e.g. "--seqs 4096"); WORLDS (e.g. "2 4": the benchmark on the first 2, then 4 GPUs).
set -uo pipefail
BIN=${1:?bin dir}
source "$(dirname "$0")/env.sh"
d=/tmp/weft-bin/py
mkdir -p "$d"
for f in "$BIN"/*; do
  case "$f" in
    *.xz) python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' "$f" "$d/$(basename "${f%.xz}")" ;;
    *) cp "$f" "$d/" ;;
  esac
done
chmod +x "$d"/*
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} WEFT_LIBRARY=$d/libweft_c.so PYTHONUNBUFFERED=1
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-30000}
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
NGPU=$(nvidia-smi -L | wc -l)
status=0
if [ "${SKIP_CPP_TESTS:-0}" != 1 ]; then
  step "every C++ GPU test"
  timeout -s KILL 300 "$d/weft_gpu_tests" --gtest_filter="${CPP_FILTER:-*}" > "$OUT/gpu_tests.log" 2>&1 || status=1
  pkill -9 -x weft_gpu_tests 2>/dev/null || true
  grep -E "^\[ *(FAILED|PASSED|SKIPPED)|tests? from .* ran|fault test" "$OUT/gpu_tests.log" | head -20
fi
if [ "${SKIP_PYTEST:-0}" != 1 ]; then
  step "Python GPU tests (tests/python/test_torch_gpu.py)"
  timeout -s KILL 420 python3 -m pytest -q -x ${PYTEST_FILES:-tests/python/test_torch_gpu.py} ${PYTEST_ARGS:-} > "$OUT/pytest_gpu.log" 2>&1 || status=1
  tail -25 "$OUT/pytest_gpu.log"
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  # WORLDS: the GPU counts to run the benchmark on (the first N GPUs each; default: all).
  for n in ${WORLDS:-$NGPU}; do
    step "TP MLP block on $n GPUs: weft vs PyTorch eager + NCCL vs async TP"
    mkdir -p "$OUT/mlp"
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) timeout -s KILL "${BENCH_LIMIT:-300}" \
      torchrun --standalone --nproc-per-node "$n" -m weft.torch.bench mlp --out "$OUT/mlp" ${BENCH_ARGS:-} \
      > "$OUT/mlp/bench-${n}gpu.log" 2>&1 || status=1
    tail -30 "$OUT/mlp/bench-${n}gpu.log"
  done
fi
exit $status
