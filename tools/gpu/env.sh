# Sourced by the tools/gpu/ scripts on the GPU machine: the environment every run needs.
# NVLink multicast stays off (it can take the host's GPUs down); NCCL is the pip wheel's
# 2.28.9, matching the headers weft was built with (the system one is 2.28.3).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# cuBLAS (the baselines, linked dynamically: libcublas.so.13) from the nvidia-cublas wheel.
NCCL_LIB=$(python3 -c 'import nvidia.nccl as m; print(m.__path__[0])')/lib
CUBLAS_LIB=$(dirname "$( (ldconfig -p | awk '/libcublas\.so\.13 /{print $NF}'; ls /usr/local/cuda*/lib64/libcublas.so.13 \
  2>/dev/null; find $(python3 -c 'import site; print(" ".join(site.getsitepackages()))') -name 'libcublas.so.13' \
  2>/dev/null) | head -1)")
export LD_LIBRARY_PATH=$NCCL_LIB:$CUBLAS_LIB:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/weft-out}
mkdir -p "$OUT"
step() { echo; echo "=== $*"; }
# The binaries of SRC (pack.sh compresses them as .xz; plain files are copied) into DEST, runnable.
unpack_bin() {
  mkdir -p "$2"
  for f in "$1"/*; do
    case "$f" in
      *.xz) python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' "$f" "$2/$(basename "${f%.xz}")" ;;
      *) cp "$f" "$2/" ;;
    esac
  done
  chmod +x "$2"/*
}
# A script's own binaries: $BIN unpacked into /tmp/weft-bin/NAME, that folder as $d.
unpack_to() {
  d=/tmp/weft-bin/$1
  unpack_bin "$BIN" "$d"
}
# The GEMM+communication GPU tests (exact on 1 and 2 GPUs, graph replays, back-to-back calls),
# log in $OUT/gpu_tests_overlap.log; the outcome lines printed.
overlap_tests() {
  step "GEMM+communication GPU tests"
  WEFT_TEST_PROGRESS=$OUT/progress timeout -s KILL 240 "$BIN/weft_gpu_tests" --gtest_filter='*GemmOverlap*' \
    > "$OUT/gpu_tests_overlap.log" 2>&1
  pkill -9 -x weft_gpu_tests 2>/dev/null || true  # ranks of a killed run must not hold the GPUs
  grep -E "^\[ *(FAILED|PASSED)|\[gpu\]|Failure|rror" "$OUT/gpu_tests_overlap.log" | grep -v "gemm random" | head -30
}
