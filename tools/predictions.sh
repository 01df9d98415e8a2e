#!/usr/bin/env bash
# The cost model's predictions for WORLD GPUs of one node, for every op that has a model, as
# Markdown: the figures to check when a WORLD-GPU kind is lent (issue 27 for 8). CPU only:
# `weft plan` and `weft simulate` need no GPU; every number is the CLI's.
#
#   bash tools/predictions.sh build/weft 8 > bench/results/predictions-8-gpus-DATE.md
#
# Shapes: those of the newest recorded 4-GPU runs (bench/results), so that the 4-GPU
# measurements, the model's 4-GPU check (tools/model_check.py) and these predictions line up.
set -euo pipefail
weft=${1:?usage: tools/predictions.sh WEFT WORLD}
world=${2:?usage: tools/predictions.sh WEFT WORLD}
root=$(cd "$(dirname "$0")/.." && pwd)
results=$root/bench/results
[[ -x $weft ]] || { echo "predictions.sh: $weft is not an executable weft CLI" >&2; exit 2; }
[[ $world =~ ^[1-9][0-9]*$ ]] || { echo "predictions.sh: WORLD $world: expected a positive rank count" >&2; exit 2; }

newest() {  # the last file (by name: names carry the date) matching the pattern, or nothing
  local f
  f=$(compgen -G "$results/$1" | sort | tail -1 || true)
  [[ -n $f ]] && echo "$f"
}

files=()
for pattern in 'ag_gemm-nccl-4r-*.json' 'gemm_rs-nccl-4r-*.json' 'gemm_ar-nccl-4r-*.json' \
  'ag_gemm-random12-nccl-4r-*.json' 'gemm_rs-random12-nccl-4r-*.json' 'gemm_ar-random12-nccl-4r-*.json' \
  'gemv_ar-4gpu-h200-*.json'; do
  if f=$(newest "$pattern"); then files+=("$f"); fi
done

echo "# Cost-model predictions for $world GPUs of one node"
echo
echo "Commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%dT%H:%MZ); the"
echo "CLI's default device constants (bench/constants/h200x2.json). Predictions, not runs. Reproduce:"
echo "\`bash tools/predictions.sh WEFT $world\` (WEFT: any build's CLI)."
echo
echo "## Collectives (weft's methods)"
echo
python3 "$root/tools/calibrate_collectives.py" "$weft" --predict-world "$world" --wide-cap 128
echo
echo "## GEMM + communication and GEMV + all-reduce"
echo
echo "Per shape the model's baseline (NCCL + cuBLAS: its GEMM and its collective), decomposed (at"
echo "the chunk count it picks), fused where modelled, and what \`auto\` picks."
echo
python3 "$root/tools/model_check.py" "$weft" --predict-world "$world" "${files[@]}"
echo
measured=()
for op in ag_gemm gemm_rs gemm_ar; do
  if f=$(newest "$op-nccl-${world}r-*.json"); then measured+=("$f"); fi
done
if ((${#measured[@]})); then
  echo "## The model now against the newest recorded $world-GPU runs"
  echo
  echo "Measured columns from runs of the code of their date (see each file's commit); \`auto now\`: what"
  echo "the model picks today, with the measured time of that method in the run."
  echo
  python3 "$root/tools/model_check.py" "$weft" "${measured[@]}"
  echo
fi
echo "## Embedding-bag lookups + all-to-all (a DLRM iteration)"
echo
echo '```'
"$weft" simulate --model dlrm --nodes 1 --gpus "$world"
echo '```'
echo
echo "## Mixture-of-experts"
echo
echo "No cost model: \`auto\` is the direct exchange up to kMoeDirectMaxWorld ranks (32) and the fused"
echo "layer on GPUs, rules from the 2- and 4-GPU measurements (docs/moe.md); nothing to predict."
