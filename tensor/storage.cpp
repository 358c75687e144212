#include "tensor/storage.hpp"

#include "tensor/error.hpp"
#include "tensor/host_memory.hpp"

namespace tapegrad {

std::shared_ptr<Storage> Storage::allocate(std::size_t bytes, Device device) {
  check(device.kind == Device::Kind::cpu, "allocate", "device ", device.str(), " is not available in this build");
  return std::shared_ptr<Storage>(new Storage(detail::host_allocate(bytes), bytes, device));
}

Storage::~Storage() { detail::host_free(data_, bytes_); }

}  // namespace tapegrad
