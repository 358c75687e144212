// Asynchronous 16-byte copies from global to shared memory (cp.async, sm_80 and later). A thread issues the loads
// of several future work items without holding their bytes in registers, so the bytes in flight per SM no longer
// depend on the kernel's register count: the way a register-hungry kernel still keeps DRAM busy.
#pragma once

#include <cuda_runtime.h>

namespace tapegrad::cuda {

// Starts copying 16 bytes from `from` (global, 16-byte aligned) to `to` (shared, 16-byte aligned).
__device__ __forceinline__ void copy_16_async(void* to, const void* from) {
  const unsigned shared_address = static_cast<unsigned>(__cvta_generic_to_shared(to));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address), "l"(from) : "memory");
}

// Closes the group of copies issued since the last commit (an empty group when there were none).
__device__ __forceinline__ void commit_async_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most `Pending` of this thread's most recent groups are still in flight; the bytes of the older
// groups are then visible to this thread.
template <int Pending> __device__ __forceinline__ void wait_async_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

}  // namespace tapegrad::cuda
