// Checkpoints on the GPU: safetensors files read into device memory straight from the host mapping, bitwise what
// was saved from the device; a module and its optimizer on the GPU, stopped and resumed from their files (and a
// file saved from the CPU loaded into the GPU module), end bitwise where the uninterrupted run does.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "gpu_reference.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::gpu;
namespace fs = std::filesystem;

namespace {

fs::path temporary(const std::string& name) {
  return fs::temp_directory_path() / ("tapegrad-gpu-" + std::to_string(::getpid()) + "-" + name);
}

bool same_bits(const AnyTensor& a, const AnyTensor& b) {
  const AnyTensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  return ha.dtype() == hb.dtype() && ha.shape() == hb.shape() && std::memcmp(ha.data(), hb.data(), ha.bytes()) == 0;
}

}  // namespace

TEST_CASE("safetensors files save device tensors and load into device memory bitwise") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  const safetensors::TensorMap tensors = {{"w", randn<bf16>({64, 33}, seed).to(gpu)},
                                          {"b", randn<float>({33}, seed + 1).to(gpu)},
                                          {"q", cast<f8e4m3>(randn<float>({5, 7}, seed + 2)).to(gpu)},
                                          {"host", randn<double>({3}, seed + 3)}};
  const fs::path path = temporary("tensors.safetensors");
  safetensors::save(path, tensors);
  const safetensors::File loaded = safetensors::load(path, gpu);
  const safetensors::MappedFile mapped(path);
  for (const auto& [name, tensor] : tensors) {
    CAPTURE(name);
    CHECK(loaded.tensors.at(name).device() == gpu);
    CHECK(same_bits(loaded.tensors.at(name), tensor));
    CHECK(same_bits(mapped.tensor(name, gpu), tensor));
  }
  fs::remove(path);
}

TEST_CASE("a GPU module and its optimizer resumed from their files end bitwise where the uninterrupted run does") {
  const Tensor<float> x = randn<float>({16, 32}, 1).to(gpu), target = randn<float>({16, 32}, 2).to(gpu);
  const auto train = [&](const nn::LayerNormMLP<bf16>& mlp, optim::AdamW& optimizer, int steps) {
    for (int i = 0; i < steps; ++i) {
      optimizer.zero_grad();
      backward(mse_loss(mlp(constant(x)), constant(target)));
      optimizer.step();
      Tape::active().clear();
    }
  };
  const nn::LayerNormMLPConfig config{.intermediate_dim = 64, .fp8 = fp8::DelayedScaling{.amax_history_len = 4}};
  nn::LayerNormMLP<bf16> uninterrupted(32, config, 3, gpu);
  optim::AdamW first(uninterrupted.parameters(), {.lr = 1e-2});
  train(uninterrupted, first, 3);
  const fs::path model = temporary("model.safetensors"), state = temporary("optim.safetensors");
  nn::save(uninterrupted, model);
  safetensors::save(state, first.state_dict());
  train(uninterrupted, first, 3);

  nn::LayerNormMLP<bf16> resumed(32, config, 4, gpu);
  optim::AdamW second(resumed.parameters(), {.lr = 1e-2});
  nn::load(resumed, model);
  second.load_state_dict(safetensors::load(state).tensors);  // host tensors: copied to each parameter's device
  train(resumed, second, 3);
  const nn::StateDict a = uninterrupted.state_dict(), b = resumed.state_dict();
  for (const auto& [path, value] : a) {
    CAPTURE(path);
    CHECK(same_bits(b.at(path), value));
  }

  // A checkpoint saved from the CPU loads into the GPU module, which keeps its device.
  const nn::LayerNormMLP<bf16> on_cpu(32, config, 5);
  nn::save(on_cpu, model);
  nn::load(resumed, model);
  CHECK(resumed.wi_kernel().device() == gpu);
  CHECK(same_bits(resumed.wi_kernel().value(), on_cpu.wi_kernel().value()));
  fs::remove(model);
  fs::remove(state);
}
