// The demo: a small transformer-style regressor (two residual LayerNormMLP blocks and a linear head) trained with
// AdamW on synthetic data it generates, printing the model summary and the loss as it falls; then the trained
// first block, in double on the cpu, is gradchecked against central differences.
//
//   demo [cpu|cuda|cuda:N]     where to train (default cpu); a device that cannot be used exits with status 2
#include <cstdio>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.hpp>

using namespace tapegrad;

namespace {

// x [N, D] -> [N, 1]: h = x + mlp0(x); h = h + mlp1(h); y = head(h).
template <class P> class ResidualMLP : public nn::Module {
 public:
  ResidualMLP(std::int64_t features, const nn::LayerNormMLPConfig& block, std::uint64_t seed, Device device)
      : Module("ResidualMLP", device),
        block0_(features, block, nn::derive_seed(seed, "block0"), device),
        block1_(features, block, nn::derive_seed(seed, "block1"), device),
        head_(features, {.features = 1}, nn::derive_seed(seed, "head"), device) {
    add_child("block0", block0_);
    add_child("block1", block1_);
    add_child("head", head_);
  }

  template <class T> Var<T> operator()(const Var<T>& x) const {
    return traced(
        [this](const Var<T>& x) {
          const Var<T> h = x + block0_(x);
          return head_(Var<T>(h + block1_(h)));
        },
        x);
  }

  const nn::LayerNormMLP<P>& block0() const { return block0_; }

 private:
  nn::LayerNormMLP<P> block0_, block1_;
  nn::Dense<P> head_;
};

// y = tanh(2·x₀·x₁) + tanh(x · w): smooth, nonlinear, with an interaction a linear model cannot fit.
Tensor<float> make_targets(const Tensor<float>& x, std::uint64_t seed) {
  NoGradGuard no_grad;
  const Var<float> inputs = constant(x);
  const Var<float> x0 = slice(inputs, 1, 0, 1), x1 = slice(inputs, 1, 1, 2);
  const Var<float> w = constant(randn<float>({x.dim(1), 1}, seed, 0.0, 0.5));
  const Var<float> y = tanh(x0 * x1 * 2.0) + tanh(matmul(inputs, w));
  return y.value();
}

int train(Device device) {
  // Allocating on the device throws, saying why, when it cannot be used: before any work, not in the middle.
  (void)Tensor<float>({1}, device);
  std::printf("training on %s\n", device.str().c_str());
  constexpr std::int64_t samples = 512, features = 16;
  const nn::LayerNormMLPConfig block{.intermediate_dim = 64, .activation = Activation::swiglu};
  const Tensor<float> x = randn<float>({samples, features}, 7);
  const Var<float> inputs = constant(x.to(device)), targets = constant(make_targets(x, 8).to(device));

  ResidualMLP<float> model(features, block, /*seed=*/9, device);
  std::printf("%s\n", nn::summary(model, x.to(device)).c_str());

  optim::AdamW optimizer(model.parameters(), {.lr = 3e-3, .weight_decay = 1e-4});
  Tape& tape = Tape::active();
  for (int step = 0; step <= 300; ++step) {
    Var<float> loss = mse_loss(model(inputs), targets);
    backward(loss);
    if (step % 30 == 0) {
      std::printf("step %3d  loss %.3e  (tape: %zu nodes)\n", step, loss.value().to(Device::cpu()).item(),
                  tape.size());
    }
    optimizer.step();
    optimizer.zero_grad();
    tape.clear();
  }

  // The trained first block, in double: its layernorm_mlp node against central differences, with respect to the
  // input and every parameter.
  nn::LayerNormMLP<double> check_block(features, block, 0);
  std::vector<Tensor<double>> values{randn<double>({4, features}, 12)};
  for (const nn::NamedParameter& p : model.block0().parameters()) {
    values.push_back(cast<double>(std::get<Var<float>>(p.var).value().to(Device::cpu())));
  }
  const nn::ParameterList paths = check_block.parameters();
  const GradcheckResult result = gradcheck(
      [&](const std::vector<Var<double>>& in) {
        for (std::size_t i = 0; i < paths.size(); ++i) check_block.set_parameter(paths[i].path, in[i + 1]);
        return check_block(in[0]);
      },
      values);
  std::printf("gradcheck of the trained block0 in double: %s\n", result.report.c_str());
  return result ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return train(Device::parse(argc > 1 ? argv[1] : "cpu"));
  } catch (const Error& e) {
    std::fprintf(stderr, "demo: %s\n", e.what());
    return 2;
  }
}
