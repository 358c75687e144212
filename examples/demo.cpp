// The demo: trains a small LayerNorm -> Dense -> GELU -> Dense regressor on synthetic data with plain SGD,
// printing the loss as it falls, then gradchecks the same model in double precision.
//
//   demo [cpu|cuda]
#include <cstdio>
#include <string>
#include <vector>

#include "tapegrad.hpp"

using namespace tapegrad;

namespace {

template <class T> struct Model {
  Var<T> gamma, beta, w1, b1, w2, b2;

  static Model init(std::int64_t in, std::int64_t hidden, std::uint64_t seed) {
    const double scale1 = 1.0 / std::sqrt(double(in)), scale2 = 1.0 / std::sqrt(double(hidden));
    return {param(ones<T>({in})),        param(zeros<T>({in})),
            param(randn<T>({in, hidden}, seed, 0.0, scale1)), param(zeros<T>({hidden})),
            param(randn<T>({hidden, 1}, seed + 1, 0.0, scale2)), param(zeros<T>({1}))};
  }
  std::vector<Var<T>*> parameters() { return {&gamma, &beta, &w1, &b1, &w2, &b2}; }

  Var<T> operator()(const Var<T>& x) const {
    Var<T> h = gelu(matmul(layernorm(x, gamma, beta), w1) + b1);
    return matmul(h, w2) + b2;
  }
};

// y = tanh(x · w) + 0.1·x₀²: smooth, nonlinear, and learnable by the model.
template <class T> Tensor<T> make_targets(const Tensor<T>& x, std::uint64_t seed) {
  NoGradGuard no_grad;
  const auto w = constant(randn<T>({x.dim(1), 1}, seed));
  Var<T> x0 = slice(constant(x), 1, 0, 1);
  Var<T> y = tanh(matmul(constant(x), w)) + square(x0) * 0.1;
  return y.value();
}

void sgd_step(std::vector<Var<float>*> params, std::vector<Tensor<float>>& velocity, float lr, float momentum) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    Tensor<float> value = params[i]->value();  // a handle: updates the parameter in place
    const Tensor<float>& grad = params[i]->grad();
    for (std::int64_t e = 0; e < value.numel(); ++e) {
      velocity[i].flat(e) = momentum * velocity[i].flat(e) + grad.flat(e);
      value.flat(e) -= lr * velocity[i].flat(e);
    }
    params[i]->zero_grad();
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string device = argc > 1 ? argv[1] : "cpu";
  if (device != "cpu") {
    std::fprintf(stderr, "demo: device '%s' is not available: this build runs on the cpu only so far\n",
                 device.c_str());
    return 2;
  }
  constexpr std::int64_t samples = 512, features = 16, hidden = 64;
  const Tensor<float> x = randn<float>({samples, features}, 7);
  const Var<float> inputs = constant(x), targets = constant(make_targets(x, 8));

  Model<float> model = Model<float>::init(features, hidden, 9);
  std::int64_t count = 0;
  for (auto* p : model.parameters()) count += p->numel();
  std::printf("model: layernorm(%ld) -> dense(%ld -> %ld) -> gelu -> dense(%ld -> 1): %ld parameters\n",
              features, features, hidden, hidden, count);

  std::vector<Tensor<float>> velocity;
  for (auto* p : model.parameters()) velocity.push_back(zeros<float>(p->shape()));
  Tape& tape = Tape::active();
  for (int step = 0; step <= 300; ++step) {
    Var<float> loss = mse_loss(model(inputs), targets);
    backward(loss);
    if (step % 30 == 0) std::printf("step %3d  loss %.5f  (tape: %zu nodes)\n", step, loss.value().item(), tape.size());
    sgd_step(model.parameters(), velocity, 0.05f, 0.9f);
    tape.clear();
  }

  // The same model in double, checked against central differences.
  Model<double> small = Model<double>::init(6, 5, 11);
  const Tensor<double> xs = randn<double>({4, 6}, 12), ys = randn<double>({4, 1}, 13);
  const GradcheckResult check = gradcheck(
      [&](const std::vector<Var<double>>& p) {
        Model<double> m{p[0], p[1], p[2], p[3], p[4], p[5]};
        return mse_loss(m(constant(xs)), constant(ys));
      },
      {small.gamma.value(), small.beta.value(), small.w1.value(), small.b1.value(), small.w2.value(),
       small.b2.value()});
  std::printf("%s\n", check.report.c_str());
  return check ? 0 : 1;
}
