#include "tensor/storage.hpp"

#include <cstdlib>
#include <new>

#include "tensor/error.hpp"

namespace tapegrad {

namespace {
constexpr std::size_t alignment = 64;  // a cache line, and enough for any SIMD packet Eigen uses
}

std::shared_ptr<Storage> Storage::allocate(std::size_t bytes, Device device) {
  check(device.kind == Device::Kind::cpu, "allocate", "device ", device.str(), " is not available in this build");
  const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* p = rounded == 0 ? nullptr : std::aligned_alloc(alignment, rounded);
  if (rounded != 0 && p == nullptr) throw std::bad_alloc();
  return std::shared_ptr<Storage>(new Storage(p, bytes, device));
}

Storage::~Storage() { std::free(data_); }

}  // namespace tapegrad
