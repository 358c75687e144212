// layernorm and rmsnorm over the last axis of x [..., H], one row at a time, in C = compute_t<T>.
//
//   layernorm:  mean = Σx / H,  rstd = 1 / sqrt(Σ(x - mean)² / H + eps),  x̂ = (x - mean) · rstd
//   rmsnorm:    mean = 0,       rstd = 1 / sqrt(Σx² / H + eps),           x̂ = x · rstd
//   y = x̂ · g + beta,  with g = gamma, or 1 + gamma for zero_centered_gamma
//
//   backward, per row, with dx̂ = dy · g:
//     dx     = rstd · (dx̂ - mean(dx̂) - x̂ · mean(dx̂ · x̂))     (rmsnorm: no mean(dx̂) term)
//     dgamma = Σ_rows dy · x̂,   dbeta = Σ_rows dy
//
// Saved: x itself (it shares the input's storage, so saving it costs nothing), g in C, and per row mean and rstd
// in C. x̂ is recomputed from them in full precision, where a saved bf16 x̂ would have lost bits. The variance is a
// second pass over (x - mean), not E[x²] - mean², so that rows with a large mean and a small spread stay accurate.
// dgamma and dbeta are summed over fixed blocks of rows (ops/row_sum.hpp), so they do not depend on the thread count.
#include "ops/norm.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "autodiff/custom_op.hpp"
#include "ops/row_sum.hpp"

namespace tapegrad {

namespace {

struct NormKind {
  const char* op;
  bool centered;  // layernorm subtracts the mean; rmsnorm does not
};
constexpr NormKind layer_norm{"layernorm", true};
constexpr NormKind rms_norm{"rmsnorm", false};

template <class T> struct NormSaved {
  using C = compute_t<T>;
  bool centered = true;
  std::int64_t rows = 0, hidden = 0;
  Tensor<T> x;
  std::vector<C> scale;       // g: gamma, or 1 + gamma
  std::vector<C> mean, rstd;  // per row; mean stays empty for rmsnorm

  C x_at(std::int64_t r, std::int64_t j) const { return static_cast<C>(x.flat(r * hidden + j)); }
  C mean_of(std::int64_t r) const { return centered ? mean[r] : C(0); }
};

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

// Row r of the forward: its statistics into s, its output into y.
template <class T>
void norm_forward_row(NormSaved<T>& s, std::int64_t r, compute_t<T> eps, const std::vector<compute_t<T>>& shift, T* y) {
  using C = compute_t<T>;
  const std::int64_t H = s.hidden;
  C mean = 0;
  if (s.centered) {
    for (std::int64_t j = 0; j < H; ++j) mean += s.x_at(r, j);
    mean /= static_cast<C>(H);
    s.mean[r] = mean;
  }
  C squares = 0;
  for (std::int64_t j = 0; j < H; ++j) squares += (s.x_at(r, j) - mean) * (s.x_at(r, j) - mean);
  const C rstd = C(1) / std::sqrt(squares / static_cast<C>(H) + eps);
  s.rstd[r] = rstd;
  for (std::int64_t j = 0; j < H; ++j) y[j] = convert<T>((s.x_at(r, j) - mean) * rstd * s.scale[j] + shift[j]);
}

template <class T>
Tensor<T> norm_forward(NormSaved<T>& s, const NormKind& kind, const NormOptions& options, const Tensor<T>& x,
                       const Tensor<T>& gamma, const Tensor<T>* beta) {
  using C = compute_t<T>;
  const std::int64_t H = x.dim(-1);
  s.centered = kind.centered;
  s.hidden = H;
  s.rows = x.numel() / std::max<std::int64_t>(H, 1);
  s.x = x;
  s.scale.resize(static_cast<std::size_t>(H));
  std::vector<C> shift(static_cast<std::size_t>(H), C(0));
  for (std::int64_t j = 0; j < H; ++j) {
    s.scale[j] = static_cast<C>(gamma.flat(j)) + (options.zero_centered_gamma ? C(1) : C(0));
    if (beta) shift[j] = static_cast<C>(beta->flat(j));
  }
  s.mean.resize(kind.centered ? static_cast<std::size_t>(s.rows) : 0);
  s.rstd.resize(static_cast<std::size_t>(s.rows));

  Tensor<T> y(x.shape());
  parallel_for(s.rows, 6 * H, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin; r < end; ++r) {
      norm_forward_row(s, r, static_cast<C>(options.epsilon), shift, y.data() + r * H);
    }
  });
  return y;
}

// Row r of the backward: adds dy·x̂ into dgamma and dy into dbeta, and writes dx; each only when not null.
template <class T>
void norm_backward_row(const NormSaved<T>& s, std::int64_t r, const T* dy, T* dx, compute_t<T>* dgamma,
                       compute_t<T>* dbeta) {
  using C = compute_t<T>;
  const std::int64_t H = s.hidden;
  const C mean = s.mean_of(r), rstd = s.rstd[r];
  C sum_dxhat = 0, sum_dxhat_xhat = 0;
  for (std::int64_t j = 0; j < H; ++j) {
    const C xhat = (s.x_at(r, j) - mean) * rstd;
    const C dyj = static_cast<C>(dy[j]);
    sum_dxhat += dyj * s.scale[j];
    sum_dxhat_xhat += dyj * s.scale[j] * xhat;
    if (dgamma) dgamma[j] += dyj * xhat;
    if (dbeta) dbeta[j] += dyj;
  }
  if (!dx) return;
  const C mean_dxhat = s.centered ? sum_dxhat / static_cast<C>(H) : C(0);
  const C mean_dxhat_xhat = sum_dxhat_xhat / static_cast<C>(H);
  for (std::int64_t j = 0; j < H; ++j) {
    const C xhat = (s.x_at(r, j) - mean) * rstd;
    dx[j] = convert<T>(rstd * (static_cast<C>(dy[j]) * s.scale[j] - mean_dxhat - xhat * mean_dxhat_xhat));
  }
}

template <class T> struct NormGrads { Tensor<T> dx, dgamma, dbeta; };

template <class T>
NormGrads<T> norm_backward(const NormSaved<T>& s, const Tensor<T>& dy, bool need_dx, bool need_dgamma,
                           bool need_dbeta) {
  using C = compute_t<T>;
  const std::int64_t H = s.hidden;
  NormGrads<T> grads;
  if (need_dx) grads.dx = Tensor<T>(s.x.shape());
  // Each block's partial holds [dgamma | dbeta], H each.
  const std::vector<C> totals =
      detail::blocked_row_sum<C>(s.rows, 2 * H, 10 * H, [&](std::int64_t begin, std::int64_t end, C* partial) {
        for (std::int64_t r = begin; r < end; ++r) {
          norm_backward_row(s, r, dy.data() + r * H, need_dx ? grads.dx.data() + r * H : nullptr,
                            need_dgamma ? partial : nullptr, need_dbeta ? partial + H : nullptr);
        }
      });
  if (need_dgamma) grads.dgamma = detail::rounded_tensor<T>(totals.data(), Shape{H});
  if (need_dbeta) grads.dbeta = detail::rounded_tensor<T>(totals.data() + H, Shape{H});
  return grads;
}

// Records the node; `beta` is empty or one Var.
template <class T, class... Beta>
Var<T> record_norm(const NormKind& kind, const NormOptions& options, const Var<T>& x, const Var<T>& gamma,
                   const Beta&... beta) {
  const Shape* beta_shape = nullptr;
  ((beta_shape = &beta.shape()), ...);
  check_norm_inputs(kind, x.shape(), gamma.shape(), beta_shape, options);
  return custom_op<NormSaved<T>>(
      kind.op,
      [&](NormSaved<T>& s, const Tensor<T>& xv, const Tensor<T>& gammav, const auto&... betav) {
        const Tensor<T>* b = nullptr;
        ((b = &betav), ...);
        return norm_forward(s, kind, options, xv, gammav, b);
      },
      [](const NormSaved<T>& s, const NeedsGrad& needs, const Tensor<T>& dy) {
        constexpr bool has_beta = sizeof...(Beta) > 0;
        auto g = norm_backward(s, dy, needs[0], needs[1], has_beta && needs[2]);
        if constexpr (has_beta) {
          return std::tuple{g.dx, g.dgamma, g.dbeta};
        } else {
          return std::tuple{g.dx, g.dgamma};
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
