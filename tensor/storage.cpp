#include "tensor/storage.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "tensor/error.hpp"
#ifdef TAPEGRAD_HAVE_CUDA
#include "cuda/memory.hpp"
#endif

namespace tapegrad {

namespace {
constexpr std::size_t alignment = 64;  // a cache line, and enough for any SIMD packet Eigen uses
// Large buffers are 2 MiB aligned and asked to be backed by transparent huge pages: a first touch of a fresh
// 4 KiB page costs microseconds on virtual machines, which otherwise dominates big elementwise ops and GEMMs.
constexpr std::size_t huge_page = std::size_t{2} << 20;
constexpr std::size_t huge_threshold = 2 * huge_page;
}  // namespace

std::shared_ptr<Storage> Storage::allocate(std::size_t bytes, Device device) {
  if (!device.is_cpu()) {
#ifdef TAPEGRAD_HAVE_CUDA
    const cuda::Block block = cuda::device_allocate(bytes, device.index);
    return std::shared_ptr<Storage>(new Storage(block.ptr, bytes, device, block.stream));
#else
    throw Error(detail::concat("allocate: device ", device, " is not available: tapegrad was built without CUDA"));
#endif
  }
  const std::size_t align = bytes >= huge_threshold ? huge_page : alignment;
  const std::size_t rounded = (bytes + align - 1) / align * align;
  void* p = rounded == 0 ? nullptr : std::aligned_alloc(align, rounded);
  if (rounded != 0 && p == nullptr) throw std::bad_alloc();
  if (align == huge_page) madvise(p, rounded, MADV_HUGEPAGE);  // advisory: failure only costs speed
  return std::shared_ptr<Storage>(new Storage(p, bytes, device, nullptr));
}

Storage::~Storage() {
  if (device_.is_cpu()) {
    std::free(data_);
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
