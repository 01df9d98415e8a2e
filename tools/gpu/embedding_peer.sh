#!/usr/bin/env bash
# The PyTorch path of embedding-bag lookups + all-to-all (bench/torch_embedding_peer.py: nn.EmbeddingBag
# lookups, all_to_all_single, the re-layout; CUDA graphs; weft bench embedding_a2a's workload) on the
# first 2 GPUs, then on 4 where the machine has them, in one call of the device tool (no weft
# binaries needed; tools/gpu/embedding.sh runs it after the weft bench):
#   device run: bash tools/gpu/embedding_peer.sh
# Environment: WORLDS (default "2 4", counts above the machine's GPUs skipped), PEER_ARGS (e.g.
# "--shapes dlrm --batch 4096"), PEER_LIMIT (seconds per world, default 360: the backward column at
# 65536 samples takes most of it). JSON and logs in $OUT; the
# tables last.
set -uo pipefail
source "$(dirname "$0")/env.sh"
export PYTHONUNBUFFERED=1
NGPU=$(nvidia-smi -L | wc -l)
status=0
for n in ${WORLDS:-2 4}; do
  [ "$n" -le "$NGPU" ] || continue
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1)))
  export CUDA_VISIBLE_DEVICES
  step "PyTorch embedding-bag lookups + all-to-all on $n GPUs"
  # shellcheck disable=SC2086  # PEER_ARGS: words, split on purpose
  timeout -s KILL "${PEER_LIMIT:-360}" torchrun --standalone --nproc-per-node "$n" bench/torch_embedding_peer.py \
    --out "$OUT/torch-embedding-${n}r.json" ${PEER_ARGS:-} > "$OUT/torch_embedding_peer_${n}.log" 2>&1 || status=1
  grep -vE "^\[peer\]|Warning|warn\(" "$OUT/torch_embedding_peer_${n}.log" | tail -30
done
exit $status
