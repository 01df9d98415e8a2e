// Programmatic dependent launch, device side (PTX ISA §9.7.13.9 griddepcontrol). A kernel
// launched with cudaLaunchAttributeProgrammaticStreamSerialization may start while the
// stream's previous kernel finishes; before touching memory that kernel may have written (or
// still reads) it waits for it to complete with its memory visible. Both instructions are
// no-ops in a kernel launched without the attribute. Host side: kernels::pdl_enabled().
#pragma once
#if defined(__CUDACC__)

namespace weft::ptx {

// Waits until every prerequisite grid has completed and its memory operations are visible.
__device__ __forceinline__ void griddepcontrol_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the stream's next (dependent) kernel be scheduled once every CTA of this grid has
// executed this or exited.
__device__ __forceinline__ void griddepcontrol_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace weft::ptx
#endif
