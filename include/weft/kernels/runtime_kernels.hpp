// Launchers of the runtime's own small kernels (framework-free: raw values and a stream
// in, status out). Defined in src/kernels/runtime_kernels.cu; host logic stays in .cpp.
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include "weft/device/barrier.hpp"
#include "weft/device/ctx.hpp"

namespace weft::kernels {

// out[p] = peer p's base of `win` as this GPU addresses it (p < world).
cudaError_t lsa_bases(ncclWindow_t win, int world, char** out, cudaStream_t stream);
// Writes ((rank+1) << 32 | p) into slot `rank` (8 bytes each) of every peer p's heap.
cudaError_t symmetry_write(const dev::DeviceCtx& c, cudaStream_t stream);
// One thread per rank runs dev::barrier: lines GPUs up before a timed region.
cudaError_t device_barrier(const dev::DeviceCtx& c, dev::BarrierHandle bar, cudaStream_t stream);
// Loads kernels now (cudaFuncGetAttributes on each). With lazy module loading a kernel's
// first launch loads it, and a load can wait behind a kernel already spinning on the device --
// a spinning GEMM waiting for what this launch would deliver: a deadlock (seen on 2 H200s,
// 2026-11-22: the fused gemm_rs's first call). Ops whose kernels spin preload what they use.
cudaError_t load_kernels(const void* const* fns, size_t n);
// This file's barrier and sleep kernels, loaded now (load_kernels).
cudaError_t runtime_preload();

// Whether kernels that support programmatic dependent launch (the collectives, weft's GEMMs
// without waits; device side: weft/device/ptx/launch_control.cuh) are launched with it:
// WEFT_PDL=0 turns it off (A/B measurements).
bool pdl_enabled();

// Keeps the stream busy for about `ns` nanoseconds (one thread): lets the host enqueue what
// follows before the GPU reaches it, so launch latency stays out of timed regions.
cudaError_t device_sleep(uint64_t ns, cudaStream_t stream);

// The SMs of `device` (-1: the current one); 1 where they cannot be read. Grids sized "per SM"
// take it.
int sm_count(int device = -1);

}  // namespace weft::kernels
