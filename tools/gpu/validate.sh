#!/usr/bin/env bash
# One device call that checks a change on 2 GPUs: every GPU test of the AFTER build,
# compute-sanitizer memcheck of the ops' GPU tests, then the AFTER build's benches against the
# BEFORE build's, alternating (tools/gpu/trees_ab.sh). Binaries may be carried xz-compressed
# (NAME.xz; the 64 MiB limit on what a call carries): they are unpacked first.
#   here:   bash tools/gpu/build.sh && bash tools/gpu/pack.sh .gpu        (and the BEFORE tree's into .gpu-before)
#   device: bash tools/gpu/validate.sh .gpu-before .gpu      (kind nvidia-h100-x2 or nvidia-h200-x2; carry both)
# Environment: SKIP_TESTS=1, SKIP_MEMCHECK=1, SKIP_AB=1 leave steps out; OPS and ROUNDS go to trees_ab.sh.
set -uo pipefail
BEFORE=${1:?BEFORE bin dir}
AFTER=${2:?AFTER bin dir}
source "$(dirname "$0")/env.sh"
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-15000}
unpack() {  # DIR: NAME.xz -> /tmp/weft-bin/DIR/NAME
  local d=/tmp/weft-bin/$(basename "$1")
  mkdir -p "$d"
  for f in "$1"/*; do
    case "$f" in
      *.xz) python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' "$f" "$d/$(basename "${f%.xz}")" ;;
      *) cp "$f" "$d/" ;;
    esac
  done
  chmod +x "$d"/*
  echo "$d"
}
B=$(unpack "$BEFORE")
A=$(unpack "$AFTER")
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  step "every GPU test (1 and 2 GPUs), AFTER build"
  WEFT_TEST_PROGRESS=$OUT/progress timeout -s KILL 300 "$A/weft_gpu_tests" > "$OUT/gpu_tests.log" 2>&1 || status=1
  pkill -9 -x weft_gpu_tests 2>/dev/null || true
  grep -E "^\[ *(FAILED|PASSED|SKIPPED)|\[gpu\]|Failure|tests? from .* ran" "$OUT/gpu_tests.log" | head -40
fi
if [ "${SKIP_MEMCHECK:-0}" != 1 ]; then
  step "compute-sanitizer memcheck (GEMM+communication, collectives in graphs, GEMM hooks), AFTER build"
  WEFT_GEMM_TUNE=0 WEFT_TEST_TIMEOUT_MS=200000 WEFT_TIMEOUT_MS=200000 timeout -s KILL "${MEMCHECK_TIMEOUT:-240}" \
    compute-sanitizer --tool memcheck --report-api-errors no --target-processes all "$A/weft_gpu_tests" \
    --gtest_filter="${MEMCHECK_FILTER:-*GemmOverlapGpu.*:CollectivesGpuGraph.*:GemmGpu.Waits*:GemmGpu.Sources*}" \
    > "$OUT/memcheck.log" 2>&1 || status=1
  pkill -9 -x weft_gpu_tests 2>/dev/null || true
  grep -E "ERROR SUMMARY|^\[ *(PASSED|FAILED)|tests? from .* ran" "$OUT/memcheck.log" | head -8
fi
if [ "${SKIP_AB:-0}" != 1 ]; then
  bash "$(dirname "$0")/trees_ab.sh" "$B" "$A" || status=1
else
  tar czf /tmp/weft-validate.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/weft-validate.tgz "$OUT/"
fi
exit $status
