#include "tapegrad/tensor/storage.hpp"

#include <cstring>

#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"
#include "tapegrad/tensor/gpu/memory.hpp"
#include "tapegrad/tensor/host_memory.hpp"
#include "tapegrad/tensor/detail/small_blocks.hpp"

namespace tapegrad {

std::shared_ptr<Storage> Storage::adopt(void* data, std::size_t bytes, Device device, CUstream_st* stream) {
  try {
    return std::allocate_shared<Storage>(detail::BlockAllocator<Storage>(), Key{}, data, bytes, device, stream);
  } catch (...) {
    const Storage owner(Key{}, data, bytes, device, stream);  // frees `data` as the exception leaves
    throw;
  }
}

std::shared_ptr<Storage> Storage::allocate(std::size_t bytes, Device device) {
  return by_device(
      "allocate", device, [&] { return adopt(detail::host_allocate(bytes), bytes, device, nullptr); },
      [&](auto gpu) {
        const cuda::Block block = cuda::device_allocate(bytes, gpu.index);
        return adopt(block.ptr, bytes, gpu, block.stream);
      });
}

Storage::~Storage() {
  by_device(
      "free", device_, [&] { detail::host_free(data_, bytes_); },
      [&](auto gpu) { cuda::device_free({data_, bytes_, gpu.index, stream_}); });
}

void copy_bytes(void* dst, Device to, const void* src, Device from, std::size_t bytes) {
  if (to.is_cpu() && from.is_cpu()) {
    if (bytes != 0) std::memcpy(dst, src, bytes);
    return;
  }
  // (without CUDA no storage is anywhere but on the cpu)
  by_device(
      "copy", from.is_cpu() ? to : from, [] {},
      [&](auto) {
        if (from.is_cpu()) {
          cuda::copy_host_to_device(dst, src, bytes, to.index);
        } else if (to.is_cpu()) {
          cuda::copy_device_to_host(dst, src, bytes, from.index);
        } else {
          cuda::copy_device_to_device(dst, to.index, src, from.index, bytes);
        }
      });
}

}  // namespace tapegrad
