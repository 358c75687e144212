#include "tensor/storage.hpp"

#include <cstring>

#include "tensor/error.hpp"
#include "tensor/host_memory.hpp"
#ifdef TAPEGRAD_HAVE_CUDA
#include "cuda/memory.hpp"
#endif

namespace tapegrad {

std::shared_ptr<Storage> Storage::allocate(std::size_t bytes, Device device) {
  if (!device.is_cpu()) {
#ifdef TAPEGRAD_HAVE_CUDA
    const cuda::Block block = cuda::device_allocate(bytes, device.index);
    return std::shared_ptr<Storage>(new Storage(block.ptr, bytes, device, block.stream));
#else
    throw Error(detail::concat("allocate: device ", device, " is not available: tapegrad was built without CUDA"));
#endif
  }
  return std::shared_ptr<Storage>(new Storage(detail::host_allocate(bytes), bytes, device, nullptr));
}

Storage::~Storage() {
  if (device_.is_cpu()) {
    detail::host_free(data_, bytes_);
    return;
  }
#ifdef TAPEGRAD_HAVE_CUDA
  cuda::device_free({data_, bytes_, device_.index, stream_});
#endif
}

void copy_bytes(void* dst, Device to, const void* src, Device from, std::size_t bytes) {
  if (to.is_cpu() && from.is_cpu()) {
    if (bytes != 0) std::memcpy(dst, src, bytes);
    return;
  }
#ifdef TAPEGRAD_HAVE_CUDA  // (without CUDA no storage is anywhere but on the cpu)
  if (from.is_cpu()) {
    cuda::copy_host_to_device(dst, src, bytes, to.index);
  } else if (to.is_cpu()) {
    cuda::copy_device_to_host(dst, src, bytes, from.index);
  } else {
    cuda::copy_device_to_device(dst, to.index, src, from.index, bytes);
  }
#endif
}

}  // namespace tapegrad
