// Files other tools wrote and read. PyTorch's fixtures (tests/fixtures/make_torch_mlp.py: a LayerNorm-MLP block with
// its input and PyTorch's output) load and reproduce PyTorch's output, from PyTorch's names and [out, in] layout and
// from TransformerEngine-JAX's LayerNormMLP names and layout (through nn::LayerNormMLP's state dict); a file tapegrad
// writes is read back by Python (tests/fixtures/read_safetensors.py: the safetensors package where installed, else
// its own reader).
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <type_traits>

#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
namespace fs = std::filesystem;

namespace {

fs::path fixtures() {
  const char* source = std::getenv("TAPEGRAD_TESTS_SOURCE");
  REQUIRE_MESSAGE(source != nullptr, "set TAPEGRAD_TESTS_SOURCE to the tests folder (meson test does)");
  return fs::path(source) / "fixtures";
}

// The largest |got - want| over the elements, relative to the largest |want|.
double relative_error(const Tensor<double>& got, const Tensor<double>& want) {
  double diff = 0, scale = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    diff = std::max(diff, std::abs(got.flat(i) - want.flat(i)));
    scale = std::max(scale, std::abs(want.flat(i)));
  }
  return diff / scale;
}

Var<double> as_param(const safetensors::File& file, const std::string& name, const Shape& shape) {
  return param(cast<double>(file.tensors.at(name).get<float>()).reshape(shape));
}

}  // namespace

TEST_CASE("PyTorch's LayerNorm-MLP weights, in its names and [out, in] layout, reproduce its output") {
  const safetensors::File file = safetensors::load(fixtures() / "torch_mlp.safetensors");
  CHECK(file.metadata.at("format") == "pt");
  const Tensor<double> x = cast<double>(file.tensors.at("x").get<float>());
  const Tensor<double> want = file.tensors.at("y").get<double>();
  const std::int64_t hidden = x.dim(1), ffn = file.tensors.at("fc1.bias").shape().dim(0);
  // PyTorch's Linear keeps [out, in]; layernorm_mlp's kernels are [in, (n,) out].
  const Var<double> w1 = reshape(transpose(as_param(file, "fc1.weight", {ffn, hidden})), {hidden, 1, ffn});
  const Var<double> w2 = transpose(as_param(file, "fc2.weight", {hidden, ffn}));
  const Var<double> y =
      layernorm_mlp(constant(x), as_param(file, "ln.weight", {hidden}), as_param(file, "ln.bias", {hidden}),
                    MLPKernels<double>{w1, w2},
                    MLPBiases<double>{as_param(file, "fc1.bias", {1, ffn}), as_param(file, "fc2.bias", {hidden})})
          .y;
  // The same f32 weights in f64 on both sides: only the order of the sums differs.
  CHECK(relative_error(y.value(), want) < 1e-13);
}

TEST_CASE("TransformerEngine-JAX's LayerNormMLP layout loads into nn::LayerNormMLP and reproduces the output") {
  safetensors::File file = safetensors::load(fixtures() / "te_jax_mlp.safetensors");
  const Tensor<float> x = file.tensors.at("x").get<float>();
  const Tensor<double> want = file.tensors.at("y").get<double>();
  file.tensors.erase("x");
  file.tensors.erase("y");
  nn::LayerNormMLP<float> mlp(8, {.intermediate_dim = 16}, 1);  // TE's defaults: LayerNorm, GELU (tanh), biases
  mlp.load_state_dict(file.tensors);
  // f32 parameters and compute against PyTorch's f64: within f32's rounding over sums of 8 and 16 terms.
  CHECK(relative_error(cast<double>(mlp(constant(x)).value()), want) < 1e-5);
  nn::LayerNormMLP<double> wide(8, {.intermediate_dim = 16}, 1);
  wide.load_state_dict(file.tensors, {.cast = true});
  CHECK(relative_error(wide(constant(cast<double>(x))).value(), want) < 1e-13);
}

TEST_CASE("a file tapegrad writes is read back by Python") {
  safetensors::TensorMap tensors;
  const auto values = [](auto tag, const Shape& shape) {
    using T = decltype(tag);
    Tensor<T> t(shape);
    for (std::int64_t k = 0; k < t.numel(); ++k) {
      t.flat(k) = std::is_integral_v<T> ? static_cast<T>(k - 3) : convert<T>(static_cast<double>(k) * 0.5 - 3);
    }
    return t;
  };
  tensors.emplace("a.f64", values(double{}, {2, 3}));
  tensors.emplace("b.f32", values(float{}, {4}));
  tensors.emplace("c.bf16", values(bf16{}, {3, 2}));
  tensors.emplace("d.f16", values(f16{}, {5}));
  tensors.emplace("e.i32", values(std::int32_t{}, {2, 2}));
  tensors.emplace("f.i64", values(std::int64_t{}, {3}));
  tensors.emplace("g.scalar", values(float{}, {}));
  const fs::path path = fs::temp_directory_path() / ("tapegrad-interop-" + std::to_string(::getpid()) + ".safetensors");
  safetensors::save(path, tensors, {{"writer", "tapegrad"}});
  const std::string command = "python3 '" + (fixtures() / "read_safetensors.py").string() + "' '" + path.string() + "'";
  const int status = std::system(command.c_str());
  fs::remove(path);
  CHECK(status == 0);
}
