// save_sharded and load_sharded (ops/nn/checkpoint.hpp). A shard's axis travels as the metadata entry
// "tapegrad.shard.<path>" of every rank's file; the rank count is in the file names.
#include <map>
#include <regex>
#include <set>
#include <string>

#include "tapegrad/ops/layout.hpp"
#include "tapegrad/ops/nn/checkpoint.hpp"

namespace tapegrad::nn {

namespace {

constexpr const char* shard_key = "tapegrad.shard.";

std::string file_name(int rank, int ranks) {
  return "rank-" + std::to_string(rank) + "-of-" + std::to_string(ranks) + ".safetensors";
}

// The rank count of the files in `dir`; throws naming the folder unless they are exactly rank-0-of-p ... p-1-of-p.
int saved_ranks(const std::filesystem::path& dir) {
  const std::regex pattern(R"(rank-(\d+)-of-(\d+)\.safetensors)");
  std::map<int, std::set<int>> ranks_by_count;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, pattern)) ranks_by_count[std::stoi(m[2])].insert(std::stoi(m[1]));
  }
  check(!error, "load_sharded", "cannot list ", dir, ": ", error.message());
  check(ranks_by_count.size() == 1, "load_sharded", dir,
        ranks_by_count.empty() ? " holds no rank-<r>-of-<p>.safetensors file"
                               : " holds the shards of checkpoints of different rank counts");
  const auto& [count, ranks] = *ranks_by_count.begin();
  for (int r = 0; r < count; ++r) {
    check(ranks.count(r) == 1, "load_sharded", dir, " lacks ", file_name(r, count), " (", ranks.size(), " of ", count,
          " files)");
  }
  return count;
}

// The blocks joined along `axis` (every block of one float dtype).
AnyTensor joined(const std::vector<AnyTensor>& blocks, int axis) {
  return std::visit(
      [&](const auto& first) -> AnyTensor {
        using T = typename std::decay_t<decltype(first)>::value_type;
        if constexpr (is_float_dtype_v<T>) {
          const NoGradGuard no_grad;
          std::vector<Var<T>> parts;
          for (const AnyTensor& b : blocks) parts.push_back(constant(b.get<T>()));
          return concat(parts, axis).value();
        } else {
          throw Error(tapegrad::detail::concat("load_sharded: a shard of ", dtype_name(dtype_v<T>), " cannot be joined"));
        }
      },
      blocks.front().variant());
}

// `whole`'s block of `shard`.
AnyTensor block_of(const AnyTensor& whole, const ParameterShard& shard, const std::string& path) {
  return std::visit(
      [&](const auto& t) -> AnyTensor {
        using T = typename std::decay_t<decltype(t)>::value_type;
        if constexpr (is_float_dtype_v<T>) {
          check(shard.axis < t.rank() && t.dim(shard.axis) % shard.ranks == 0, "load_sharded", "'", path,
                "' of shape ", t.shape(), " does not split along axis ", shard.axis, " into ", shard.ranks,
                " equal shards");
          const std::int64_t size = t.dim(shard.axis) / shard.ranks;
          const NoGradGuard no_grad;
          return slice(constant(t), shard.axis, shard.rank * size, (shard.rank + 1) * size).value();
        } else {
          return t;
        }
      },
      whole.variant());
}

}  // namespace

void save_sharded(const Module& module, const std::filesystem::path& dir, const dist::Communicator& comm) {
  safetensors::Metadata metadata;
  for (const NamedParameter& p : module.parameters()) {
    if (!p.shard) continue;
    check(p.shard->rank == comm.rank() && p.shard->ranks == comm.size(), "save_sharded", "'", p.path, "' is shard ",
          p.shard->rank, " of ", p.shard->ranks, ", but the communicator '", comm.name(), "' is rank ", comm.rank(),
          " of ", comm.size());
    metadata[shard_key + p.path] = std::to_string(p.shard->axis);
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  check(!error, "save_sharded", "cannot make ", dir, ": ", error.message());
  safetensors::save(dir / file_name(comm.rank(), comm.size()), module.state_dict(), metadata);
  comm.barrier();
}

void load_sharded(Module& module, const std::filesystem::path& dir, const LoadOptions& options) {
  const int saved = saved_ranks(dir);
  std::vector<std::unique_ptr<safetensors::MappedFile>> files;
  for (int r = 0; r < saved; ++r) files.push_back(std::make_unique<safetensors::MappedFile>(dir / file_name(r, saved)));
  const safetensors::MappedFile& first = *files.front();
  std::map<std::string, ParameterShard, std::less<>> wanted;  // this module's shards by path
  for (const NamedParameter& p : module.parameters()) {
    if (p.shard) wanted[p.path] = *p.shard;
  }
  StateDict dict;
  for (const std::string& name : first.names()) {
    AnyTensor whole;
    if (const auto axis = first.metadata().find(shard_key + name); axis != first.metadata().end()) {
      std::vector<AnyTensor> blocks;
      for (const auto& file : files) blocks.push_back(file->tensor(name));
      whole = joined(blocks, std::stoi(axis->second));
    } else {
      whole = first.tensor(name);
    }
    const auto shard = wanted.find(name);
    dict[name] = shard == wanted.end() ? whole : block_of(whole, shard->second, name);
  }
  module.load_state_dict(dict, options);
}

}  // namespace tapegrad::nn
