#include "tapegrad/tensor/core/device.hpp"

#include <charconv>
#include <ostream>

#include "tapegrad/tensor/core/detail/device_checks.hpp"
#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad {

Device Device::cuda(int index) {
  check(index >= 0, "Device::cuda", "device index must be non-negative, got ", index);
  return {Kind::cuda, index};
}

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  constexpr std::string_view prefix = "cuda:";
  if (text.starts_with(prefix)) {
    const std::string_view digits = text.substr(prefix.size());
    const char* end = digits.data() + digits.size();
    int index = -1;
    const auto [stop, err] = std::from_chars(digits.data(), end, index);
    if (!digits.empty() && err == std::errc() && stop == end && index >= 0) return cuda(index);
  }
  throw Error(detail::concat("Device::parse: \"", text, "\" is not a device; expected \"cpu\", \"cuda\" or ",
                             "\"cuda:N\" with N >= 0"));
}

std::ostream& operator<<(std::ostream& out, const Device& device) { return out << device.str(); }

namespace detail {

void throw_cpu_only(std::string_view op, std::size_t input, Device device) {
  throw Error(concat(op, ": input ", input, " is on ", device,
                     ", but this op runs on the cpu only so far; copy it with .to(Device::cpu()) first"));
}

void throw_mixed_devices(std::string_view op, Device first, std::size_t input, Device device) {
  throw Error(concat(op, ": input 0 is on ", first, " but input ", input, " is on ", device,
                     "; an op takes all its inputs on one device: copy one with .to(device) first"));
}

void throw_not_on_host(std::string_view op, Device device) {
  throw Error(concat(op, ": the tensor is on ", device, "; copy it to the cpu with .to(Device::cpu()) first"));
}

}  // namespace detail

}  // namespace tapegrad
