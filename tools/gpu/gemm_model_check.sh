#!/usr/bin/env bash
# The cost model's library GEMM (plan::gemm_us) against cuBLAS on shapes it was not fitted on,
# in one call of the device tool (one GPU is enough):
#   here:        bash tools/gpu/build.sh && bash tools/gpu/pack.sh .gpu
#   device run:  bash tools/gpu/gemm_model_check.sh .gpu                    (carry .gpu)
#   here, after: python3 tools/model_check.py build/weft FILES/results/gemm-*.json
# `weft bench gemm --quick` (bf16, W[N,K], random data, cuBLAS beside weft's GEMM) on SHAPES:
# by default the GEMMs a rank runs on 8 GPUs for gemm_rs / gemm_ar at the benchmark shapes
# (K/8), the one random-12 shape aligned there, and 25 more drawn once (seed 7; M, N multiples of
# 16 in 256 ... 8192, K 128 ... 4096). JSON in $OUT/results; the bench's table last.
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/env.sh"
unpack_to gemm_model
SHAPES=${SHAPES:-8192x1024x14336,4096x1024x8192,16384x1024x3584,2048x512x4096,7200x216x1504,2896x384x8016,\
3488x128x5584,848x3072x6976,1024x4096x3248,720x3072x7696,2000x256x560,3808x256x3680,2224x3072x992,3728x4096x736,\
1264x512x8016,5408x4096x5392,8016x4096x752,5040x128x3504,2064x3072x624,7280x768x1344,3680x3072x1424,1216x768x4928,\
4832x384x6928,1088x4096x5008,5488x1024x1792,1040x256x4736,4864x4096x736,1936x3072x4320,3744x1024x6608,4064x2048x5040}
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | head -1
step "weft bench gemm --quick on $(tr -cd , <<< "$SHAPES" | wc -c | awk '{print $1 + 1}') shapes"
mkdir -p "$OUT/results"
timeout -s KILL "${BENCH_LIMIT:-420}" "$d/weft" bench gemm --quick --shapes "$SHAPES" --out "$OUT/results" \
  > "$OUT/bench_gemm.log" 2>&1
status=$?
tail -40 "$OUT/bench_gemm.log"
exit $status
