// CUDA graph capture and replay (tensor/gpu/graph.hpp) on a real GPU: replays give the eager results bit for bit, see
// new values written into their inputs, take a whole layernorm_mlp forward and backward, refuse work that waits
// for the device, and give their memory back.
#include <doctest/doctest.h>

#include "tapegrad/tensor/gpu/graph.hpp"
#include "tapegrad/tensor/gpu/memory.hpp"
#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::bitwise_equal;

namespace {

const Device gpu = Device::cuda(0);
const Device host = Device::cpu();

// A few ops of different kinds: a made elementwise kernel, a reduction, a cuBLASLt product.
Tensor<float> some_work(const Tensor<float>& a, const Tensor<float>& b) {
  NoGradGuard no_grad;
  const Var<float> x = constant(a), w = constant(b);
  return eval(matmul(eval(x * w + exp(x)), w) + sum(x, {1}, true)).value();
}

// Overwrites `to` (on the GPU) with the values of `from`, in place.
void overwrite(Tensor<float>& to, const Tensor<float>& from) {
  copy_bytes(to.data(), gpu, from.to(gpu).data(), gpu, static_cast<std::size_t>(to.numel()) * sizeof(float));
}

}  // namespace

TEST_CASE("a captured graph replays the eager result bit for bit, and sees new values of its inputs") {
  Tensor<float> a = randn<float>({256, 256}, 1).to(gpu);
  const Tensor<float> b = randn<float>({256, 256}, 2).to(gpu);
  const Tensor<float> eager = some_work(a, b).to(host);  // also makes the kernels and picks the algorithms

  Tensor<float> y;
  const cuda::Graph graph = cuda::Graph::capture(0, [&] { y = some_work(a, b); });
  CHECK(graph.device() == 0);
  graph.replay();
  CHECK(bitwise_equal(y.to(host), eager));
  graph.replay();
  CHECK(bitwise_equal(y.to(host), eager));

  const Tensor<float> a2 = randn<float>({256, 256}, 3);
  overwrite(a, a2);
  graph.replay();
  CHECK(bitwise_equal(y.to(host), some_work(a2.to(gpu), b).to(host)));
}

TEST_CASE("a captured layernorm_mlp forward and backward replays the eager output and gradients") {
  const std::int64_t M = 64, H = 128, F = 512;
  const Var<bf16> x = param(randn<bf16>({M, H}, 10).to(gpu));
  const Var<bf16> gamma = param(randn<bf16>({H}, 11, 1.0, 0.1).to(gpu));
  const Var<bf16> beta = param(randn<bf16>({H}, 12, 0.0, 0.1).to(gpu));
  const MLPKernels<bf16> kernels{param(randn<bf16>({H, 1, F}, 13, 0.0, 0.1).to(gpu)),
                                 param(randn<bf16>({F, H}, 14, 0.0, 0.05).to(gpu))};
  const MLPBiases<bf16> biases{param(randn<bf16>({1, F}, 15, 0.0, 0.1).to(gpu)),
                               param(randn<bf16>({H}, 16, 0.0, 0.1).to(gpu))};
  const Tensor<bf16> dy = randn<bf16>({M, H}, 17).to(gpu);
  const std::vector<Var<bf16>> params{x, gamma, beta, kernels.w1, kernels.w2, biases.b1, biases.b2};
  Tensor<bf16> y;
  const auto step = [&] {
    for (Var<bf16> v : params) v.zero_grad();
    const Var<bf16> out = layernorm_mlp(x, gamma, beta, kernels, biases, {.activation = Activation::gelu}).y;
    backward(out, dy);
    y = out.value();
    Tape::active().clear();
  };
  step();  // eager
  const Tensor<bf16> eager_y = y.to(host);
  std::vector<Tensor<bf16>> eager_grads;
  for (const Var<bf16>& v : params) eager_grads.push_back(v.grad().to(host));

  const cuda::Graph graph = cuda::Graph::capture(0, step);
  for (int replay = 0; replay < 2; ++replay) {
    graph.replay();
    CHECK(bitwise_equal(y.to(host), eager_y));
    for (std::size_t k = 0; k < params.size(); ++k) {
      CAPTURE(k);
      CHECK(bitwise_equal(params[k].grad().to(host), eager_grads[k]));
    }
  }
}

TEST_CASE("capturing work that waits for the device throws, and the stream works afterwards") {
  const Tensor<float> a = randn<float>({1000}, 20).to(gpu);
  CHECK_THROWS_AS(cuda::Graph::capture(0, [&] { (void)a.to(host); }), Error);
  CHECK(bitwise_equal(a.to(host), randn<float>({1000}, 20)));
}

TEST_CASE("a graph's memory goes back once the graph and the tensors it made are gone") {
  cuda::synchronize(0);
  const std::size_t before = cuda::memory_stats(0).in_use;
  {
    const Tensor<float> a = randn<float>({512, 512}, 30).to(gpu), b = randn<float>({512, 512}, 31).to(gpu);
    (void)some_work(a, b);
    Tensor<float> y;
    {
      const cuda::Graph graph = cuda::Graph::capture(0, [&] { y = some_work(a, b); });
      graph.replay();
    }
    CHECK(y.to(host).numel() == 512 * 512);  // the graph is gone, its output still readable
  }
  cuda::synchronize(0);
  CHECK(cuda::memory_stats(0).in_use == before);
}
