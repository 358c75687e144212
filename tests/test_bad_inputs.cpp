// Every op against one battery of bad inputs: undefined Vars, empty tensors, results too large to count or address,
// NaN and infinity, inputs on another device. A bad call throws tapegrad::Error naming the op; empty and non-finite
// inputs are not bad (the op runs forward and backward). After each case nothing is left allocated, and the same op
// runs forward and backward on good inputs on the same tape. Inputs of the wrong dtype do not compile
// (tests/compile_fail/). A new op joins with one row of `op_rows()`.
#include <doctest/doctest.h>

#include <cmath>
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "core_test_helpers.hpp"
#include "tapegrad/tapegrad.hpp"
#ifdef TAPEGRAD_HAVE_CUDA
#include "tapegrad/tensor/gpu/device.hpp"
#endif

using namespace tapegrad;

namespace {

using Inputs = std::vector<Var<float>>;

struct OpRow {
  std::string name;           // how the op's errors name it
  std::vector<Shape> shapes;  // good inputs, f32 on the cpu
  std::function<Var<float>(const Inputs&)> call;
  std::vector<Shape> empty{};             // inputs with an empty axis that the op takes (none: no such case)
  std::function<void()> overflow{};       // a call whose result has too many elements to count or address
  std::vector<std::size_t> optional{};    // inputs that may be left undefined (an absent beta or bias)
  std::string inner_name{};               // how errors from inside it (sizes, memory) name it, when not `name`
  const std::string& name_inside() const { return inner_name.empty() ? name : inner_name; }
};

constexpr std::int64_t two_to(int k) { return std::int64_t{1} << k; }

Inputs make_inputs(const std::vector<Shape>& shapes, std::uint64_t seed) {
  Inputs in;
  for (const Shape& s : shapes) in.push_back(param(rand_uniform<float>(s, seed++, 0.5, 1.5)));
  return in;
}
Inputs filled_inputs(const std::vector<Shape>& shapes, double value) {
  Inputs in;
  for (const Shape& s : shapes) in.push_back(param(full<float>(s, value)));
  return in;
}
Var<float> empty_var(const Shape& shape) { return param(Tensor<float>(shape)); }

// Runs the op forward and backward (through the sum of its result), and checks that each defined input that
// requires grad received a gradient of its shape.
void forward_and_backward(const OpRow& row, const Inputs& in) {
  const Var<float> y = row.call(in);
  backward(sum(y));
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (!in[i].defined()) continue;
    INFO("input ", i);
    REQUIRE(in[i].grad().defined());
    CHECK(in[i].grad().shape() == in[i].shape());
  }
}

// Checks that `bad` throws tapegrad::Error naming the op `name` and containing `problem`.
void check_refused(const std::string& name, const std::function<void()>& bad, const std::string& problem) {
  try {
    bad();
    FAIL("no error");
  } catch (const Error& e) {
    const std::string what = e.what();
    INFO("message: ", what);
    CHECK(what.starts_with(name + ": "));
    CHECK(what.find(problem) != std::string::npos);
  }
}

std::vector<OpRow> op_rows() {
  const std::vector<Shape> one{{2, 3}}, empty_one{{0, 3}};
  auto unary = [&](std::string name, std::function<Var<float>(const Var<float>&)> f) {
    return OpRow{name + "(x0)", one, [f](const Inputs& x) { return f(x[0]); }, empty_one};
  };
  // [2^32, 1, 0] and [1, 2^32, 0] are empty, but broadcast to [2^32, 2^32, 0]: its dimensions multiply past 2^63.
  // An expression's errors name it in full ("add(x0, x1)"), those from inside it its outermost op ("add").
  auto binary = [](std::string name, std::function<Var<float>(const Var<float>&, const Var<float>&)> f) {
    return OpRow{name + "(x0, x1)", {{2, 3}, {3}}, [f](const Inputs& x) { return f(x[0], x[1]); },
                 {{0, 3}, {3}},
                 [f] { f(empty_var({two_to(32), 1, 0}), empty_var({1, two_to(32), 0})); }, {}, name};
  };
  // Reducing the empty axis of [2^62, 0] leaves 2^62 elements: 2^64 bytes of f32.
  auto reduction = [](std::string name, std::function<Var<float>(const Var<float>&)> f) {
    return OpRow{name, {{2, 3}}, [f](const Inputs& x) { return f(x[0]); }, {{0, 3}},
                 [f] { f(empty_var({two_to(62), 0})); }};
  };
  // Modules are made in each call, so that their parameters (and gradients) go with the case's tape.
  auto dense = [](const Inputs& x) { return nn::Dense<float>(3, {.features = 4}, 1)(x[0]); };
  auto layer_norm = [](const Inputs& x) { return nn::LayerNorm<float>(3, {}, 2)(x[0]); };
  auto mlp = [](const Inputs& x) { return nn::LayerNormMLP<float>(3, {.intermediate_dim = 8}, 3)(x[0]); };
  auto attention = [](const Inputs& x) { return nn::MultiHeadAttention<float>(4, {.num_heads = 2}, 4)(x[0]); };
  const std::vector<Shape> mlp_shapes{{4, 8}, {8}, {8}, {8, 1, 16}, {1, 16}, {16, 8}, {8}};
  std::vector<Shape> mlp_empty = mlp_shapes;
  mlp_empty[0] = {0, 8};
  // x, gamma, beta, w1, b1, w2, b2
  auto mlp_call = [](bool composite) {
    return [composite](const Inputs& x) {
      const MLPKernels<float> kernels{x[3], x[5]};
      const MLPBiases<float> biases{x[4], x[6]};
      return composite ? layernorm_mlp_composite(x[0], x[1], x[2], kernels, biases).y
                       : layernorm_mlp(x[0], x[1], x[2], kernels, biases).y;
    };
  };
  return {
      binary("add", [](const auto& a, const auto& b) { return Var<float>(a + b); }),
      binary("sub", [](const auto& a, const auto& b) { return Var<float>(a - b); }),
      binary("mul", [](const auto& a, const auto& b) { return Var<float>(a * b); }),
      binary("div", [](const auto& a, const auto& b) { return Var<float>(a / b); }),
      binary("pow", [](const auto& a, const auto& b) { return Var<float>(pow(a, b)); }),
      binary("add", [](const auto& a, const auto& b) { return add(a, b); }),
      binary("mul", [](const auto& a, const auto& b) { return mul(a, b); }),
      unary("neg", [](const auto& x) { return Var<float>(-x); }),
      unary("exp", [](const auto& x) { return Var<float>(exp(x)); }),
      unary("log", [](const auto& x) { return Var<float>(log(x)); }),
      unary("sqrt", [](const auto& x) { return Var<float>(sqrt(x)); }),
      unary("rsqrt", [](const auto& x) { return Var<float>(rsqrt(x)); }),
      unary("square", [](const auto& x) { return Var<float>(square(x)); }),
      unary("abs", [](const auto& x) { return Var<float>(abs(x)); }),
      unary("tanh", [](const auto& x) { return Var<float>(tanh(x)); }),
      unary("sigmoid", [](const auto& x) { return Var<float>(sigmoid(x)); }),
      unary("relu", [](const auto& x) { return Var<float>(relu(x)); }),
      unary("gelu", [](const auto& x) { return Var<float>(gelu(x)); }),
      unary("gelu_tanh", [](const auto& x) { return Var<float>(gelu_tanh(x)); }),
      unary("silu", [](const auto& x) { return Var<float>(silu(x)); }),
      unary("quick_gelu", [](const auto& x) { return Var<float>(quick_gelu(x)); }),
      unary("squared_relu", [](const auto& x) { return Var<float>(squared_relu(x)); }),
      unary("mul_scalar", [](const auto& x) { return Var<float>(x * 2.0); }),
      unary("add_scalar", [](const auto& x) { return Var<float>(1.0 + x); }),
      unary("pow_scalar", [](const auto& x) { return Var<float>(pow(x, 3.0)); }),
      reduction("sum", [](const auto& x) { return sum(x, {-1}); }),
      reduction("mean", [](const auto& x) { return mean(x, {-1}, true); }),
      // (max over [2^62, 0]'s empty axis is refused for having no elements, before any size matters)
      {"max", one, [](const Inputs& x) { return max(x[0], {-1}); }, empty_one},
      {"softmax", one, [](const Inputs& x) { return softmax(x[0]); }, empty_one},
      {"log_softmax", one, [](const Inputs& x) { return log_softmax(x[0], 0); }, empty_one},
      {"matmul", {{2, 3}, {3, 4}}, [](const Inputs& x) { return matmul(x[0], x[1]); }, {{0, 3}, {3, 4}},
       [] { matmul(empty_var({two_to(31), 0}), empty_var({0, two_to(31)})); }},  // 2^62 elements: 2^64 bytes
      {"permute", one, [](const Inputs& x) { return permute(x[0], {1, 0}); }, empty_one},
      {"transpose", one, [](const Inputs& x) { return transpose(x[0]); }, empty_one},
      {"reshape", one, [](const Inputs& x) { return reshape(x[0], {-1, 1}); }, empty_one,
       [] { reshape(empty_var({0}), {two_to(32), two_to(32)}); }},
      {"slice", one, [](const Inputs& x) { return slice(x[0], -1, 1, 3); }, empty_one},
      {"concat", {{2, 3}, {1, 3}}, [](const Inputs& x) { return concat(x, 0); }, {{0, 3}, {0, 3}},
       [] { concat(std::vector{empty_var({two_to(62), 0}), empty_var({two_to(62), 0})}, 0); }},
      {"layernorm", {{2, 3}, {3}, {3}}, [](const Inputs& x) { return layernorm(x[0], x[1], x[2]); },
       {{0, 3}, {3}, {3}}},
      {"rmsnorm", {{2, 3}, {3}}, [](const Inputs& x) { return rmsnorm(x[0], x[1]); }, {{0, 3}, {3}}},
      {"mse_loss", {{2, 3}, {2, 3}}, [](const Inputs& x) { return mse_loss(x[0], x[1]); }, {{0, 3}, {0, 3}}},
      {"cross_entropy", {{2, 3}, {2, 3}}, [](const Inputs& x) { return cross_entropy(x[0], x[1]); },
       {{0, 3}, {0, 3}}},
      {"cross_entropy", one,
       [](const Inputs& x) {
         return cross_entropy(x[0], zeros<std::int64_t>({x[0].defined() ? x[0].shape()[0] : 2}));
       },
       empty_one},
      {"cast to f64", one, [](const Inputs& x) { return cast<float>(cast<double>(x[0]) * 2.0); }, empty_one},
      {"layernorm_mlp", mlp_shapes, mlp_call(false), mlp_empty, {}, {2, 4, 6}},
      {"layernorm_mlp_composite", mlp_shapes, mlp_call(true), mlp_empty, {}, {2, 4, 6}},
      {"Dense", one, dense, empty_one},
      {"LayerNorm", one, layer_norm, empty_one},
      {"LayerNormMLP", one, mlp, empty_one},
      {"MultiHeadAttention", {{2, 3, 4}}, attention, {{0, 3, 4}}},
  };
}

// Runs `body` on a tape of its own, checks that it leaves no tensor memory behind, and that the op then runs on
// good inputs on a fresh tape.
template <class Body> void in_isolation(const OpRow& row, Body body) {
  const std::int64_t before = host_memory_stats().in_use_bytes;
  {
    Tape tape;
    const TapeScope scope(tape);
    body();
    forward_and_backward(row, make_inputs(row.shapes, 7));  // the same tape still works after the error
  }
  CHECK(host_memory_stats().in_use_bytes == before);
}

bool gpu_visible() {
#ifdef TAPEGRAD_HAVE_CUDA
  return cuda::device_count() > 0;
#else
  return false;
#endif
}

}  // namespace

TEST_CASE("every op refuses undefined inputs naming the op, and takes an absent optional one") {
  for (const OpRow& row : op_rows()) {
    for (std::size_t i = 0; i < row.shapes.size(); ++i) {
      CAPTURE(row.name);
      CAPTURE(i);
      in_isolation(row, [&] {
        Inputs in = make_inputs(row.shapes, 1);
        in[i] = Var<float>();
        if (std::find(row.optional.begin(), row.optional.end(), i) != row.optional.end()) {
          forward_and_backward(row, in);
        } else {
          check_refused(row.name, [&] { row.call(in); }, "is undefined");
        }
      });
    }
  }
}

TEST_CASE("every op runs forward and backward on empty inputs") {
  for (const OpRow& row : op_rows()) {
    if (row.empty.empty()) continue;
    CAPTURE(row.name);
    in_isolation(row, [&] { forward_and_backward(row, make_inputs(row.empty, 2)); });
  }
}

TEST_CASE("every op refuses a result too large to count or address, before allocating it") {
  for (const OpRow& row : op_rows()) {
    if (!row.overflow) continue;
    CAPTURE(row.name);
    in_isolation(row, [&] { check_refused(row.name_inside(), row.overflow, "2^63 - 1"); });
  }
}

TEST_CASE("every op runs on NaN and infinite values") {
  for (const OpRow& row : op_rows()) {
    for (const double value : {NAN, INFINITY, -INFINITY}) {
      CAPTURE(row.name);
      CAPTURE(value);
      in_isolation(row, [&] { forward_and_backward(row, filled_inputs(row.shapes, value)); });
    }
  }
}

TEST_CASE("every op refuses an input on another device naming the op and both devices") {
  if (!gpu_visible()) {
    MESSAGE("skipped: no GPU visible");
    return;
  }
  for (const OpRow& row : op_rows()) {
    for (std::size_t i = 0; i < row.shapes.size(); ++i) {
      if (row.shapes.size() == 1) break;  // a single input on a GPU is not a mixed-device call
      CAPTURE(row.name);
      CAPTURE(i);
      in_isolation(row, [&] {
        Inputs in = make_inputs(row.shapes, 3);
        in[i] = param(in[i].value().to(Device::cuda(0)));
        check_refused(row.name, [&] { row.call(in); }, "cuda:0");
      });
    }
  }
}
