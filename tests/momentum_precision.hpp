// The case that shows an optimizer keeps a bf16 parameter's state in f32, shared by the cpu and GPU optimizer tests:
// SGD with momentum 1 makes the buffer a running sum. After a gradient of 1, 128 gradients of 2⁻¹⁰ leave an f32
// buffer at 1.125 where a bf16 one stays at 1 (bf16's spacing there is 2⁻⁷); a gradient of -1 then leaves 0.125 or
// 0, and 100 steps without gradient move the parameter by 100·lr·0.125 or not at all. The parameter starts at 1 so
// that it is near 0, where its own rounding is fine, by then.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "tapegrad/tapegrad.hpp"

namespace tapegrad::test {

// Trains a bf16 parameter [3] on `device` through the case and checks it against the f32-state result.
inline void check_bf16_momentum_kept_in_f32(Device device) {
  constexpr double lr = 1.0 / 128;
  std::vector<double> grads{1.0};
  grads.insert(grads.end(), 128, 1.0 / 1024);
  grads.push_back(-1.0);
  grads.insert(grads.end(), 100, 0.0);
  // The parameter after these steps with the buffer kept in B and the parameter rounded to bf16 each step.
  const auto reference = [&]<class B>(B) {
    double p = 1.0;
    B buffer{};
    for (std::size_t t = 0; t < grads.size(); ++t) {
      buffer = convert<B>((t == 0 ? 0.0 : convert<double>(buffer)) + grads[t]);
      p = convert<double>(convert<bf16>(p - lr * convert<double>(buffer)));
    }
    return p;
  };
  const double with_f32_state = reference(float{}), with_bf16_state = reference(bf16{});
  REQUIRE(std::abs(with_f32_state - with_bf16_state) > 0.05);  // the test tells the two apart

  Var<bf16> w = param(full<bf16>({3}, 1.0, device));
  optim::SGD sgd({w}, {.lr = lr, .momentum = 1});
  for (double g : grads) {
    sgd.zero_grad();
    backward(w, full<bf16>({3}, g, device));
    sgd.step();
  }
  // Exact: every value here has few enough bits that f32 arithmetic rounds nothing.
  const Tensor<bf16> result = w.value().to(Device::cpu());
  for (std::int64_t i = 0; i < 3; ++i) CHECK(convert<double>(result.flat(i)) == with_f32_state);
}

}  // namespace tapegrad::test
