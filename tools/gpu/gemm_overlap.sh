#!/usr/bin/env bash
# The GEMM + communication ops (issue 6) on the device machine, in one call of the device tool:
#   here:        bash tools/gpu/build.sh                       (builds .gpu/weft and .gpu/weft_gpu_tests)
#   device run:  bash tools/gpu/gemm_overlap.sh .gpu [all|tests|bench]     (carry .gpu)
# GPU tests of the ops (every method vs the CPU reference, graph replays, traces), then
# `weft bench ag_gemm|gemm_rs|gemm_ar` with one traced call per method, then PyTorch's fused
# ops on the same shapes (bench/torch_symm_mem_peer.py). Logs, JSON, traces, PNGs in $OUT.
set -uo pipefail
BIN=${1:-.gpu}
ONLY=${2:-all}
source "$(dirname "$0")/env.sh"
# weft links cuBLAS dynamically: add the pip wheel's libcublas (PyTorch's) when the system
# has none on the loader path.
CUBLAS_DIR=$(python3 - <<'PY' 2>/dev/null
import glob, os, site
for d in site.getsitepackages():
    for p in glob.glob(os.path.join(d, "nvidia", "**", "libcublas.so.*"), recursive=True):
        print(os.path.dirname(p)); raise SystemExit
PY
)
[ -n "$CUBLAS_DIR" ] && export LD_LIBRARY_PATH=$CUBLAS_DIR:$LD_LIBRARY_PATH
status=0

if [ "$ONLY" != bench ]; then
  step "GPU tests (gemm_overlap)"
  "$BIN/weft_gpu_tests" --gtest_filter='*GemmOverlap*' 2>&1 | tee "$OUT/gemm_overlap_tests.log" |
    grep -E "^\[ *(OK|FAILED|PASSED)|\[gpu\]|Failure|hidden|rank " || status=1
  grep -q "FAILED" "$OUT/gemm_overlap_tests.log" && status=1
fi
if [ "$ONLY" != tests ]; then
  for op in ag_gemm gemm_rs gemm_ar; do
    step "weft bench $op"
    "$BIN/weft" bench "$op" --out "$OUT" --trace-dir "$OUT/traces" 2>"$OUT/bench_${op}_progress.log" |
      tee "$OUT/bench_$op.log" || status=1
    tail -4 "$OUT/bench_${op}_progress.log"
  done
  step "traces"
  for t in "$OUT"/traces/*.json; do
    [ -e "$t" ] || continue
    echo "--- $(basename "$t")"
    "$BIN/weft" trace "$t" --png "${t%.json}.png" | tail -2
  done
  step "PyTorch peer (torch.ops.symm_mem fused ops, 2 ranks)"
  torchrun --nproc-per-node 2 bench/torch_symm_mem_peer.py --out "$OUT/torch-symm-mem-2r.json" 2>&1 |
    tee "$OUT/torch_peer.log" | grep -vE "^\[peer\]" || status=1
fi
exit $status
