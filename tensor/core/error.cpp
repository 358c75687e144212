#include "tapegrad/tensor/core/error.hpp"

#include <array>
#include <cstdio>

namespace tapegrad {

std::string format_bytes(std::size_t bytes) {
  constexpr std::array<const char*, 5> units = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes) / 1024.0;
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < units.size()) {
    value /= 1024.0;
    ++unit;
  }
  std::array<char, 32> text{};
  std::snprintf(text.data(), text.size(), "%.2f %s", value, units[unit]);
  return text.data();
}

OutOfMemoryError::OutOfMemoryError(std::string_view op, Device device, std::size_t requested, std::size_t free,
                                   std::size_t total)
    : Error(detail::concat(op, ": out of memory on ", device, ": ",
                           requested == 0 ? "an allocation failed"
                                          : detail::concat("asked for ", format_bytes(requested), " (", requested,
                                                           " bytes)"),
                           ", ", format_bytes(free), " free of ", format_bytes(total))),
      device_(device),
      requested_(requested),
      free_(free),
      total_(total) {}

}  // namespace tapegrad
