// A module's state_dict as a safetensors file: nn::save(model, "model.safetensors") writes it atomically (the old
// file stays whole until the new one is), nn::load(model, path, {.strict, .cast}) loads it into the module in place
// (Module::load_state_dict says how).
#pragma once

#include <filesystem>

#include "tapegrad/ops/nn/module.hpp"
#include "tapegrad/tensor/io/safetensors.hpp"

namespace tapegrad::nn {

inline void save(const Module& module, const std::filesystem::path& path, const safetensors::Metadata& metadata = {}) {
  safetensors::save(path, module.state_dict(), metadata);
}

inline void load(Module& module, const std::filesystem::path& path, const LoadOptions& options = {}) {
  module.load_state_dict(safetensors::load(path).tensors, options);
}

}  // namespace tapegrad::nn
