// Reference-counted memory shared by tensors and their reshaped views: 64-byte aligned host memory, or device
// memory from the CUDA backend's stream-ordered pool (tensor/gpu/memory.hpp).
#pragma once

#include <cstddef>
#include <memory>

#include "tapegrad/tensor/core/device.hpp"

struct CUstream_st;

namespace tapegrad {

class Storage {
 public:
  // Throws tapegrad::Error for a device that this build or machine does not have, OutOfMemoryError when a device
  // is out of memory.
  static std::shared_ptr<Storage> allocate(std::size_t bytes, Device device = Device::cpu());
  ~Storage();  // never throws: device memory goes back to its pool, ordered on the stream it was allocated on
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  struct Key {};  // only `allocate` makes Storage (allocate_shared needs a public constructor)

 public:
  Storage(Key, void* data, std::size_t bytes, Device device, CUstream_st* stream)
      : data_(data), bytes_(bytes), device_(device), stream_(stream) {}

 private:
  // The record (with its reference counts, in one small block) owning `data`; frees `data` when it cannot be made.
  static std::shared_ptr<Storage> adopt(void* data, std::size_t bytes, Device device, CUstream_st* stream);
  void* data_;
  std::size_t bytes_;
  Device device_;
  CUstream_st* stream_;  // device memory: the stream it was allocated on and is freed on
};

// Copies `bytes` from `src` on `from` to `dst` on `to`. A copy that involves host memory has finished on return;
// one within a device is ordered on the device's current stream.
void copy_bytes(void* dst, Device to, const void* src, Device from, std::size_t bytes);

}  // namespace tapegrad
