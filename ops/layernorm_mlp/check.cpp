#include "tapegrad/ops/layernorm_mlp/detail/check.hpp"

#include <cmath>

#include "tapegrad/ops/fp8/detail/check.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/sharding.hpp"

namespace tapegrad::detail::mlp {

namespace {
void check_options(std::string_view op, const LayerNormMLPOptions& options) {
  check(options.norm == NormType::layernorm || options.norm == NormType::rmsnorm, op, "norm ",
        static_cast<int>(options.norm), " is not a NormType (layernorm or rmsnorm)");
  check(options.recompute == Recompute::save_all || options.recompute == Recompute::recompute_norm ||
            options.recompute == Recompute::recompute_all,
        op, "recompute ", static_cast<int>(options.recompute),
        " is not a Recompute policy (save_all, recompute_norm or recompute_all)");
  try {
    activation_name(options.activation);
  } catch (const Error&) {
    throw Error(concat(op, ": unknown activation ", static_cast<int>(options.activation)));
  }
  check(options.epsilon > 0, op, "epsilon must be positive, got ", options.epsilon);
  check(std::isfinite(options.epsilon), op, "epsilon must be finite, got ", options.epsilon);
  if (options.activation == Activation::clamped_swiglu) {
    const ClampedSwigluParams& p = options.clamped_swiglu;
    check(p.limit > 0, op, "clamped_swiglu needs a positive limit, got ", p.limit);
    check(std::isfinite(p.limit), op, "clamped_swiglu needs a finite limit, got ", p.limit);
    check(std::isfinite(p.alpha), op, "clamped_swiglu needs a finite alpha, got ", p.alpha);
  }
  if (options.fp8) check_fp8_quantization(op, *options.fp8);
}
}  // namespace

void throw_undefined_argument(std::string_view op, std::string_view what) {
  throw Error(concat(op, ": ", what,
                     " is undefined (a default-constructed Var); x, gamma, w1 and w2 must be defined (only beta and "
                     "the biases may be left out)"));
}

Dims check_arguments(std::string_view op, const Shapes& shapes, DType compute, const LayerNormMLPOptions& options) {
  check_options(op, options);
  const Shape& xs = shapes.x;
  check(xs.rank() >= 1 && xs.dim(-1) > 0, op, "x must have a non-empty last (hidden) axis, got shape ", xs);
  if (shapes.beta) {
    check(options.norm == NormType::layernorm, op, "rmsnorm has no beta, but one of shape ", *shapes.beta,
          " was given");
  }
  const std::int64_t H = xs.dim(-1), n = activation_width(options.activation);
  const Shape hidden_vector{H};
  check(shapes.gamma == hidden_vector, op, "gamma has shape ", shapes.gamma, " but x has shape ", xs, "; expected ",
        hidden_vector);
  if (shapes.beta) {
    check(*shapes.beta == hidden_vector, op, "beta has shape ", *shapes.beta, " but x has shape ", xs, "; expected ",
          hidden_vector);
  }
  const Shape& w1 = shapes.w1;
  check(w1.rank() == 3 && w1.dim(0) == H && w1.dim(1) == n && w1.dim(2) > 0, op, "w1 has shape ", w1,
        " but x has hidden size ", H, " and activation ", activation_name(options.activation), " needs [", H, ", ", n,
        ", F]");
  const std::int64_t F = w1.dim(2);
  check(shapes.w2 == Shape{F, H}, op, "w2 has shape ", shapes.w2, " but w1 has shape ", w1, " and x has shape ", xs,
        "; expected ", Shape{F, H});
  if (shapes.b1) {
    check(*shapes.b1 == Shape{n, F}, op, "b1 has shape ", *shapes.b1, " but w1 has shape ", w1, "; expected ",
          Shape{n, F});
  }
  if (shapes.b2) {
    check(*shapes.b2 == hidden_vector, op, "b2 has shape ", *shapes.b2, " but x has shape ", xs, "; expected ",
          hidden_vector);
  }
  // Under sequence parallelism the products see every rank's rows.
  const std::int64_t M = xs.numel() / H * Sharding(options.tensor_parallel).row_factor();
  const OpScope scope(op);
  tensor_bytes(Shape{M, n * F}, compute);  // z, the largest scratch, made in the compute dtype on a GPU
  return {M, H, F, n};
}

}  // namespace tapegrad::detail::mlp
