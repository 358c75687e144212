// The row kernels of layernorm and rmsnorm over the last axis of x [..., H], in C = compute_t<T>; shared by the
// norm ops (ops/norm.cpp) and layernorm_mlp (ops/layernorm_mlp/cpu_steps.cpp). Internal to ops/.
//
//   layernorm:  mean = Σx / H,  rstd = 1 / sqrt(Σ(x - mean)² / H + eps),  x̂ = (x - mean) · rstd
//   rmsnorm:    mean = 0,       rstd = 1 / sqrt(Σx² / H + eps),           x̂ = x · rstd
//   y = x̂ · g + beta,  with g = gamma, or 1 + gamma for zero_centered_gamma
//
//   backward, per row, with dx̂ = dy · g:
//     dx     = rstd · (dx̂ - mean(dx̂) - x̂ · mean(dx̂ · x̂))     (rmsnorm: no mean(dx̂) term)
//     dgamma = Σ_rows dy · x̂,   dbeta = Σ_rows dy
//
// What a backward needs: x itself (it shares the input's storage, so keeping it costs nothing), g and beta in C,
// and per row mean and rstd in C. x̂ is recomputed from them in full precision, where a saved bf16 x̂ would have
// lost bits; the output y can be recomputed bitwise from them too (apply_rows). The variance is a second pass
// over (x - mean), not E[x²] - mean², so that rows with a large mean and a small spread stay accurate. dgamma and
// dbeta are summed over fixed blocks of rows (ops/detail/row_sum.hpp), so they do not depend on the thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tapegrad/ops/detail/row_sum.hpp"
#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad::detail {

template <class T> struct NormRows {
  using C = compute_t<T>;
  bool centered = true;  // layernorm subtracts the mean; rmsnorm does not
  std::int64_t rows = 0, hidden = 0;
  Tensor<T> x;
  std::vector<C> scale;       // g: gamma, or 1 + gamma
  std::vector<C> shift;       // beta; all zeros without one
  std::vector<C> mean, rstd;  // per row; mean stays empty for rmsnorm

  // Takes x [..., H] and the affine parameters (`beta` may be null), converted to C once.
  template <class P>
  NormRows(bool centered_, const Tensor<T>& x_, const Tensor<P>& gamma, const Tensor<P>* beta,
           bool zero_centered_gamma)
      : centered(centered_), hidden(x_.dim(-1)), x(x_) {
    rows = x.numel() / std::max<std::int64_t>(hidden, 1);
    scale.resize(static_cast<std::size_t>(hidden));
    shift.assign(static_cast<std::size_t>(hidden), C(0));
    for (std::int64_t j = 0; j < hidden; ++j) {
      scale[j] = convert<C>(gamma.flat(j)) + (zero_centered_gamma ? C(1) : C(0));
      if (beta) shift[j] = convert<C>(beta->flat(j));
    }
  }
  NormRows() = default;

  C x_at(std::int64_t r, std::int64_t j) const { return static_cast<C>(x.flat(r * hidden + j)); }
  C mean_of(std::int64_t r) const { return centered ? mean[r] : C(0); }

  // Row r's normalized and scaled values, each rounded once to T.
  void apply_row(std::int64_t r, T* y) const {
    const C m = mean_of(r), rs = rstd[r];
    for (std::int64_t j = 0; j < hidden; ++j) y[j] = convert<T>((x_at(r, j) - m) * rs * scale[j] + shift[j]);
  }

  void statistics_row(std::int64_t r, C eps) {
    C m = 0;
    if (centered) {
      for (std::int64_t j = 0; j < hidden; ++j) m += x_at(r, j);
      m /= static_cast<C>(hidden);
      mean[r] = m;
    }
    C squares = 0;
    for (std::int64_t j = 0; j < hidden; ++j) squares += (x_at(r, j) - m) * (x_at(r, j) - m);
    rstd[r] = C(1) / std::sqrt(squares / static_cast<C>(hidden) + eps);
  }

  // Computes the statistics of every row and writes y = x̂·g + beta into y [rows, H].
  void forward(double epsilon, T* y) {
    mean.resize(centered ? static_cast<std::size_t>(rows) : 0);
    rstd.resize(static_cast<std::size_t>(rows));
    parallel_for(rows, 6 * hidden, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t r = begin; r < end; ++r) {
        statistics_row(r, static_cast<C>(epsilon));
        apply_row(r, y + r * hidden);
      }
    });
  }

  // y again from the saved statistics: bitwise what forward wrote.
  void apply_rows(T* y) const {
    parallel_for(rows, 3 * hidden, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t r = begin; r < end; ++r) apply_row(r, y + r * hidden);
    });
  }

  // Row r of the backward: adds dy·x̂ into dgamma and dy into dbeta, and writes dx (+ the row of dx_addend, before
  // the rounding); each only when not null.
  void backward_row(std::int64_t r, const T* dy, T* dx, C* dgamma, C* dbeta, const T* dx_addend = nullptr) const {
    const std::int64_t H = hidden;
    const C m = mean_of(r), rs = rstd[r];
    C sum_dxhat = 0, sum_dxhat_xhat = 0;
    for (std::int64_t j = 0; j < H; ++j) {
      const C xhat = (x_at(r, j) - m) * rs;
      const C dyj = static_cast<C>(dy[j]);
      sum_dxhat += dyj * scale[j];
      sum_dxhat_xhat += dyj * scale[j] * xhat;
      if (dgamma) dgamma[j] += dyj * xhat;
      if (dbeta) dbeta[j] += dyj;
    }
    if (!dx) return;
    const C mean_dxhat = centered ? sum_dxhat / static_cast<C>(H) : C(0);
    const C mean_dxhat_xhat = sum_dxhat_xhat / static_cast<C>(H);
    for (std::int64_t j = 0; j < H; ++j) {
      const C xhat = (x_at(r, j) - m) * rs;
      C v = rs * (static_cast<C>(dy[j]) * scale[j] - mean_dxhat - xhat * mean_dxhat_xhat);
      if (dx_addend) v += static_cast<C>(dx_addend[j]);  // (only then: a fused multiply-add would round v otherwise)
      dx[j] = convert<T>(v);
    }
  }
};

// The second derivatives of one row (ops/detail/norm_second_order.hpp's formulas, in C): ∂x and ∂dy of the row, and
// its terms of ∂γ added to dgamma. u is the row's cotangent of dx; c_gamma and c_beta (null: none) are C[hidden].
template <class T>
void second_order_row(const NormRows<T>& s, std::int64_t r, const T* dy, const T* u, const compute_t<T>* c_gamma,
                      const compute_t<T>* c_beta, T* dx, T* ddy, compute_t<T>* dgamma) {
  using C = compute_t<T>;
  const std::int64_t H = s.hidden;
  const C m = s.mean_of(r), rs = s.rstd[r], count = static_cast<C>(H);
  const auto xhat = [&](std::int64_t j) { return (s.x_at(r, j) - m) * rs; };
  const auto a = [&](std::int64_t j) { return static_cast<C>(dy[j]) * s.scale[j]; };
  C sum_u = 0, sum_u_xhat = 0, sum_a = 0, sum_a_xhat = 0, sum_u_a = 0;
  for (std::int64_t j = 0; j < H; ++j) {
    const C uj = static_cast<C>(u[j]);
    sum_u += uj;
    sum_u_xhat += uj * xhat(j);
    sum_a += a(j);
    sum_a_xhat += a(j) * xhat(j);
    sum_u_a += uj * a(j);
  }
  const C u_mean = s.centered ? sum_u / count : C(0), u_xhat = sum_u_xhat / count;
  const C a_mean = s.centered ? sum_a / count : C(0), a_xhat = sum_a_xhat / count;
  const C s_r = sum_u_a / count - a_mean * u_mean - a_xhat * u_xhat;
  const auto G = [&](std::int64_t j) {
    return c_gamma[j] * static_cast<C>(dy[j]) - rs * (a(j) * u_xhat + static_cast<C>(u[j]) * a_xhat);
  };
  C sum_g = 0, sum_g_xhat = 0;
  for (std::int64_t j = 0; j < H; ++j) {
    sum_g += G(j);
    sum_g_xhat += G(j) * xhat(j);
  }
  const C g_mean = s.centered ? sum_g / count : C(0), g_xhat = sum_g_xhat / count;
  for (std::int64_t j = 0; j < H; ++j) {
    const C xh = xhat(j);
    dx[j] = convert<T>(rs * (G(j) - g_mean - xh * g_xhat) - rs * rs * xh * s_r);
    const C P = rs * (static_cast<C>(u[j]) - u_mean - xh * u_xhat);
    ddy[j] = convert<T>(P * s.scale[j] + c_gamma[j] * xh + (c_beta ? c_beta[j] : C(0)));
    dgamma[j] += P * static_cast<C>(dy[j]);
  }
}

template <class T> struct NormSecondOrderGrads {
  Tensor<T> dx, ddy;
  std::vector<compute_t<T>> dgamma;  // in C
};

// second_order_row over every row; ∂γ's row terms summed in blocked_row_sum's fixed order.
template <class T>
NormSecondOrderGrads<T> norm_second_order_rows(const NormRows<T>& s, const Tensor<T>& dy, const Tensor<T>& u,
                                               const Tensor<T>& c_gamma, const Tensor<T>* c_beta) {
  using C = compute_t<T>;
  const std::int64_t H = s.hidden;
  const auto in_c = [&](const Tensor<T>& t) {
    std::vector<C> v(static_cast<std::size_t>(H));
    for (std::int64_t j = 0; j < H; ++j) v[j] = static_cast<C>(t.flat(j));
    return v;
  };
  const std::vector<C> cg = in_c(c_gamma), cb = c_beta ? in_c(*c_beta) : std::vector<C>();
  NormSecondOrderGrads<T> g{Tensor<T>(s.x.shape()), Tensor<T>(s.x.shape()), {}};
  g.dgamma = blocked_row_sum<C>(s.rows, H, 20 * H, [&](std::int64_t begin, std::int64_t end, C* partial) {
    for (std::int64_t r = begin; r < end; ++r) {
      second_order_row(s, r, dy.data() + r * H, u.data() + r * H, cg.data(), c_beta ? cb.data() : nullptr,
                       g.dx.data() + r * H, g.ddy.data() + r * H, partial);
    }
  });
  return g;
}

template <class T> struct NormGrads {
  Tensor<T> dx;                                  // undefined unless asked for
  std::vector<compute_t<T>> dgamma_dbeta;        // [dgamma | dbeta], H each, in C; empty unless either was asked
};

// dx_addend (rows as dy's, where given) joins dx before its rounding.
template <class T>
NormGrads<T> norm_backward(const NormRows<T>& s, const Tensor<T>& dy, bool need_dx, bool need_dgamma,
                           bool need_dbeta, const Tensor<T>* dx_addend = nullptr) {
  using C = compute_t<T>;
  const std::int64_t H = s.hidden;
  NormGrads<T> grads;
  if (need_dx) grads.dx = Tensor<T>(s.x.shape());
  const bool need_params = need_dgamma || need_dbeta;
  std::vector<C> totals =
      blocked_row_sum<C>(s.rows, need_params ? 2 * H : 0, 10 * H, [&](std::int64_t begin, std::int64_t end, C* partial) {
        for (std::int64_t r = begin; r < end; ++r) {
          s.backward_row(r, dy.data() + r * H, need_dx ? grads.dx.data() + r * H : nullptr,
                         need_dgamma ? partial : nullptr, need_dbeta ? partial + H : nullptr,
                         dx_addend ? dx_addend->data() + r * H : nullptr);
        }
      });
  grads.dgamma_dbeta = std::move(totals);
  return grads;
}

}  // namespace tapegrad::detail
