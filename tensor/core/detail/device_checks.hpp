// The device checks ops share. An op takes all its inputs on one device and never copies between devices behind
// the user's back; an op without a GPU path refuses device inputs instead of reading device memory from the host.
// The passing case costs one compare per input; the messages are built out of line, only on failure.
//
// `inputs` are anything with a `.device()` (Tensor, Var), numbered from 0 in the order given.
#pragma once

#include <cstddef>
#include <string_view>

#include "tapegrad/tensor/core/device.hpp"

namespace tapegrad {

namespace detail {
[[noreturn]] void throw_cpu_only(std::string_view op, std::size_t input, Device device);
[[noreturn]] void throw_mixed_devices(std::string_view op, Device first, std::size_t input, Device device);
[[noreturn]] void throw_not_on_host(std::string_view op, Device device);
}  // namespace detail

// "matmul: input 0 is on cuda:0, but this op runs on the cpu only so far; ..." unless `device` is the cpu.
inline void check_on_cpu(std::string_view op, std::size_t input, Device device) {
  if (!device.is_cpu()) [[unlikely]] detail::throw_cpu_only(op, input, device);
}

// "add: input 0 is on cpu but input 1 is on cuda:0; ..." unless input `input`'s `device` is input 0's, `first`.
inline void check_device_matches(std::string_view op, Device first, std::size_t input, Device device) {
  if (!(device == first)) [[unlikely]] detail::throw_mixed_devices(op, first, input, device);
}

// Throws unless every input is on the first one's device.
template <class X, class... Xs>
void check_same_device([[maybe_unused]] std::string_view op, [[maybe_unused]] const X& first, const Xs&... inputs) {
  [[maybe_unused]] std::size_t i = 0;
  (check_device_matches(op, first.device(), ++i, inputs.device()), ...);
}

}  // namespace tapegrad
