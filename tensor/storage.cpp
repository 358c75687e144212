#include "tensor/storage.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

#include "tensor/error.hpp"

namespace tapegrad {

namespace {
constexpr std::size_t alignment = 64;  // a cache line, and enough for any SIMD packet Eigen uses
// Large buffers are 2 MiB aligned and asked to be backed by transparent huge pages: a first touch of a fresh
// 4 KiB page costs microseconds on virtual machines, which otherwise dominates big elementwise ops and GEMMs.
constexpr std::size_t huge_page = std::size_t{2} << 20;
constexpr std::size_t huge_threshold = 2 * huge_page;
}

std::shared_ptr<Storage> Storage::allocate(std::size_t bytes, Device device) {
  check(device.kind == Device::Kind::cpu, "allocate", "device ", device.str(), " is not available in this build");
  const std::size_t align = bytes >= huge_threshold ? huge_page : alignment;
  const std::size_t rounded = (bytes + align - 1) / align * align;
  void* p = rounded == 0 ? nullptr : std::aligned_alloc(align, rounded);
  if (rounded != 0 && p == nullptr) throw std::bad_alloc();
  if (align == huge_page) madvise(p, rounded, MADV_HUGEPAGE);  // advisory: failure only costs speed
  return std::shared_ptr<Storage>(new Storage(p, bytes, device));
}

Storage::~Storage() { std::free(data_); }

}  // namespace tapegrad
