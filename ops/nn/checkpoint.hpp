// A module's state_dict as a safetensors file: nn::save(model, "model.safetensors") writes it atomically (the old
// file stays whole until the new one is), nn::load(model, path, {.strict, .cast}) loads it into the module in place
// (Module::load_state_dict says how).
//
// Tensor-parallel modules (whose parameters are shards, NamedParameter::shard): nn::save_sharded(model, dir, comm)
// has each rank write its own file, <dir>/rank-<r>-of-<p>.safetensors (its state dict, the shards under their
// parameters' names, the metadata naming each shard's axis), atomically. nn::load_sharded(model, dir) reads such a
// folder into a module sharded over any number of ranks that splits the sharded axes evenly: the same number (each
// rank reads its own file), or another, one included (the unsharded module): each sharded parameter is reassembled
// from every rank's file and this module's block taken from it. Replicated parameters and buffers come from rank 0's
// file.
#pragma once

#include <filesystem>

#include "tapegrad/ops/nn/module.hpp"
#include "tapegrad/tensor/dist/communicator.hpp"
#include "tapegrad/tensor/io/safetensors.hpp"

namespace tapegrad::nn {

inline void save(const Module& module, const std::filesystem::path& path, const safetensors::Metadata& metadata = {}) {
  safetensors::save(path, module.state_dict(), metadata);
}

inline void load(Module& module, const std::filesystem::path& path, const LoadOptions& options = {}) {
  module.load_state_dict(safetensors::load(path).tensors, options);
}

// Collective over `comm`, whose rank and size must be the module's shards' (each rank writes, then they meet: the
// folder is complete when any of them returns). Throws naming the parameter whose shard is not comm's rank's.
void save_sharded(const Module& module, const std::filesystem::path& dir, const dist::Communicator& comm);
// Throws naming the folder when its files are not rank-0-of-p to rank-(p-1)-of-p, and as load_state_dict does for
// entries that do not fit (nothing is loaded then).
void load_sharded(Module& module, const std::filesystem::path& dir, const LoadOptions& options = {});

}  // namespace tapegrad::nn
