// layernorm and rmsnorm as tape nodes; the row kernels and their formulas are in ops/detail/norm_rows.hpp (cpu) and
// cuda/norm.cu (GPU).
#include "tapegrad/ops/norm.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "tapegrad/autodiff/custom_op.hpp"
#include "tapegrad/cuda/norm.hpp"
#include "tapegrad/ops/detail/norm_rows.hpp"
#include "tapegrad/ops/detail/norm_second_order.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/reduce.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"

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
  check(x.rank() >= 1, kind.op, "x must have at least one axis (the normalized one), got shape ", x);
  check(options.epsilon > 0, kind.op, "epsilon must be positive, got ", options.epsilon);
  check(std::isfinite(options.epsilon), kind.op, "epsilon must be finite, got ", options.epsilon);
  const Shape want{x.dim(-1)};
  check(gamma == want, kind.op, "gamma has shape ", gamma, " but x has shape ", x, "; expected gamma of shape ", want,
        " (x's last axis)");
  if (beta) {
    check(*beta == want, kind.op, "beta has shape ", *beta, " but x has shape ", x, "; expected beta of shape ", want,
          " (x's last axis)");
  }
}

// The GPU path's saved state: x and gamma (sharing the inputs' storage) and each row's statistics on the device.
template <class T> struct DeviceNorm {
  cuda::NormProblem problem;
  Tensor<T> x, gamma;
  Tensor<compute_t<T>> mean, rstd;  // mean stays empty for rmsnorm
};

template <class T>
Tensor<T> device_norm_forward(DeviceNorm<T>& s, const NormKind& kind, const NormOptions& options, const Tensor<T>& x,
                              const Tensor<T>& gamma, const Tensor<T>* beta) {
  const Device device = x.device();
  const std::int64_t hidden = x.dim(-1);
  s.problem = {.dtype = dtype_v<T>,
               .rows = x.numel() / std::max<std::int64_t>(hidden, 1),
               .hidden = hidden,
               .centered = kind.centered,
               .zero_centered_gamma = options.zero_centered_gamma};
  s.x = x;
  s.gamma = gamma;
  s.mean = Tensor<compute_t<T>>({kind.centered ? s.problem.rows : 0}, device);
  s.rstd = Tensor<compute_t<T>>({s.problem.rows}, device);
  Tensor<T> y(x.shape(), device);
  cuda::norm_forward(s.problem,
                     {.x = x.data(),
                      .gamma = gamma.data(),
                      .beta = beta ? beta->data() : nullptr,
                      .y = y.data(),
                      .mean = s.mean.data(),
                      .rstd = s.rstd.data(),
                      .epsilon = options.epsilon},
                     device.index);
  return y;
}

template <class T> struct Grads {
  Tensor<T> dx, dgamma, dbeta;  // each undefined unless asked for
};

template <class T>
Grads<T> device_norm_backward(const DeviceNorm<T>& s, const Tensor<T>& dy, bool need_dx, bool need_dgamma,
                              bool need_dbeta) {
  const Device device = dy.device();
  const Shape param_shape{s.problem.hidden};
  Grads<T> g;
  if (need_dx) g.dx = Tensor<T>(s.x.shape(), device);
  if (need_dgamma) g.dgamma = Tensor<T>(param_shape, device);
  if (need_dbeta) g.dbeta = Tensor<T>(param_shape, device);
  cuda::NormBackwardArgs args{.x = s.x.data(),
                              .gamma = s.gamma.data(),
                              .dy = dy.data(),
                              .mean = s.mean.data(),
                              .rstd = s.rstd.data(),
                              .dx = g.dx.data(),
                              .dgamma = g.dgamma.data(),
                              .dbeta = g.dbeta.data()};
  Tensor<compute_t<T>> partials({cuda::norm_backward_partials(s.problem, args)}, device);
  args.partials = partials.data();
  cuda::norm_backward(s.problem, args, device.index);
  return g;
}

template <class T>
Grads<T> host_norm_backward(const detail::NormRows<T>& s, const Tensor<T>& dy, bool need_dx, bool need_dgamma,
                            bool need_dbeta) {
  auto g = detail::norm_backward(s, dy, need_dx, need_dgamma, need_dbeta);
  const Shape param_shape{s.hidden};
  const auto* totals = g.dgamma_dbeta.data();
  return {g.dx, need_dgamma ? detail::rounded_tensor<T>(totals, param_shape) : Tensor<T>(),
          need_dbeta ? detail::rounded_tensor<T>(totals + s.hidden, param_shape) : Tensor<T>()};
}

// What a backward needs: on the cpu NormRows (ops/detail/norm_rows.hpp), on a GPU DeviceNorm.
template <class T> struct NormSaved {
  detail::NormRows<T> host;
  DeviceNorm<T> device;
};

// The gradients of the node's inputs at `dy`, on the device where they live.
template <class T>
Grads<T> norm_backward(const char* op, const NormSaved<T>& s, const Tensor<T>& dy, bool need_dx, bool need_dgamma,
                       bool need_dbeta) {
  return by_device(
      op, dy.device(), [&] { return host_norm_backward(s.host, dy, need_dx, need_dgamma, need_dbeta); },
      [&](auto) { return device_norm_backward(s.device, dy, need_dx, need_dgamma, need_dbeta); });
}

template <class T> struct NormBackwardSaved {
  NormSaved<T> norm;  // x and gamma with it
  Tensor<T> dy;
};

// The second derivatives (∂x, ∂γ, ∂dy) at the cotangents (u, cγ, cβ) of the backward's (dx, dγ, dβ), fused.
template <class T>
std::tuple<Tensor<T>, Tensor<T>, Tensor<T>> fused_second_order(const char* op, const NormBackwardSaved<T>& s,
                                                               const Tensor<T>& u, const Tensor<T>& c_gamma,
                                                               const Tensor<T>* c_beta) {
  return by_device(
      op, u.device(),
      [&] {
        const detail::NormSecondOrderGrads<T> g = detail::norm_second_order_rows(s.norm.host, s.dy, u, c_gamma, c_beta);
        return std::tuple{g.dx, detail::rounded_tensor<T>(g.dgamma.data(), Shape{s.norm.host.hidden}), g.ddy};
      },
      [&](auto) {
        const DeviceNorm<T>& d = s.norm.device;
        const Device device = u.device();
        Tensor<T> dx(d.x.shape(), device), dgamma(d.gamma.shape(), device), ddy(d.x.shape(), device);
        Tensor<compute_t<T>> scratch({cuda::norm_second_order_scratch(d.problem)}, device);
        cuda::norm_second_order(d.problem,
                                {.x = d.x.data(),
                                 .gamma = d.gamma.data(),
                                 .dy = s.dy.data(),
                                 .mean = d.mean.data(),
                                 .rstd = d.rstd.data(),
                                 .u = u.data(),
                                 .c_gamma = c_gamma.data(),
                                 .c_beta = c_beta ? c_beta->data() : nullptr,
                                 .dx = dx.data(),
                                 .dgamma = dgamma.data(),
                                 .ddy = ddy.data(),
                                 .scratch = scratch.data()},
                                device.index);
        return std::tuple{dx, dgamma, ddy};
      });
}

// The recorded backward (create_graph): the fused backward as a node of its own over (x, gamma, dy), giving
// (dx, dgamma[, dbeta]): its backward the fused second derivatives, its recorded backward (a third derivative) the
// same formulas as ops (ops/detail/norm_second_order.hpp).
template <class T, bool has_beta>
auto record_norm_backward(const NormKind& kind, const NormOptions& options, const NormSaved<T>& saved,
                          const Var<T>& x, const Var<T>& gamma, const Var<T>& dy) {
  const auto second_order = [kind, options](const Var<T>& xv, const Var<T>& gammav, const Var<T>& dyv,
                                            const Var<T>& u, const Var<T>& c_gamma, const auto&... c_beta) {
    const Var<T>* c_beta_or_null = nullptr;
    ((c_beta_or_null = &c_beta), ...);
    const detail::NormSecondOrder<T> g = detail::norm_second_order(
        kind.centered, options.epsilon, options.zero_centered_gamma, xv, gammav, dyv, u, c_gamma, c_beta_or_null);
    return std::tuple{g.dx, g.dgamma, g.ddy};
  };
  return custom_op<NormBackwardSaved<T>>(
      std::string(kind.op) + "_backward",
      [&](NormBackwardSaved<T>& s, const Tensor<T>&, const Tensor<T>&, const Tensor<T>& dyv) {
        s = {saved, dyv};
        const Grads<T> g = norm_backward(kind.op, saved, dyv, true, true, has_beta);
        if constexpr (has_beta) {
          return std::tuple{g.dx, g.dgamma, g.dbeta};
        } else {
          return std::tuple{g.dx, g.dgamma};
        }
      },
      [op = kind.op](const NormBackwardSaved<T>& s, const NeedsGrad&, const Tensor<T>& u, const Tensor<T>& c_gamma,
                     const auto&... c_beta) {
        const Tensor<T>* c_beta_or_null = nullptr;
        ((c_beta_or_null = &c_beta), ...);
        return fused_second_order(op, s, u, c_gamma, c_beta_or_null);
      },
      graph_backward([second_order](const NormBackwardSaved<T>&, const NeedsGrad&,
                                    const std::tuple<Var<T>, Var<T>, Var<T>>& in, const auto&... cotangents) {
        return std::apply([&](const auto&... v) { return second_order(v..., cotangents...); }, in);
      }),
      x, gamma, dy);
}

// Records the node; `beta` is empty or one Var.
template <class T, class... Beta>
Var<T> record_norm(const NormKind& kind, const NormOptions& options, const Var<T>& x, const Var<T>& gamma,
                   const Beta&... beta) {
  const OpScope scope = enter_op(kind.op, x, gamma, beta...);
  const Shape* beta_shape = nullptr;
  ((beta_shape = &beta.shape()), ...);
  check_same_device(kind.op, x, gamma, beta...);
  check_norm_inputs(kind, x.shape(), gamma.shape(), beta_shape, options);
  return custom_op<NormSaved<T>>(
      kind.op,
      [&](NormSaved<T>& s, const Tensor<T>& xv, const Tensor<T>& gammav, const auto&... betav) {
        const Tensor<T>* b = nullptr;
        ((b = &betav), ...);
        return by_device(
            kind.op, xv.device(),
            [&] {
              s.host = detail::NormRows<T>(kind.centered, xv, gammav, b, options.zero_centered_gamma);
              Tensor<T> y(xv.shape());
              s.host.forward(options.epsilon, y.data());
              return y;
            },
            [&](auto) { return device_norm_forward(s.device, kind, options, xv, gammav, b); });
      },
      [op = kind.op](const NormSaved<T>& s, const NeedsGrad& needs, const Tensor<T>& dy) {
        constexpr bool has_beta = sizeof...(Beta) > 0;
        const Grads<T> g = norm_backward(op, s, dy, needs[0], needs[1], has_beta && needs[2]);
        if constexpr (has_beta) {
          return std::tuple{g.dx, g.dgamma, g.dbeta};
        } else {
          return std::tuple{g.dx, g.dgamma};
        }
      },
      graph_backward([kind, options](const NormSaved<T>& s, const NeedsGrad&, const auto& in, const Var<T>& dy) {
        constexpr bool has_beta = sizeof...(Beta) > 0;
        const auto grads = record_norm_backward<T, has_beta>(kind, options, s, std::get<0>(in), std::get<1>(in), dy);
        if constexpr (has_beta) {
          return grads;
        } else {
          return std::tuple{std::get<0>(grads), std::get<1>(grads)};
        }
      }),
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
