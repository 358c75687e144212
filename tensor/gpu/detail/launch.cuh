// What every kernel file shares: the storage and compute types of a dtype, conversions between them, dispatch
// from a runtime DType to a kernel template, and the launch context (device, stream, grid size).
//
// bf16 and f16 tensors hold Eigen's bfloat16/half on the host; on the device the same bits are read as CUDA's
// __nv_bfloat16/__half. The 16-bit types compute in f32, the others in themselves (as compute_t on the host).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "tapegrad/tensor/core/dtype_tag.hpp"
#include "tapegrad/tensor/gpu/detail/check.cuh"
#include "tapegrad/tensor/gpu/device.hpp"
#include "tapegrad/tensor/gpu/memory.hpp"
#include "tapegrad/tensor/gpu/detail/on_device.cuh"

namespace tapegrad::cuda {

template <class S> struct ComputeOf { using type = S; };
template <> struct ComputeOf<__nv_bfloat16> { using type = float; };
template <> struct ComputeOf<__half> { using type = float; };
// The type arithmetic on storage type S is carried out in.
template <class S> using compute_of = typename ComputeOf<S>::type;

// Storage → compute and compute → storage (round to nearest even).
template <class C, class S> __device__ __forceinline__ C to_compute(S v) {
  if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    return static_cast<C>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<S, __half>) {
    return static_cast<C>(__half2float(v));
  } else {
    return static_cast<C>(v);
  }
}
template <class S, class C> __device__ __forceinline__ S from_compute(C v) {
  if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    if constexpr (std::is_same_v<C, double>) return __double2bfloat16(v);
    else return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<S, __half>) {
    if constexpr (std::is_same_v<C, double>) return __double2half(v);
    else return __float2half_rn(static_cast<float>(v));
  } else {
    return static_cast<S>(v);
  }
}

// V contiguous values of S, moved in 16-byte accesses where V·sizeof(S) is a multiple of 16 (aligned to at most 16
// bytes: a larger pack is two or more such accesses, and its address need not be aligned beyond them).
template <class S, int V> struct alignas(sizeof(S) * V < 16 ? sizeof(S) * V : 16) Pack {
  S v[V];
};

// Whether p may be read or written in accesses of `bytes`, of 16 bytes.
inline bool aligned_to(const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }
inline bool aligned_16(const void* p) { return aligned_to(p, 16); }

// *to = pack, marked evict-first (a streaming store) where the pack is whole 16-byte accesses: for outputs far larger
// than L2 that the next kernel reads from memory anyway, so they do not evict lines still being read.
template <class S, int V> __device__ __forceinline__ void store_streaming(Pack<S, V>* to, const Pack<S, V>& pack) {
  if constexpr (sizeof(pack) % 16 == 0) {
#pragma unroll
    for (unsigned i = 0; i < sizeof(pack) / 16; ++i)
      __stcs(reinterpret_cast<int4*>(to) + i, reinterpret_cast<const int4*>(&pack)[i]);
  } else {
    *to = pack;
  }
}

// Calls fn(S{}) with S the storage type of the floating dtype `dtype`; throws naming `op` for any other dtype.
template <class Fn> void dispatch_float(DType dtype, std::string_view op, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::bf16: return fn(__nv_bfloat16{});
    case DType::f16: return fn(__half{});
    default: check(false, op, "no GPU kernel for dtype ", dtype_name(dtype));
  }
}

// Calls fn(E{}) with E an unsigned type of `bytes` bytes (2, 4, 8 or 16), for kernels that move bits; throws naming
// `op` for any other size.
template <class Fn> void dispatch_size(std::size_t bytes, std::string_view op, Fn&& fn) {
  switch (bytes) {
    case 2: return fn(std::uint16_t{});
    case 4: return fn(std::uint32_t{});
    case 8: return fn(std::uint64_t{});
    case 16: return fn(uint4{});
    default: check(false, op, "no kernel for elements of ", bytes, " bytes");
  }
}

// A kernel launch on `device`: that device current for the scope, its current stream, and grid sizes.
class Launch {
 public:
  explicit Launch(int device) : on_(device), device_(device), stream_(current_stream(device)) {}
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  // Blocks of `threads` to cover `work` items with a grid-stride loop: at most enough to fill the device a few
  // times over (more only add scheduling), at least one.
  int blocks_for(std::int64_t work, int threads) const {
    const std::int64_t needed = (work + threads - 1) / threads;
    const std::int64_t cap = std::int64_t{multiprocessor_count(device_)} * (2048 / threads) * 4;
    return static_cast<int>(std::clamp<std::int64_t>(needed, 1, cap));
  }
  // `blocks` capped at what the SMs hold of `kernel` at once (at least one): a grid-stride kernel that keeps loads in
  // flight ahead (cp.async) then walks many items per block, its pipeline full all the way, and no partial last wave
  // leaves SMs idle. A grid of one block per SM or less is returned as it is, without the occupancy query.
  template <class Kernel>
  std::int64_t resident_blocks(Kernel kernel, std::int64_t blocks, int threads, std::size_t shared) const {
    const std::int64_t sms = multiprocessor_count(device_);
    if (blocks <= sms) return std::max<std::int64_t>(blocks, 1);
    int resident = 0;
    TAPEGRAD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, threads, shared));
    return std::min(blocks, std::max<std::int64_t>(resident, 1) * sms);
  }

 private:
  OnDevice on_;
  int device_;
  cudaStream_t stream_;
};

// Kernels launched with launch_overlapped call this before they touch global memory: it returns once the kernels
// queued before them have completed and their writes are visible (a no-op for an ordinary launch).
__device__ __forceinline__ void wait_for_prior_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// kernel<<<grid, block, shared_bytes, launch.stream()>>>(args...), allowed to start while the kernel queued before it
// finishes (programmatic dependent launch): its blocks are launched as that kernel's last blocks leave instead of
// after it has completed, which takes a few µs off each boundary between short kernels. The kernel must call
// wait_for_prior_kernels() before touching global memory. After anything but a kernel, or before compute capability
// 9.0, it is an ordinary launch.
template <class... Params, class... Args>
void launch_overlapped(const Launch& launch, void (*kernel)(Params...), dim3 grid, dim3 block,
                       std::size_t shared_bytes, Args... args) {
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = launch.stream();
  config.attrs = &overlap;
  config.numAttrs = overlaps_launches(launch.device()) ? 1 : 0;
  TAPEGRAD_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...));
}

}  // namespace tapegrad::cuda
