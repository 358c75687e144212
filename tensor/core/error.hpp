// The library's exception types. Every error a user can cause throws one of these, with a message that names the
// op and the offending shapes, dtypes or devices.
#pragma once

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "tapegrad/tensor/core/device.hpp"

namespace tapegrad {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Misuse of the tape: backward twice, a cleared tape, a wrong seed.
class AutodiffError : public Error {
 public:
  using Error::Error;
};

// A device allocation the device could not satisfy, even after returning its cached memory. The process and the
// tape stay usable: free some tensors and allocate again.
class OutOfMemoryError : public Error {
 public:
  // "allocate: out of memory on cuda:0: asked for 2.00 TiB (2199023255552 bytes), 139.10 GiB free of 139.70 GiB";
  // `requested` 0 stands for an allocation of unknown size (one the standard library's containers made).
  OutOfMemoryError(std::string_view op, Device device, std::size_t requested, std::size_t free, std::size_t total);

  Device device() const { return device_; }
  std::size_t bytes_requested() const { return requested_; }
  std::size_t bytes_free() const { return free_; }
  std::size_t bytes_total() const { return total_; }

 private:
  Device device_;
  std::size_t requested_, free_, total_;
};

// A byte count in binary units with two decimals ("512 B", "1.50 KiB", "139.10 GiB").
std::string format_bytes(std::size_t bytes);

namespace detail {
template <class... Parts> std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}
}  // namespace detail

// Throws Error("op: <parts...>") when `ok` is false. Parts are only formatted on failure.
template <class... Parts> inline void check(bool ok, std::string_view op, Parts&&... parts) {
  if (!ok) throw Error(detail::concat(op, ": ", std::forward<Parts>(parts)...));
}

}  // namespace tapegrad
