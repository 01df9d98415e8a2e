#!/usr/bin/env bash
# Embedding-bag lookups + all-to-all (issue 24) on the device machine, in one call of the device tool:
#   here:        bash tools/gpu/build.sh && bash tools/gpu/pack.sh .gpu
#   device run:  bash tools/gpu/embedding.sh .gpu          (carry .gpu)
# The C++ GPU tests of ops::EmbeddingA2A (1 and all GPUs; SKIP_TESTS=1: none; MEMCHECK=1: also
# under compute-sanitizer memcheck, MEMCHECK_FILTER to choose), `weft bench embedding_a2a` on the
# first 2, then 4 GPUs (WORLDS; JSON in $OUT/results; BENCH_ARGS, e.g. "--shapes dlrm --ms 4096"),
# then the PyTorch path on the same workload (tools/gpu/embedding_peer.sh) unless SKIP_PEER=1.
# Logs in $OUT; the tables last.
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/env.sh"
unpack_to embedding
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-30000}
status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  step "C++ GPU tests (embedding_a2a)"
  timeout -s KILL 300 "$d/weft_gpu_tests" --gtest_filter='*EmbeddingA2A*' > "$OUT/embedding_tests.log" 2>&1 || status=1
  pkill -9 -x weft_gpu_tests 2>/dev/null || true
  grep -E "^\[ *(OK|FAILED|PASSED|SKIPPED)|tests? from .* ran|Failure|checks passed|rank [0-9]+:" \
    "$OUT/embedding_tests.log" | head -40
fi
if [ "${MEMCHECK:-0}" = 1 ]; then
  mfilter=${MEMCHECK_FILTER:-'*EmbeddingA2AGpu.*/0:EmbeddingA2AGpuGraph.*:EmbeddingA2AGpuErrors.*'}
  step "compute-sanitizer memcheck: $mfilter"
  WEFT_TEST_TIMEOUT_MS=120000 timeout -s KILL 300 compute-sanitizer --tool memcheck --report-api-errors no \
    --target-processes all "$d/weft_gpu_tests" --gtest_filter="$mfilter" > "$OUT/embedding_memcheck.log" 2>&1 ||
    status=1
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/embedding_memcheck.log" | head -10
fi
NGPU=$(nvidia-smi -L | wc -l)
for n in ${WORLDS:-2 4}; do
  [ "$n" -le "$NGPU" ] 2>/dev/null || continue  # WORLDS=none: no bench
  step "weft bench embedding_a2a on $n GPUs"
  mkdir -p "$OUT/results"
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) timeout -s KILL "${BENCH_LIMIT:-300}" "$d/weft" bench embedding_a2a \
    --out "$OUT/results" ${BENCH_ARGS:-} > "$OUT/bench_embedding_${n}.log" \
    2> "$OUT/bench_embedding_progress_${n}.log" || status=1
  tail -3 "$OUT/bench_embedding_progress_${n}.log"
  grep -v "^wrote" "$OUT/bench_embedding_${n}.log"
done
[ "${SKIP_PEER:-0}" = 1 ] || bash "$(dirname "$0")/embedding_peer.sh" || status=1
exit $status
