// safetensors files (tensor/io/safetensors.hpp): every dtype round-trips bitwise through a file and through memory,
// the bytes are the format's to the byte, the mapped reader hands out one tensor at a time, every kind of broken
// or hostile file is refused with an Error naming the file and the problem, and a writer killed mid-write leaves the
// old file whole (tensor/io/detail/atomic_file.hpp).
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "support.hpp"
#include "tapegrad/tapegrad.hpp"
#include "tapegrad/tensor/io/detail/atomic_file.hpp"
#include "tapegrad/tensor/io/safetensors.hpp"

using namespace tapegrad;
namespace fs = std::filesystem;

namespace {

// A fresh folder under the system's temporary one, removed with its contents at the end of the test case.
struct Folder {
  fs::path path;
  Folder() {
    std::string pattern = (fs::temp_directory_path() / "tapegrad-safetensors-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~Folder() { fs::remove_all(path); }
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::span<const std::byte> as_bytes(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

// A file of the given header text and data bytes.
std::string file_of(const std::string& header, std::size_t data_bytes = 0) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
  return out + header + std::string(data_bytes, '\x01');
}

// Random bits for every element (integers, floats and fp8 codes alike: NaNs and infinities too).
template <class T> Tensor<T> random_bits(const Shape& shape, std::mt19937_64& rng) {
  Tensor<T> t(shape);
  auto* bytes = reinterpret_cast<unsigned char*>(t.data());
  for (std::size_t i = 0; i < static_cast<std::size_t>(t.numel()) * sizeof(T); ++i) bytes[i] = rng() & 0xff;
  return t;
}

bool same_bits(const AnyTensor& a, const AnyTensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.device() == b.device() &&
         (a.bytes() == 0 || std::memcmp(a.data(), b.data(), a.bytes()) == 0);
}

}  // namespace

TEST_CASE("every dtype round-trips bitwise through a safetensors file, memory and the mapped reader") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const safetensors::TensorMap tensors = {
      {"f64", random_bits<double>({3, 5}, rng)},
      {"f32", random_bits<float>({2, 3, 4}, rng)},
      {"bf16", random_bits<bf16>({7}, rng)},
      {"f16", random_bits<f16>({4, 1}, rng)},
      {"i32", random_bits<std::int32_t>({6}, rng)},
      {"i64", random_bits<std::int64_t>({2, 2}, rng)},
      {"fp8.e4m3", random_bits<f8e4m3>({9}, rng)},
      {"fp8.e5m2", random_bits<f8e5m2>({3, 3}, rng)},
      {"scalar", random_bits<float>({}, rng)},
      {"empty", Tensor<float>(Shape{0, 4})},
      {"attn.qkv.kernel", random_bits<bf16>({4, 3, 2}, rng)},
  };
  const safetensors::Metadata metadata = {{"format", "pt"}, {"note", "grüße, ✓"}};
  Folder folder;
  const fs::path path = folder.path / "model.safetensors";
  safetensors::save(path, tensors, metadata);
  CHECK(read_file(path) == safetensors::serialize(tensors, metadata));

  const safetensors::File loaded = safetensors::load(path);
  const safetensors::File from_memory = safetensors::deserialize(as_bytes(read_file(path)));
  CHECK(loaded.metadata == metadata);
  CHECK(from_memory.metadata == metadata);
  REQUIRE(loaded.tensors.size() == tensors.size());
  for (const auto& [name, tensor] : tensors) {
    CAPTURE(name);
    CHECK(same_bits(loaded.tensors.at(name), tensor));
    CHECK(same_bits(from_memory.tensors.at(name), tensor));
  }

  const safetensors::MappedFile mapped(path);
  CHECK(mapped.names().size() == tensors.size());
  CHECK(mapped.contains("f32"));
  CHECK_FALSE(mapped.contains("f33"));
  CHECK(mapped.entry("f32").dtype == DType::f32);
  CHECK(mapped.entry("f32").shape == Shape{2, 3, 4});
  CHECK(mapped.bytes("f32").size() == 2 * 3 * 4 * 4);
  CHECK(std::memcmp(mapped.bytes("i64").data(), tensors.at("i64").data(), 32) == 0);
  CHECK(same_bits(mapped.tensor("bf16"), tensors.at("bf16")));
  CHECK(mapped.tensor("bf16").get<bf16>().shape() == Shape{7});
  CHECK_THROWS_WITH_AS(mapped.tensor("bf16").get<float>("load"), "load: the tensor is bf16, not f32", Error);
  CHECK_THROWS_WITH_AS(mapped.entry("nope"), doctest::Contains("model.safetensors: no tensor named 'nope'"), Error);
}

TEST_CASE("a safetensors file's bytes are the format's: length, sorted JSON header padded to 8, data in name order") {
  const Tensor<float> a = from_vector<float>({1.0f, -2.0f}, {2});
  const Tensor<std::int64_t> b = from_vector<std::int64_t>({7}, {1});
  const std::string bytes = safetensors::serialize({{"b", b}, {"a", a}}, {{"k", "v"}});
  const std::string header =
      R"({"__metadata__":{"k":"v"},"a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]},)"
      R"("b":{"data_offsets":[8,16],"dtype":"I64","shape":[1]}})";
  const std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  std::string data(16, '\0');
  std::memcpy(data.data(), a.data(), 8);
  std::memcpy(data.data() + 8, b.data(), 8);
  CHECK(bytes == file_of(padded) + data);
}

TEST_CASE("broken and hostile safetensors files are refused naming the file and the problem") {
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  struct Case {
    const char* what;
    std::string bytes;
    const char* message;
  };
  std::string huge_length(8, '\0');
  huge_length[4] = 1;  // 2^32 bytes of header
  std::string past_end = file_of("{}");
  past_end[0] = 100;
  const Case cases[] = {
      {"too short", "abc", "the file is 3 bytes, too short for the 8-byte header length"},
      {"header over the limit", huge_length + "{}",
       "the header length 4294967296 is over the limit of 100000000 bytes"},
      {"header past the end", past_end, "the header length 100 runs past the end of the file (10 bytes)"},
      {"malformed JSON", file_of("{\"t\":"),
       "the header is not valid JSON: parse error at line 1, column 6: syntax error while parsing value - unexpected "
       "end of input"},
      {"not UTF-8", file_of("{\"t\xff\":{}}"),
       "the header is not valid JSON: parse error at line 1, column 4: syntax error while parsing object key - "
       "invalid string: ill-formed UTF-8 byte"},
      {"not an object", file_of("[1, 2]"), "the header is a JSON array, not an object"},
      {"number past a double", file_of(R"({"t":{"dtype":"F32","shape":1e400}})"),
       "the header is not valid JSON: number overflow parsing '1e400'"},
      {"duplicate names", file_of("{" + ok_entry + "," + ok_entry + "}", 8), "the header names 't' twice"},
      {"unknown dtype", file_of(R"({"t":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}})", 1),
       "tensor 't' has dtype 'BOOL', which tapegrad has no type for"},
      {"missing field", file_of(R"({"t":{"dtype":"F32","shape":[1]}})", 4), "tensor 't' has no data_offsets"},
      {"negative size", file_of(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
       "tensor 't': shape holds -1, not a count"},
      {"fractional size", file_of(R"({"t":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
       "tensor 't': shape holds 1.5, not a count"},
      {"rank over 8", file_of(R"({"t":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})", 4),
       "tensor 't': shape must be an array of at most 8 sizes"},
      {"elements past int64",
       file_of(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})"),
       "tensor 't': shape [4294967296,4294967296,0] has more elements than an int64 counts"},
      {"bytes past 2^64", file_of(R"({"t":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})"),
       "tensor 't': shape [4611686018427387904] takes more bytes than a file can hold"},
      {"shape against offsets", file_of(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       "tensor 't': shape [3] of F32 takes 12 bytes, but data_offsets [0, 8] hold 8"},
      {"offsets reversed", file_of(R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
       "tensor 't': data_offsets [8, 0] end before they begin"},
      {"overlap",
       file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
               8),
       "tensor 'b' at data_offsets [4, 8] overlaps the tensor before it (which ends at 8)"},
      {"gap", file_of(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
       "the data has a gap at bytes [0, 4) before tensor 't'"},
      {"outside the data", file_of("{" + ok_entry + "}", 4),
       "tensor 't' at data_offsets [0, 8] runs past the data's end (4 bytes)"},
      {"bytes after the data", file_of("{" + ok_entry + "}", 12), "the file has 4 bytes after its last tensor's data"},
      {"metadata not strings", file_of(R"({"__metadata__":{"n":1}})"), "__metadata__ 'n' is number, not a string"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const std::string expected = std::string("safetensors: bad.safetensors: ") + c.message;
    CHECK_THROWS_WITH_AS(safetensors::deserialize(as_bytes(c.bytes), "bad.safetensors"),
                         doctest::Contains(expected.c_str()), Error);
  }
  // The same checks through a file.
  Folder folder;
  const fs::path path = folder.path / "bad.safetensors";
  std::ofstream(path, std::ios::binary) << file_of("{" + ok_entry + "," + ok_entry + "}", 8);
  CHECK_THROWS_WITH_AS(safetensors::MappedFile{path}, doctest::Contains("bad.safetensors: the header names 't' twice"),
                       Error);
  CHECK_THROWS_WITH_AS(safetensors::load(folder.path / "missing.safetensors"),
                       doctest::Contains("missing.safetensors: cannot open: No such file or directory"), Error);
  CHECK_THROWS_WITH_AS(safetensors::load(folder.path), doctest::Contains("not a regular file"), Error);
  std::ofstream(path, std::ios::binary | std::ios::trunc).flush();
  CHECK_THROWS_WITH_AS(safetensors::load(path), doctest::Contains("the file is 0 bytes"), Error);
  // What cannot be written is refused by name, and nothing is written.
  CHECK_THROWS_WITH_AS(safetensors::save(folder.path / "x.safetensors", {{"w", Tensor<float>()}}),
                       "safetensors: tensor 'w' is undefined", Error);
  CHECK_THROWS_WITH_AS(safetensors::serialize({{"__metadata__", Tensor<float>(Shape{1})}}),
                       doctest::Contains("'__metadata__' is the format's own key"), Error);
  CHECK_FALSE(fs::exists(folder.path / "x.safetensors"));
}

TEST_CASE("a checkpoint writer killed mid-write, or failing, leaves the old file whole") {
  Folder folder;
  const fs::path path = folder.path / "ckpt.safetensors";
  const safetensors::TensorMap old_tensors = {{"w", from_vector<float>({1, 2, 3}, {3})}};
  safetensors::save(path, old_tensors);
  const std::string old_bytes = read_file(path);

  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // the writer: half its new contents written, it tells the parent and waits to be killed
    ::close(ready[0]);
    io::write_atomically(
        path,
        [&](io::FileSink& sink) {
          const std::string half(1 << 20, 'x');
          sink.write(half.data(), half.size());
          const char done = 1;
          if (::write(ready[1], &done, 1) != 1) ::_exit(2);
          for (;;) ::pause();
        },
        "test");
    ::_exit(3);
  }
  ::close(ready[1]);
  char done = 0;
  REQUIRE(::read(ready[0], &done, 1) == 1);
  ::close(ready[0]);
  ::kill(child, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(read_file(path) == old_bytes);
  CHECK(safetensors::load(path).tensors.at("w").get<float>().to_vector() == std::vector<float>{1, 2, 3});
  // The killed writer's temporary file is left beside it, under another name.
  int leftovers = 0;
  for (const auto& entry : fs::directory_iterator(folder.path)) {
    leftovers += entry.path().filename().string().starts_with(".ckpt.safetensors.tmp-");
  }
  CHECK(leftovers == 1);

  // An exception while writing: the old file stays, the temporary goes.
  for (const auto& entry : fs::directory_iterator(folder.path)) {
    if (entry.path() != path) fs::remove(entry.path());
  }
  CHECK_THROWS_WITH_AS(io::write_atomically(
                           path,
                           [](io::FileSink& sink) {
                             sink.write("partial", 7);
                             throw Error("test: the writer failed");
                           },
                           "test"),
                       "test: the writer failed", Error);
  CHECK(read_file(path) == old_bytes);
  CHECK(std::distance(fs::directory_iterator(folder.path), fs::directory_iterator()) == 1);
  // A folder that does not exist: named in the error.
  CHECK_THROWS_WITH_AS(safetensors::save(folder.path / "no" / "x.safetensors", old_tensors),
                       doctest::Contains("safetensors::save: cannot create a temporary file beside"), Error);
}

TEST_CASE("every input the fuzzer kept is read or refused with an Error") {
  const char* source = std::getenv("TAPEGRAD_TESTS_SOURCE");
  REQUIRE_MESSAGE(source != nullptr, "set TAPEGRAD_TESTS_SOURCE to the tests folder (meson test does)");
  int inputs = 0, refused = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(source) / "fuzz" / "corpus")) {
    const std::string bytes = read_file(entry.path());
    try {
      safetensors::deserialize(as_bytes(bytes), entry.path().filename().string());
    } catch (const Error&) {
      ++refused;
    }
    ++inputs;
  }
  CHECK(inputs > 0);
  MESSAGE(inputs, " inputs, ", refused, " refused");
}
