// libFuzzer target over the safetensors reader: any bytes must either parse into tensors or throw tapegrad::Error;
// a crash, a read out of bounds (AddressSanitizer), undefined behaviour or any other exception is a finding.
// tests/fuzz/run.sh builds it with clang and runs it; tests/fuzz/corpus/ keeps the inputs it found, which
// test_safetensors replays in CI.
#include <cstddef>
#include <cstdint>
#include <span>

#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    tapegrad::safetensors::deserialize(std::span(reinterpret_cast<const std::byte*>(data), size), "fuzz");
  } catch (const tapegrad::Error&) {
    // refused by name: what the reader must do with a broken file
  }
  return 0;
}
