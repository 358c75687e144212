// layernorm and rmsnorm as tape nodes; the row kernels and their formulas are in ops/norm_rows.hpp.
#include "ops/norm.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "autodiff/custom_op.hpp"
#include "ops/norm_rows.hpp"

namespace tapegrad {

namespace {

struct NormKind {
  const char* op;
  bool centered;  // layernorm subtracts the mean; rmsnorm does not
};
constexpr NormKind layer_norm{"layernorm", true};
constexpr NormKind rms_norm{"rmsnorm", false};

void check_norm_inputs(const NormKind& kind, const Shape& x, const Shape& gamma, const Shape* beta,
                       const NormOptions& options) {
  check(x.rank() >= 1, kind.op, "x must have at least one axis (the normalized one), got shape ", x.str());
  check(options.epsilon > 0, kind.op, "epsilon must be positive, got ", options.epsilon);
  const Shape want{x.dim(-1)};
  check(gamma == want, kind.op, "gamma has shape ", gamma.str(), " but x has shape ", x.str(),
        "; expected gamma of shape ", want.str(), " (x's last axis)");
  if (beta) {
    check(*beta == want, kind.op, "beta has shape ", beta->str(), " but x has shape ", x.str(),
          "; expected beta of shape ", want.str(), " (x's last axis)");
  }
}

// Records the node; `beta` is empty or one Var.
template <class T, class... Beta>
Var<T> record_norm(const NormKind& kind, const NormOptions& options, const Var<T>& x, const Var<T>& gamma,
                   const Beta&... beta) {
  const Shape* beta_shape = nullptr;
  ((beta_shape = &beta.shape()), ...);
  check_cpu_inputs(kind.op, x, gamma, beta...);  // no GPU path yet
  check_norm_inputs(kind, x.shape(), gamma.shape(), beta_shape, options);
  return custom_op<detail::NormRows<T>>(
      kind.op,
      [&](detail::NormRows<T>& s, const Tensor<T>& xv, const Tensor<T>& gammav, const auto&... betav) {
        const Tensor<T>* b = nullptr;
        ((b = &betav), ...);
        s = detail::NormRows<T>(kind.centered, xv, gammav, b, options.zero_centered_gamma);
        Tensor<T> y(xv.shape());
        s.forward(options.epsilon, y.data());
        return y;
      },
      [](const detail::NormRows<T>& s, const NeedsGrad& needs, const Tensor<T>& dy) {
        constexpr bool has_beta = sizeof...(Beta) > 0;
        const bool need_dgamma = needs[1], need_dbeta = has_beta && needs[2];
        auto g = detail::norm_backward(s, dy, needs[0], need_dgamma, need_dbeta);
        const Shape param_shape{s.hidden};
        const auto* totals = g.dgamma_dbeta.data();
        Tensor<T> dgamma = need_dgamma ? detail::rounded_tensor<T>(totals, param_shape) : Tensor<T>();
        if constexpr (has_beta) {
          Tensor<T> dbeta = need_dbeta ? detail::rounded_tensor<T>(totals + s.hidden, param_shape) : Tensor<T>();
          return std::tuple{g.dx, dgamma, dbeta};
        } else {
          return std::tuple{g.dx, dgamma};
        }
      },
      x, gamma, beta...);
}

}  // namespace

template <class T>
Var<T> layernorm(const Var<T>& x, const Var<T>& gamma, const Var<T>& beta, const NormOptions& options) {
  return record_norm(layer_norm, options, x, gamma, beta);
}
template <class T> Var<T> layernorm(const Var<T>& x, const Var<T>& gamma, const NormOptions& options) {
  return record_norm(layer_norm, options, x, gamma);
}
template <class T> Var<T> rmsnorm(const Var<T>& x, const Var<T>& gamma, const NormOptions& options) {
  return record_norm(rms_norm, options, x, gamma);
}

#define TAPEGRAD_INSTANTIATE_NORM(T)                                                             \
  template Var<T> layernorm<T>(const Var<T>&, const Var<T>&, const Var<T>&, const NormOptions&); \
  template Var<T> layernorm<T>(const Var<T>&, const Var<T>&, const NormOptions&);                \
  template Var<T> rmsnorm<T>(const Var<T>&, const Var<T>&, const NormOptions&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_NORM)

}  // namespace tapegrad
