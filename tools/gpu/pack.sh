#!/usr/bin/env bash
# Compresses the GPU binaries of DIR (default .gpu) in place (NAME -> NAME.xz, stripped) so that
# two builds fit in what one device call carries; tools/gpu/validate.sh unpacks them there.
set -euo pipefail
DIR=${1:-.gpu}
for f in "$DIR"/*; do
  case "$f" in *.xz) continue ;; esac
  strip "$f"
  xz -T2 -3 -f "$f"
done
du -sh "$DIR"
