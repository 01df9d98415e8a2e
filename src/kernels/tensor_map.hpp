// Host side of TMA: 2-D tensor maps over row-major matrices of 16-bit elements
// (cuTensorMapEncodeTiled, through the runtime's driver entry point: no -lcuda). Used by the
// sm_90a kernels (gemm_sm90.cu, gemv_ar_kernels.cu).
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace weft::kernels::tma {

inline PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// 2-D tensor map over a row-major [rows, cols] matrix (ld elements between rows) of 16-bit
// elements, box [box_rows, box_cols], 128-byte swizzle by default. Boxes reaching past the
// matrix read zeros there (and count their full bytes on the mbarrier). False: refused (the
// base 16-byte aligned, ld * 2 a multiple of 16, box_cols * 2 <= the swizzle span).
inline bool make_map(CUtensorMap* map, CUtensorMapDataType type, const void* base, int64_t rows, int64_t cols,
                     int64_t ld, int box_rows, int box_cols,
                     CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  auto fn = encode_fn();
  if (!fn) return false;
  return fn(map, type, 2, const_cast<void*>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace weft::kernels::tma
