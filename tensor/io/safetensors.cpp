#include "tapegrad/tensor/io/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/io/detail/atomic_file.hpp"

namespace tapegrad::safetensors {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes, as tensors hold them");

namespace {

using json = nlohmann::json;

// The reference implementation's limit on the header (MAX_HEADER_SIZE).
constexpr std::uint64_t max_header_bytes = 100'000'000;
constexpr std::string_view metadata_key = "__metadata__";

constexpr std::pair<DType, std::string_view> format_names[] = {
    {DType::f64, "F64"},     {DType::f32, "F32"}, {DType::bf16, "BF16"},       {DType::f16, "F16"},
    {DType::i32, "I32"},     {DType::i64, "I64"}, {DType::f8e4m3, "F8_E4M3"}, {DType::f8e5m2, "F8_E5M2"},
};

template <class... Parts> [[noreturn]] void bad(std::string_view source, Parts&&... parts) {
  throw Error(detail::concat("safetensors: ", source, ": ", std::forward<Parts>(parts)...));
}

// A header's checked contents; data_start: where the data begins in the file (8 + the header's length).
struct Header {
  std::map<std::string, Entry, std::less<>> entries;
  Metadata metadata;
  std::uint64_t data_start = 0;
};

// What nlohmann's message says of a parse error (or of a number past a double's range), without the bytes it last
// read (they may not be text).
std::string parse_problem(const json::exception& e) {
  std::string what = e.what();
  if (const auto at = what.find("] "); at != std::string::npos) what = what.substr(at + 2);
  if (const auto at = what.find("; last read"); at != std::string::npos) what = what.substr(0, at);
  return what;
}

// The header as JSON; throws for malformed JSON, ill-formed UTF-8 and a name given twice in any object (nlohmann
// would keep the last silently).
json parse_json(const char* text, std::size_t length, std::string_view source) {
  std::vector<std::set<std::string>> names;  // per open object
  std::string duplicate;
  const json::parser_callback_t note_names = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) names.emplace_back();
    if (event == json::parse_event_t::object_end) names.pop_back();
    if (event == json::parse_event_t::key && !names.back().insert(parsed.get<std::string>()).second &&
        duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, text + length, note_names);
  } catch (const json::exception& e) {
    bad(source, "the header is not valid JSON: ", parse_problem(e));
  }
  if (!duplicate.empty()) bad(source, "the header names '", duplicate, "' twice");
  return header;
}

DType dtype_named(std::string_view name, std::string_view tensor, std::string_view source) {
  for (const auto& [dtype, format] : format_names) {
    if (format == name) return dtype;
  }
  bad(source, "tensor '", tensor, "' has dtype '", name, "', which tapegrad has no type for (it reads F64, F32, BF16, ",
      "F16, I32, I64, F8_E4M3, F8_E5M2)");
}

std::uint64_t unsigned_of(const json& value, std::string_view what, std::string_view tensor,
                          std::string_view source) {
  if (!value.is_number_unsigned()) {
    bad(source, "tensor '", tensor, "': ", what, " holds ", value.dump(), ", not a count");
  }
  return value.get<std::uint64_t>();
}

Entry entry_of(const std::string& name, const json& value, std::string_view source) {
  if (!value.is_object()) bad(source, "tensor '", name, "' is described by ", value.type_name(), ", not an object");
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(field)) bad(source, "tensor '", name, "' has no ", field);
  }
  const json& dtype = value["dtype"];
  if (!dtype.is_string()) bad(source, "tensor '", name, "': dtype is ", dtype.type_name(), ", not a string");
  Entry entry{.dtype = dtype_named(dtype.get<std::string>(), name, source), .shape = {}};
  const json& shape = value["shape"];
  if (!shape.is_array() || shape.size() > static_cast<std::size_t>(Shape::max_rank)) {
    bad(source, "tensor '", name, "': shape must be an array of at most ", Shape::max_rank, " sizes");
  }
  std::vector<std::int64_t> dims;
  for (const json& d : shape) {
    const std::uint64_t size = unsigned_of(d, "shape", name, source);
    if (size > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      bad(source, "tensor '", name, "': shape ", shape.dump(), " has a size past 2^63 - 1");
    }
    dims.push_back(static_cast<std::int64_t>(size));
  }
  std::uint64_t bytes = 0;
  try {
    entry.shape = Shape(dims);  // (throws where the sizes multiply past what an int64 counts)
  } catch (const Error&) {
    bad(source, "tensor '", name, "': shape ", shape.dump(), " has more elements than an int64 counts");
  }
  if (__builtin_mul_overflow(static_cast<std::uint64_t>(entry.shape.numel()), dtype_size(entry.dtype), &bytes)) {
    bad(source, "tensor '", name, "': shape ", shape.dump(), " takes more bytes than a file can hold");
  }
  const json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    bad(source, "tensor '", name, "': data_offsets must be [begin, end], not ", offsets.dump());
  }
  entry.begin = unsigned_of(offsets[0], "data_offsets", name, source);
  entry.end = unsigned_of(offsets[1], "data_offsets", name, source);
  if (entry.begin > entry.end) {
    bad(source, "tensor '", name, "': data_offsets [", entry.begin, ", ", entry.end, "] end before they begin");
  }
  if (entry.end - entry.begin != bytes) {
    bad(source, "tensor '", name, "': shape ", entry.shape, " of ", format_name(entry.dtype), " takes ",
        bytes, " bytes, but data_offsets [", entry.begin, ", ", entry.end, "] hold ", entry.end - entry.begin);
  }
  return entry;
}

// Parses and checks the header of a file's bytes (see safetensors.hpp for what is checked).
Header parse_header(std::span<const std::byte> file, std::string_view source) {
  if (file.size() < 8) bad(source, "the file is ", file.size(), " bytes, too short for the 8-byte header length");
  std::uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= std::to_integer<std::uint64_t>(file[i]) << (8 * i);
  if (length > max_header_bytes) {
    bad(source, "the header length ", length, " is over the limit of ", max_header_bytes, " bytes");
  }
  if (length > file.size() - 8) {
    bad(source, "the header length ", length, " runs past the end of the file (", file.size(), " bytes)");
  }
  const json header = parse_json(reinterpret_cast<const char*>(file.data() + 8), length, source);
  if (!header.is_object()) bad(source, "the header is a JSON ", header.type_name(), ", not an object");
  Header out;
  out.data_start = 8 + length;
  for (const auto& [name, value] : header.items()) {
    if (name != metadata_key) {
      out.entries.emplace(name, entry_of(name, value, source));
      continue;
    }
    if (!value.is_object()) bad(source, "__metadata__ is ", value.type_name(), ", not an object of strings");
    for (const auto& [key, text] : value.items()) {
      if (!text.is_string()) bad(source, "__metadata__ '", key, "' is ", text.type_name(), ", not a string");
      out.metadata.emplace(key, text.get<std::string>());
    }
  }
  // The data: the tensors' byte ranges in order must cover it exactly, with no gap and no overlap.
  std::vector<std::pair<const std::string*, const Entry*>> by_offset;  // (names for the messages)
  for (const auto& [name, entry] : out.entries) by_offset.emplace_back(&name, &entry);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return std::pair{a.second->begin, a.second->end} < std::pair{b.second->begin, b.second->end};
  });
  const std::uint64_t data_bytes = file.size() - out.data_start;
  std::uint64_t covered = 0;
  for (const auto& [name, entry] : by_offset) {
    if (entry->begin < covered) {
      bad(source, "tensor '", *name, "' at data_offsets [", entry->begin, ", ", entry->end,
          "] overlaps the tensor before it (which ends at ", covered, ")");
    }
    if (entry->begin > covered) {
      bad(source, "the data has a gap at bytes [", covered, ", ", entry->begin, ") before tensor '", *name, "'");
    }
    if (entry->end > data_bytes) {
      bad(source, "tensor '", *name, "' at data_offsets [", entry->begin, ", ", entry->end,
          "] runs past the data's end (", data_bytes, " bytes)");
    }
    covered = entry->end;
  }
  if (covered != data_bytes) {
    bad(source, "the file has ", data_bytes - covered, " bytes after its last tensor's data");
  }
  return out;
}

AnyTensor copy_out(const Entry& entry, const std::byte* data, Device device) {
  AnyTensor t = AnyTensor::empty(entry.dtype, entry.shape, device);
  if (t.bytes() > 0) copy_bytes(t.data(), device, data + entry.begin, Device::cpu(), t.bytes());
  return t;
}

File read_all(const Header& header, const std::byte* file, Device device) {
  File out{.tensors = {}, .metadata = header.metadata};
  for (const auto& [name, entry] : header.entries) {
    out.tensors.emplace(name, copy_out(entry, file + header.data_start, device));
  }
  return out;
}

// Calls write(bytes, count) for the file's bytes, in order: the header's length and text, then each tensor's data
// (copied to the host one at a time where it is on a device).
template <class Write> void emit(const TensorMap& tensors, const Metadata& metadata, Write&& write) {
  json header = json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    check(name != metadata_key, "safetensors", "'__metadata__' is the format's own key, not a tensor name");
    check(tensor.defined(), "safetensors", "tensor '", name, "' is undefined");
    std::vector<std::int64_t> shape(tensor.shape().dims().begin(), tensor.shape().dims().end());
    header[name] = {{"dtype", format_name(tensor.dtype())},
                    {"shape", shape},
                    {"data_offsets", {offset, offset + tensor.bytes()}}};
    offset += tensor.bytes();
  }
  if (!metadata.empty()) header[std::string(metadata_key)] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned, as the reference writer has it
  std::byte length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<std::byte>(static_cast<std::uint64_t>(text.size()) >> (8 * i));
  write(length, sizeof length);
  write(text.data(), text.size());
  for (const auto& [name, tensor] : tensors) {
    const AnyTensor host = tensor.to(Device::cpu());
    if (host.bytes() > 0) write(host.data(), host.bytes());  // (an empty tensor may have no storage to point at)
  }
}

}  // namespace

std::string_view format_name(DType dtype) {
  for (const auto& [d, name] : format_names) {
    if (d == dtype) return name;
  }
  throw Error(detail::concat("safetensors: no format name for dtype ", dtype_name(dtype)));
}

std::string serialize(const TensorMap& tensors, const Metadata& metadata) {
  std::string out;
  emit(tensors, metadata,
       [&](const void* bytes, std::size_t count) { out.append(static_cast<const char*>(bytes), count); });
  return out;
}

void save(const std::filesystem::path& path, const TensorMap& tensors, const Metadata& metadata) {
  const auto fill = [&](io::FileSink& sink) {
    emit(tensors, metadata, [&](const void* bytes, std::size_t count) { sink.write(bytes, count); });
  };
  io::write_atomically(path, fill, "safetensors::save");
}

File deserialize(std::span<const std::byte> bytes, std::string_view source, Device device) {
  return read_all(parse_header(bytes, source), bytes.data(), device);
}

File load(const std::filesystem::path& path, Device device) {
  const MappedFile file(path);
  File out{.tensors = {}, .metadata = file.metadata()};
  for (const std::string& name : file.names()) out.tensors.emplace(name, file.tensor(name, device));
  return out;
}

struct MappedFile::Parsed {
  Header header;
};

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
  const std::string source = path.string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) bad(source, "cannot open: ", std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    bad(source, "cannot read its size: ", std::strerror(error));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    bad(source, "not a regular file");
  }
  size_ = static_cast<std::size_t>(info.st_size);
  if (size_ > 0) {
    void* map = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int error = errno;
    ::close(fd);
    if (map == MAP_FAILED) bad(source, "cannot map: ", std::strerror(error));
    map_ = static_cast<const std::byte*>(map);
  } else {
    ::close(fd);
  }
  try {
    parsed_ = std::make_unique<Parsed>(Parsed{parse_header({map_, size_}, source)});
  } catch (...) {
    if (map_) ::munmap(const_cast<std::byte*>(map_), size_);
    throw;
  }
}

MappedFile::~MappedFile() {
  if (map_) ::munmap(const_cast<std::byte*>(map_), size_);
}

std::vector<std::string> MappedFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, entry] : parsed_->header.entries) out.push_back(name);
  return out;
}

bool MappedFile::contains(std::string_view name) const {
  return parsed_->header.entries.find(name) != parsed_->header.entries.end();
}

const Entry& MappedFile::entry(std::string_view name) const {
  const auto at = parsed_->header.entries.find(name);
  if (at == parsed_->header.entries.end()) bad(path_.string(), "no tensor named '", name, "'");
  return at->second;
}

const Metadata& MappedFile::metadata() const { return parsed_->header.metadata; }

std::span<const std::byte> MappedFile::bytes(std::string_view name) const {
  const Entry& e = entry(name);
  return {map_ + parsed_->header.data_start + e.begin, static_cast<std::size_t>(e.end - e.begin)};
}

AnyTensor MappedFile::tensor(std::string_view name, Device device) const {
  return copy_out(entry(name), map_ + parsed_->header.data_start, device);
}

}  // namespace tapegrad::safetensors
