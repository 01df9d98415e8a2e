#!/usr/bin/env bash
# Issue 7's multi-GPU run on every GPU of the machine, in one device call (kinds
# nvidia-h200-x4 / nvidia-h200-x8; carry .gpu from tools/gpu/build.sh):
#   device: bash tools/gpu/xn.sh .gpu
# The multi-GPU tests on all ranks (each rank appends the call it is about to make to
# work/progress.<rank>: a cut-off run shows where it was), `weft bench ag_gemm|gemm_rs`, `weft bench collectives`
# (NCCL beside), gemm_ar, then PyTorch's fused ops. Time-boxed per step (T_TESTS, T_OP,
# T_COLL, T_TORCH seconds); the archive in $OUT is rewritten after every step, so a cut-off run
# still brings back what ran.
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/env.sh"
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-15000}
G=$(nvidia-smi -L | wc -l)
W=$OUT/work; mkdir -p "$W"
pack() { tar czf /tmp/xn.tgz -C "$W" . && mv /tmp/xn.tgz "$OUT/x${G}.tgz"; }
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
nvidia-smi topo -m > "$W/topo.txt" 2>&1; head -12 "$W/topo.txt"
step "GPU tests, multi-GPU suites (1 and $G GPUs)"
WEFT_TEST_PROGRESS=$W/progress timeout -s KILL ${T_TESTS:-300} "$BIN/weft_gpu_tests" --gtest_filter='*GemmOverlap*:*Collectives*:*Devapi*' \
  > "$W/gpu_tests_${G}gpu.log" 2>&1
pkill -9 -x weft_gpu_tests 2>/dev/null || true
grep -E "^\[ *(FAILED|PASSED)|\[gpu\].*ranks|Failure" "$W/gpu_tests_${G}gpu.log" | head -20; pack
bench_op() {
  step "weft bench $1 ($G GPUs)"
  timeout ${T_OP:-45} "$BIN/weft" bench "$1" --out "$W" > "$W/bench_$1_${G}gpu.log" 2>/dev/null
  grep -E "^MxKxN|^[0-9]+x" "$W/bench_$1_${G}gpu.log"; pack
}
bench_op ag_gemm
bench_op gemm_rs
step "weft bench collectives ($G GPUs)"
timeout ${T_COLL:-75} "$BIN/weft" bench collectives --out "$W" > "$W/bench_collectives_${G}gpu.log" 2>/dev/null
grep -E "^all_reduce|^all_gather|^reduce_scatter|^all_to_all" "$W/bench_collectives_${G}gpu.log" | head -40; pack
bench_op gemm_ar
step "PyTorch peer ($G ranks)"
timeout ${T_TORCH:-70} torchrun --nproc-per-node "$G" bench/torch_symm_mem_peer.py --out "$W/torch-symm-mem-${G}r.json" \
  > "$W/torch_peer_${G}gpu.log" 2>&1
grep -vE "^\[peer\]|^W[0-9]|warn|symm_mem.enable" "$W/torch_peer_${G}gpu.log" | tail -12; pack
