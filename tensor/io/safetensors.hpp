// safetensors files (https://github.com/huggingface/safetensors), the format PyTorch, JAX/flax, TransformerEngine
// and Hugging Face exchange weights in: an 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {string: string}}, then the tensors' raw
// little-endian bytes, row-major, at [8 + N + begin, 8 + N + end).
//
//   safetensors::save("model.safetensors", {{"w1", w1}, {"b1", b1}}, {{"format", "pt"}});
//   safetensors::File f = safetensors::load("model.safetensors");    // every tensor, copied out of the file
//   Tensor<float> w1 = f.tensors.at("w1").get<float>();
//   safetensors::MappedFile m("model.safetensors");                  // the file mapped; nothing read yet
//   AnyTensor w2 = m.tensor("w2", Device::cuda(0));                    // one tensor, host mapping -> device
//
// dtypes: F64, F32, BF16, F16, I32, I64, F8_E4M3, F8_E5M2 (tapegrad's f64 ... f8e5m2). A file is untrusted input:
// everything is checked before a byte of data is read (the header's length against the file's and the reference
// implementation's 100 MB limit, the JSON and its UTF-8, duplicate names, known dtypes, shapes whose bytes match their
// offsets, offsets in order and covering the data exactly, with no gap or overlap), and anything wrong throws
// tapegrad::Error naming the file and the problem. Writes are atomic (io/atomic_file.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tapegrad/tensor/any_tensor.hpp"

namespace tapegrad::safetensors {

using TensorMap = std::map<std::string, AnyTensor, std::less<>>;
using Metadata = std::map<std::string, std::string, std::less<>>;

// A file's contents: its tensors by name and its metadata strings.
struct File {
  TensorMap tensors;
  Metadata metadata;
};

// The header's entry for one tensor: where its bytes are, relative to the data's start.
struct Entry {
  DType dtype;
  Shape shape;
  std::uint64_t begin = 0, end = 0;
};

// The format's name of a dtype ("F32", "BF16", "F8_E4M3", ...), and the dtype of a name (throws Error naming `source`
// for a name tapegrad has no dtype for).
std::string_view format_name(DType dtype);

// Writes `tensors` (on any device; undefined ones are refused by name) and `metadata` to `path`, atomically: the old
// file stays whole until the new one is. The header lists the names sorted, the data follows in the same order.
void save(const std::filesystem::path& path, const TensorMap& tensors, const Metadata& metadata = {});

// The bytes save() writes, in memory.
std::string serialize(const TensorMap& tensors, const Metadata& metadata = {});

// Every tensor of a file, on `device`.
File load(const std::filesystem::path& path, Device device = Device::cpu());

// Every tensor of a file's bytes, on `device`; `source` names the bytes in errors.
File deserialize(std::span<const std::byte> bytes, std::string_view source = "<memory>",
                 Device device = Device::cpu());

// A file mapped into memory read-only, its header checked: tensors are copied out one at a time, where and when asked
// for (a device tensor straight from the mapping), so a large file costs no memory beyond what is taken from it. The
// file must not be truncated while mapped (the system would then fault the reads).
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(std::string_view name) const;
  const Entry& entry(std::string_view name) const;  // throws Error naming the file for an unknown name
  const Metadata& metadata() const;
  // The tensor's bytes inside the mapping (no copy): valid while this MappedFile lives.
  std::span<const std::byte> bytes(std::string_view name) const;
  // A copy of the tensor on `device`.
  AnyTensor tensor(std::string_view name, Device device = Device::cpu()) const;

 private:
  struct Parsed;
  std::filesystem::path path_;
  const std::byte* map_ = nullptr;
  std::size_t size_ = 0;
  std::unique_ptr<Parsed> parsed_;
};

}  // namespace tapegrad::safetensors
