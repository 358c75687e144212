// Where a tensor's storage lives: the cpu, or CUDA device N. Every tensor carries its device, and ops refuse to mix
// devices (naming both) instead of copying implicitly.
#pragma once

#include <iosfwd>
#include <string>
#include <string_view>

namespace tapegrad {

struct Device {
  enum class Kind : unsigned char { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;

  static Device cpu() { return {}; }
  // CUDA device `index` (throws for a negative index; whether the device exists is checked when it is used).
  static Device cuda(int index = 0);
  // "cpu", "cuda" (device 0) or "cuda:N"; throws tapegrad::Error naming the text for anything else.
  static Device parse(std::string_view text);

  bool is_cpu() const { return kind == Kind::cpu; }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
  friend bool operator==(const Device&, const Device&) = default;
};

std::ostream& operator<<(std::ostream& out, const Device& device);

}  // namespace tapegrad
