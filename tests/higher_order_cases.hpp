// The op families' twice-differentiable functions, as tables (a name, f, the input shapes): gradgradcheck runs them
// on the cpu (test_higher_order.cpp), and the GPU's second derivatives are compared with the cpu's on them
// (test_gpu_higher_order.cpp).
#pragma once

#include <functional>
#include <vector>

#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

namespace tapegrad::higher_order_test {

using Inputs = std::vector<Var<double>>;
using F = std::function<Var<double>(const Inputs&)>;
using test::fresh_seed;

// Values away from zero, where the ops below are smooth (relu, abs and max have kinks there).
inline Tensor<double> away_from_zero(const Shape& shape, std::uint64_t seed) {
  Tensor<double> t = rand_uniform<double>(shape, seed, 0.3, 1.2);
  const Tensor<double> sign = rand_uniform<double>(shape, seed + 1, -1.0, 1.0);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.flat(i) *= sign.flat(i) < 0 ? -1.0 : 1.0;
  return t;
}

struct Case {
  const char* name;
  F f;
  std::vector<Shape> shapes;
  bool positive = false;  // inputs in (0.3, 1.2): log, sqrt, pow, division
};

// Fresh inputs for a case, on the cpu.
inline std::vector<Tensor<double>> inputs_for(const Case& c, std::uint64_t seed) {
  std::vector<Tensor<double>> inputs;
  for (std::size_t k = 0; k < c.shapes.size(); ++k) {
    inputs.push_back(c.positive ? rand_uniform<double>(c.shapes[k], seed + k, 0.3, 1.2)
                                : away_from_zero(c.shapes[k], seed + 10 * k));
  }
  return inputs;
}

// x + step·v, input by input.
inline std::vector<Tensor<double>> moved(const std::vector<Tensor<double>>& x, const std::vector<Tensor<double>>& v,
                                         double step) {
  std::vector<Tensor<double>> out;
  for (std::size_t k = 0; k < x.size(); ++k) {
    Tensor<double> t = x[k].clone();
    for (std::int64_t i = 0; i < t.numel(); ++i) t.flat(i) += step * v[k].flat(i);
    out.push_back(t);
  }
  return out;
}

// The Hessian of the scalar f at x applied to v by central differences of its gradient (each from one backward):
// (∇f(x + εv) - ∇f(x - εv)) / 2ε.
inline std::vector<Tensor<double>> numeric_hvp(const F& f, const std::vector<Tensor<double>>& x,
                                               const std::vector<Tensor<double>>& v, double eps = 1e-5) {
  const auto gradient_at = [&](double step) {
    std::vector<Var<double>> in;
    for (const Tensor<double>& t : moved(x, v, step)) in.push_back(param(t));
    return grad({f(in)}, in);
  };
  const std::vector<Var<double>> plus = gradient_at(eps), minus = gradient_at(-eps);
  std::vector<Tensor<double>> hv;
  for (std::size_t k = 0; k < x.size(); ++k) {
    Tensor<double> column(x[k].shape());
    for (std::int64_t i = 0; i < column.numel(); ++i) {
      column.flat(i) = (plus[k].value().flat(i) - minus[k].value().flat(i)) / (2 * eps);
    }
    hv.push_back(column);
  }
  return hv;
}

// f's gradient in its first input, squared and summed (a gradient penalty): its second derivatives are f's third,
// through the recorded backward's own backward.
inline F penalty_of(F f) {
  return [f](const Inputs& in) {
    const Var<double> g = grad({f(in)}, {in[0]}, {.create_graph = true})[0];
    return sum(g * g);
  };
}

inline std::vector<Case> elementwise_cases() {
  return {
      {"x * y + x / y", [](const Inputs& in) { return sum(in[0] * in[1] + in[0] / in[1]); }, {{3, 4}, {3, 4}}, true},
      {"pow, log, sqrt, rsqrt",
       [](const Inputs& in) { return sum(pow(in[0], in[1]) + log(in[0]) * sqrt(in[1]) + rsqrt(in[0])); },
       {{5}, {5}},
       true},
      {"exp, square, abs, scalars",
       [](const Inputs& in) {
         return sum(exp(in[0] * 0.5) * square(in[1]) - abs(in[0]) * 2.0 + 1.5 / (in[1] * in[1] + 1.0));
       },
       {{2, 3}, {2, 3}}},
      {"pow by a scalar, negation", [](const Inputs& in) { return sum(-pow(in[0], 3.0) * in[0]); }, {{6}}, true},
      {"tanh, sigmoid", [](const Inputs& in) { return sum(tanh(in[0]) * sigmoid(in[1] * in[0])); }, {{4}, {4}}},
      {"gelu, gelu_tanh", [](const Inputs& in) { return sum(gelu(in[0]) * gelu_tanh(in[0] * 1.3)); }, {{7}}},
      {"silu, quick_gelu", [](const Inputs& in) { return sum(silu(in[0]) + quick_gelu(in[0]) * in[0]); }, {{7}}},
      {"relu, squared_relu",
       [](const Inputs& in) { return sum(relu(in[0]) * in[0] + squared_relu(in[0]) * in[0]); },
       {{7}}},
      {"broadcast [3, 1] with [4]", [](const Inputs& in) { return sum(exp(in[0] * in[1]) * in[1]); }, {{3, 1}, {4}}},
  };
}

inline std::vector<Case> tensor_cases() {
  return {
      {"matmul", [](const Inputs& in) { return sum(square(matmul(in[0], in[1]))); }, {{3, 4}, {4, 2}}},
      {"batched matmul, broadcast",
       [](const Inputs& in) { return sum(tanh(matmul(in[0], in[1]))); },
       {{2, 3, 4}, {4, 2}}},
      {"matrix · vector", [](const Inputs& in) { return sum(exp(matmul(in[0], in[1]) * 0.3)); }, {{3, 4}, {4}}},
      {"matmul's gradient penalty (third derivatives)",
       penalty_of([](const Inputs& in) { return sum(tanh(matmul(in[0], in[1]))); }),
       {{2, 3, 4}, {4, 2}}},
      {"sum and mean over axes",
       [](const Inputs& in) { return sum(square(sum(in[0], {1}) + mean(in[0] * in[0], {0}, false))); },
       {{3, 3}}},
      {"max", [](const Inputs& in) { return sum(square(max(in[0] * in[0], {1}))); }, {{3, 5}}},
      {"transpose, permute, reshape",
       [](const Inputs& in) {
         return sum(square(reshape(permute(transpose(in[0] * in[0]), {1, 0}), {-1}) * 1.5));
       },
       {{2, 3}}},
      {"slice and concat",
       [](const Inputs& in) {
         return sum(square(concat(Inputs{slice(in[0] * in[1], 1, 0, 4, 2), in[1]}, 1)));
       },
       {{2, 5}, {2, 5}}},
      {"broadcast_to and sum_to",
       [](const Inputs& in) {
         return sum(square(sum_to(broadcast_to(Var<double>(in[0] * in[0]), Shape{3, 4}), Shape{1, 4})));
       },
       {{4}}},
  };
}

// (The integer labels live on `device`, with the inputs.)
inline std::vector<Case> norm_and_loss_cases(Device device = Device::cpu()) {
  const Tensor<std::int64_t> labels = from_vector<std::int64_t>({2, 0, 1}, {3}).to(device);
  return {
      {"softmax", [](const Inputs& in) { return sum(square(softmax(in[0], 0)) * in[1]); }, {{3, 4}, {3, 4}}},
      {"log_softmax", [](const Inputs& in) { return sum(log_softmax(in[0]) * in[1]); }, {{2, 5}, {2, 5}}},
      {"layernorm with beta, zero-centered gamma",
       [](const Inputs& in) {
         return sum(square(layernorm(in[0], in[1], in[2], {.epsilon = 1e-3, .zero_centered_gamma = true})));
       },
       {{3, 4}, {4}, {4}}},
      {"layernorm without beta",
       [](const Inputs& in) { return sum(tanh(layernorm(in[0], in[1], {.epsilon = 1e-3}))); },
       {{2, 5}, {5}}},
      {"rmsnorm",
       [](const Inputs& in) { return sum(square(rmsnorm(in[0], in[1], {.epsilon = 1e-3})) * in[0]); },
       {{3, 4}, {4}}},
      {"layernorm's gradient penalty (third derivatives)",
       penalty_of([](const Inputs& in) {
         return sum(tanh(layernorm(in[0], in[1], in[2], {.epsilon = 1e-3, .zero_centered_gamma = true})) * in[0]);
       }),
       {{3, 4}, {4}, {4}}},
      {"rmsnorm's gradient penalty (third derivatives)",
       penalty_of([](const Inputs& in) { return sum(tanh(rmsnorm(in[0], in[1], {.epsilon = 1e-3})) * in[0]); }),
       {{3, 4}, {4}}},
      {"mse_loss", [](const Inputs& in) { return mse_loss(in[0] * in[0], in[1]); }, {{3, 2}, {3, 2}}},
      {"cross_entropy with labels",
       [labels](const Inputs& in) { return cross_entropy(in[0] * in[1], labels); },
       {{3, 4}, {3, 4}}},
      {"cross_entropy with soft targets",
       [](const Inputs& in) { return cross_entropy(in[0] * in[0], softmax(in[1])); },
       {{2, 3}, {2, 3}}},
  };
}

}  // namespace tapegrad::higher_order_test
