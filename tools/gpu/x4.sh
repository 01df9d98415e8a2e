#!/usr/bin/env bash
# Issue 7's 4-GPU run in one device call (kind nvidia-h200-x4, carry .gpu from tools/gpu/build.sh):
#   device: bash tools/gpu/x4.sh .gpu
# The multi-GPU tests on 4 ranks, `weft bench ag_gemm|gemm_rs|gemm_ar`, `weft bench
# collectives` (NCCL beside), then PyTorch's fused ops on 4 ranks. Time-boxed per step; the
# archive in $OUT is rewritten after every step, so a cut-off run still brings back what ran.
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/env.sh"
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-15000}
W=$OUT/work; mkdir -p "$W"
pack() { tar czf /tmp/x4.tgz -C "$W" . && mv /tmp/x4.tgz "$OUT/x4.tgz"; }
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
step "GPU tests, multi-GPU suites (1 and 4 GPUs)"
timeout ${T_TESTS:-100} "$BIN/weft_gpu_tests" --gtest_filter='*GemmOverlap*:*Collectives*:*Devapi*' > "$W/gpu_tests_4gpu.log" 2>&1
grep -E "^\[ *(FAILED|PASSED)|\[gpu\].*ranks|Failure" "$W/gpu_tests_4gpu.log" | head -20; pack
for op in ag_gemm gemm_rs gemm_ar; do
  step "weft bench $op (4 GPUs)"
  timeout ${T_OP:-45} "$BIN/weft" bench "$op" --out "$W" > "$W/bench_${op}_4gpu.log" 2>/dev/null
  grep -E "^MxKxN|^[0-9]+x" "$W/bench_${op}_4gpu.log"; pack
done
step "weft bench collectives (4 GPUs)"
timeout ${T_COLL:-75} "$BIN/weft" bench collectives --out "$W" > "$W/bench_collectives_4gpu.log" 2>/dev/null
grep -E "^all_reduce|^all_gather|^reduce_scatter|^all_to_all" "$W/bench_collectives_4gpu.log" | head -40; pack
step "PyTorch peer (4 ranks)"
timeout ${T_TORCH:-70} torchrun --nproc-per-node 4 bench/torch_symm_mem_peer.py --out "$W/torch-symm-mem-4r.json" \
  > "$W/torch_peer_4gpu.log" 2>&1
grep -vE "^\[peer\]|^W[0-9]|warn|symm_mem.enable" "$W/torch_peer_4gpu.log" | tail -12; pack
for m in nccl cuda; do
  step "PyTorch collectives peer (4 ranks, symmetric memory backend $m)"
  timeout ${T_TORCH_COLL:-120} torchrun --nproc-per-node 4 bench/torch_collectives_peer.py --symm $m \
    --out "$W/torch-collectives-$m-4r.json" > "$W/torch_coll_${m}_4gpu.log" 2>&1
  grep -vE "^\[peer\]|^W[0-9]|[Ww]arn|capture_end" "$W/torch_coll_${m}_4gpu.log" | tail -40; pack
done
