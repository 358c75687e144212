// Where a tensor's storage lives. Only the CPU exists until the CUDA backend lands; the tag is here so that
// every tensor already carries it and mixing devices can be refused by name.
#pragma once

#include <iosfwd>
#include <string>

namespace tapegrad {

struct Device {
  enum class Kind : unsigned char { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;

  static Device cpu() { return {}; }
  std::string str() const { return kind == Kind::cpu ? "cpu" : "cuda:" + std::to_string(index); }
  friend bool operator==(const Device&, const Device&) = default;
};

}  // namespace tapegrad
