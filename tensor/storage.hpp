// Reference-counted, 64-byte aligned memory shared by tensors and their reshaped views.
#pragma once

#include <cstddef>
#include <memory>

#include "tensor/device.hpp"

namespace tapegrad {

class Storage {
 public:
  static std::shared_ptr<Storage> allocate(std::size_t bytes, Device device = Device::cpu());
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  Storage(void* data, std::size_t bytes, Device device) : data_(data), bytes_(bytes), device_(device) {}
  void* data_;
  std::size_t bytes_;
  Device device_;
};

}  // namespace tapegrad
