#!/usr/bin/env bash
# The PyTorch MoE layer (bench/torch_moe_peer.py: dispatch, grouped experts, combine, eager) on
# the first 2 GPUs, then on 4 where the machine has them, in one call of the device tool (no
# weft binaries needed):
#   device run: bash tools/gpu/moe_peer.sh
# Environment: WORLDS (default "2 4", counts above the machine's GPUs skipped), PEER_ARGS (e.g.
# "--shapes mixtral --tokens 128"), PEER_LIMIT (seconds per world). JSON and logs in $OUT; the
# tables last.
set -uo pipefail
source "$(dirname "$0")/env.sh"
export PYTHONUNBUFFERED=1
NGPU=$(nvidia-smi -L | wc -l)
status=0
for n in ${WORLDS:-2 4}; do
  [ "$n" -le "$NGPU" ] || continue
  export CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1)))
  step "PyTorch MoE layer on $n GPUs"
  timeout -s KILL "${PEER_LIMIT:-280}" torchrun --standalone --nproc-per-node "$n" bench/torch_moe_peer.py \
    --out "$OUT/torch-moe-${n}r.json" ${PEER_ARGS:-} > "$OUT/torch_moe_peer_${n}.log" 2>&1 || status=1
  grep -vE "^\[peer\]|Warning|warn\(" "$OUT/torch_moe_peer_${n}.log" | tail -12
done
exit $status
