// Optimizers on the GPU: several steps of SGD (momentum, dampening, Nesterov, weight decay), Adam and AdamW on
// parameters of every dtype and of empty, one-element, odd and large sizes, against the same optimizer on the cpu
// in that dtype (bitwise: both apply cuda/detail/update_rules.hpp with the same roundings) and against the cpu in
// double; bf16 parameters keep f32 state; devices of parameters, gradients and state are checked.
#include <doctest/doctest.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpu_reference.hpp"
#include "momentum_precision.hpp"
#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using namespace tapegrad::optim;
using test::bitwise_equal;
using test::gpu;
using test::Tolerance;

namespace {

const Device host = Device::cpu();
using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(nn::ParameterList)>;

struct NamedOptimizer {
  std::string name;
  MakeOptimizer make;
};

template <class O, class Options> NamedOptimizer named(std::string name, Options options) {
  return {std::move(name), [options](nn::ParameterList p) { return std::make_unique<O>(std::move(p), options); }};
}

// Every option of each optimizer, on and off.
std::vector<NamedOptimizer> optimizers() {
  return {
      named<SGD>("SGD", SGDOptions{.lr = 0.1}),
      named<SGD>("SGD with momentum and weight decay", SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01}),
      named<SGD>("SGD with dampening",
                 SGDOptions{.lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.1}),
      named<SGD>("SGD with Nesterov momentum",
                 SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true}),
      named<Adam>("Adam", AdamOptions{.lr = 0.01}),
      named<Adam>("Adam with weight decay",
                  AdamOptions{.lr = 0.02, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1}),
      named<AdamW>("AdamW", AdamWOptions{.lr = 0.01}),
      named<AdamW>("AdamW with its options",
                   AdamWOptions{.lr = 0.02, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.15}),
  };
}

// Empty, one element, odd, a matrix, and large (prime).
const std::vector<Shape> shapes{{0}, {1}, {7}, {33, 31}, {1000003}};
constexpr int steps = 5;

// The gradient of parameter k at step `step`: drawn on the cpu, so that every device sees the same values.
template <class T> Tensor<T> gradient(const Shape& shape, std::size_t k, int step) {
  return randn<T>(shape, 1000 * static_cast<std::uint64_t>(step) + k);
}

// Trains one parameter of each shape, starting from randn values, with parameters of dtype U on `device` and the
// gradients of dtype T (widened to U). Parameter 0 gets no gradient at step 2 (so it skips that update and counts
// its own steps). `after_step` runs after each step (the double reference rounds its parameters there).
template <class U, class T>
std::vector<Tensor<U>> train(const MakeOptimizer& make, Device device,
                             const std::function<void(std::vector<Var<U>>&)>& after_step = {}) {
  std::vector<Var<U>> vars;
  nn::ParameterList list;
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    vars.push_back(param(cast<U>(randn<T>(shapes[k], 10 + k)).to(device)));
    list.push_back({std::to_string(k), vars.back()});
  }
  const std::unique_ptr<Optimizer> optimizer = make(std::move(list));
  for (int step = 1; step <= steps; ++step) {
    optimizer->zero_grad();
    for (std::size_t k = 0; k < vars.size(); ++k) {
      if (k == 0 && step == 2) continue;
      backward(vars[k], cast<U>(gradient<T>(vars[k].shape(), k, step)).to(device));
    }
    optimizer->step();
    if (after_step) after_step(vars);
  }
  std::vector<Tensor<U>> values;
  for (const Var<U>& v : vars) values.push_back(v.value().to(host));
  return values;
}

// Against the double reference whose parameters are rounded to T after each step, as T parameters are. f64 keeps
// f64 state, so only the order of a few roundings differs. f32: a few f32 ulps of a starting value up to ~5 (atol)
// for an element that ends near zero. bf16/f16 state is f32 where the reference's is f64: an element whose f32 and
// f64 results fall on either side of a rounding boundary of T differs by one ulp of T (2⁻⁷, 2⁻¹⁰ relative), and
// among a million elements some do so at several of the steps: three ulps.
template <class T> constexpr Tolerance tolerance{};
template <> constexpr Tolerance tolerance<double>{1e-13, 1e-15};
template <> constexpr Tolerance tolerance<float>{1e-5, 2e-6};
template <> constexpr Tolerance tolerance<bf16>{2.4e-2, 1.2e-2};
template <> constexpr Tolerance tolerance<f16>{3e-3, 1.5e-3};

}  // namespace

TEST_CASE_TEMPLATE("every optimizer on the GPU gives bitwise the cpu's parameters and follows the double reference",
                   T, TAPEGRAD_GPU_DTYPES) {
  for (const NamedOptimizer& o : optimizers()) {
    CAPTURE(o.name);
    const std::vector<Tensor<T>> on_gpu = train<T, T>(o.make, gpu);
    const std::vector<Tensor<T>> on_cpu = train<T, T>(o.make, host);
    const std::vector<Tensor<double>> reference = train<double, T>(o.make, host, [](std::vector<Var<double>>& vars) {
      for (const Var<double>& v : vars) {
        Tensor<double> value = v.value();  // a handle on the parameter's storage
        for (std::int64_t i = 0; i < value.numel(); ++i) value.flat(i) = convert<double>(convert<T>(value.flat(i)));
      }
    });
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      CAPTURE(shapes[k]);
      CHECK(bitwise_equal(on_gpu[k], on_cpu[k]));
      test::check_close(on_gpu[k], reference[k], tolerance<T>);
    }
  }
}

TEST_CASE("an optimizer on the GPU gives the same bits every run") {
  for (const NamedOptimizer& o : optimizers()) {
    CAPTURE(o.name);
    const std::vector<Tensor<bf16>> first = train<bf16, bf16>(o.make, gpu), second = train<bf16, bf16>(o.make, gpu);
    for (std::size_t k = 0; k < shapes.size(); ++k) CHECK(bitwise_equal(first[k], second[k]));
  }
}

TEST_CASE("a bf16 parameter's momentum on the GPU is kept in f32, so gradients too small for bf16 still add up") {
  test::check_bf16_momentum_kept_in_f32(gpu);
}

TEST_CASE("one optimizer updates parameters on the cpu and on the GPU, each on its own device") {
  const Tensor<float> start = randn<float>({33}, 1), grad = randn<float>({33}, 2);
  Var<float> on_cpu = param(start.clone()), on_gpu = param(start.to(gpu)), alone = param(start.clone());
  Adam mixed({on_cpu, on_gpu}, {.lr = 0.01, .weight_decay = 0.1});
  Adam reference({alone}, {.lr = 0.01, .weight_decay = 0.1});
  for (int step = 0; step < 3; ++step) {
    zero_grad(on_cpu, on_gpu, alone);
    backward(on_cpu, grad);
    backward(on_gpu, grad.to(gpu));
    backward(alone, grad);
    mixed.step();
    reference.step();
  }
  CHECK(on_cpu.device() == host);
  CHECK(on_gpu.device() == gpu);
  CHECK(bitwise_equal(on_cpu.value(), alone.value()));
  CHECK(bitwise_equal(on_gpu.value().to(host), alone.value()));
}

TEST_CASE("a gradient on another device than its parameter is an error naming both, and changes nothing") {
  const Tensor<float> start = randn<float>({4}, 1);
  Var<float> ok = param(start.to(gpu)), w = param(randn<float>({3}, 2).to(gpu));
  SGD sgd(nn::ParameterList{{"layer.ok", ok}, {"layer.w", w}}, {.lr = 0.1});
  backward(ok, ones<float>({4}, gpu));
  w.slot()->grad = ones<float>({3});  // backward would refuse it, so it is set directly
  CHECK_THROWS_WITH_AS(sgd.step(), "SGD: parameter 'layer.w' is on cuda:0 but its gradient is on cpu", Error);
  CHECK(bitwise_equal(ok.value().to(host), start));

  Var<double> v = param(randn<double>({2}, 3));
  Adam adam({v});
  v.slot()->grad = zeros<double>({2}, gpu);
  CHECK_THROWS_WITH_AS(adam.step(), "Adam: parameter '0' is on cpu but its gradient is on cuda:0", Error);
}

TEST_CASE("state made on one device is not moved: a parameter moved after the first step is an error") {
  Var<float> w = param(randn<float>({5}, 1));
  AdamW adamw({w});
  backward(w, ones<float>({5}));
  adamw.step();
  w.slot()->value = w.value().to(gpu);
  adamw.zero_grad();
  backward(w, ones<float>({5}, gpu));
  CHECK_THROWS_WITH_AS(adamw.step(),
                       "AdamW: parameter '0' is on cuda:0 but its optimizer state is on cpu: move parameters to their "
                       "device before the optimizer's first step",
                       Error);
}
