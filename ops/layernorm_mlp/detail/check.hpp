// What layernorm_mlp accepts, checked in one place for the node and for the composite of primitive ops it is tested
// against, so that the two cannot disagree on what is valid. Internal to ops/layernorm_mlp/.
#pragma once

#include <cstdint>
#include <string_view>

#include "tapegrad/ops/fp8/detail/check.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/types.hpp"
#include "tapegrad/ops/layernorm_mlp/layernorm_mlp.hpp"
#include "tapegrad/tensor/core/detail/device_checks.hpp"

namespace tapegrad::detail::mlp {

// The arguments' shapes; an absent beta or bias is null.
struct Shapes {
  const Shape& x;
  const Shape& gamma;
  const Shape* beta;
  const Shape& w1;
  const Shape* b1;
  const Shape& w2;
  const Shape* b2;
};

// The block's sizes. Throws Error naming `op` for a shape, device, option or enum value that is not valid, or a
// scratch tensor of T (`compute`'s scratch: [M, n·F]) too large to address, before anything is allocated.
Dims check_arguments(std::string_view op, const Shapes& shapes, DType compute, const LayerNormMLPOptions& options);

// "<op>: <what> is undefined (...); x, gamma, w1 and w2 must be defined (only beta and the biases may be left out)"
[[noreturn]] void throw_undefined_argument(std::string_view op, std::string_view what);

template <class T, class P>
Dims check_arguments(std::string_view op, const Var<T>& x, const Var<P>& gamma, const Var<P>& beta,
                     const MLPKernels<P>& kernels, const MLPBiases<P>& biases, const LayerNormMLPOptions& options) {
  const auto require = [&](bool defined, std::string_view what) {
    if (!defined) throw_undefined_argument(op, what);
  };
  require(x.defined(), "x");
  require(gamma.defined(), "gamma");
  require(kernels.w1.defined(), "w1");
  require(kernels.w2.defined(), "w2");
  // On x's device, numbered as the node's inputs: x, gamma, beta, w1, b1, w2, b2.
  std::size_t input = 1;
  const auto on_x_device = [&](const Var<P>& v) {
    if (v.defined()) check_device_matches(op, x.device(), input, v.device());
    ++input;
  };
  for (const Var<P>* v : {&gamma, &beta, &kernels.w1, &biases.b1, &kernels.w2, &biases.b2}) on_x_device(*v);
  if (options.fp8) check_fp8_on_device(op, dtype_v<T>, x.device());
  const auto shape_of = [](const Var<P>& v) { return v.defined() ? &v.shape() : nullptr; };
  return check_arguments(op,
                             {x.shape(), gamma.shape(), shape_of(beta), kernels.w1.shape(), shape_of(biases.b1),
                              kernels.w2.shape(), shape_of(biases.b2)},
                             compute_dtype(dtype_v<T>), options);
}

}  // namespace tapegrad::detail::mlp
