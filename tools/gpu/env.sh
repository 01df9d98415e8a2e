# Sourced by the tools/gpu/ scripts on the GPU machine: the environment every run needs.
# NVLink multicast stays off (it can take the host's GPUs down); NCCL is the pip wheel's
# 2.28.9, matching the headers weft was built with (the system one is 2.28.3).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
NCCL_LIB=$(python3 -c 'import nvidia.nccl as m; print(m.__path__[0])')/lib
export LD_LIBRARY_PATH=$NCCL_LIB:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/weft-out}
mkdir -p "$OUT"
step() { echo; echo "=== $*"; }
