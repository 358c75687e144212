// The second derivatives of layernorm and rmsnorm (ops/norm.cpp): the vector-Jacobian product of the norm's backward
// (dx, dγ, dβ) = B(x, γ, dy) at cotangents (u, cγ, cβ). Here written with Var ops (single-op nodes,
// ops/detail/unfused.hpp), for the recorded second derivatives (create_graph: a third derivative); the plain ones run
// the same formulas fused, a row at a time (ops/detail/norm_rows.hpp, cuda/norm.cu).
//
// Per row, with ⟨·⟩ the mean over the normalized axis: x̂ = (x - μ)·r, r = 1/√(⟨(x - μ)²⟩ + ε) (rmsnorm: μ = 0),
// a = dy·γ (γ + 1 when zero-centered); the backward is dx = r·(a - ⟨a⟩ - x̂⟨a x̂⟩), dγ = Σ dy·x̂, dβ = Σ dy (sums over
// the rows). Its derivatives, the terms in ⟨a⟩, ⟨u⟩, ⟨G⟩ absent for rmsnorm:
//   P  = r·(u - ⟨u⟩ - x̂⟨u x̂⟩)                      Σ u·dx through a
//   G  = cγ·dy - r·(a⟨u x̂⟩ + u⟨a x̂⟩)               through x̂ at fixed r (and dγ's x̂)
//   s  = ⟨u a⟩ - ⟨a⟩⟨u⟩ - ⟨a x̂⟩⟨u x̂⟩               through r (Σ u·dx / r, over the row's length)
//   ∂x = r·(G - ⟨G⟩ - x̂⟨G x̂⟩) - r²·x̂·s      (x̂'s own backward, and r's: ∂r/∂x = -r²·x̂ / length)
//   ∂γ = Σ P·dy,   ∂dy = P·γ + cγ·x̂ + cβ
#pragma once

#include "tapegrad/ops/detail/unfused.hpp"

namespace tapegrad::detail {

template <class T> struct NormSecondOrder {
  Var<T> dx, dgamma, ddy;
};

// `c_beta` is null for a norm without a shift.
template <class T>
NormSecondOrder<T> norm_second_order(bool centered, double epsilon, bool zero_centered_gamma, const Var<T>& x_,
                                     const Var<T>& gamma_, const Var<T>& dy_, const Var<T>& u_,
                                     const Var<T>& c_gamma_, const Var<T>* c_beta) {
  using V = Unfused<T>;
  const auto row_mean = [](const V& a) { return V{mean(a.v, {-1}, true)}; };
  const V x{x_}, gamma{gamma_}, dy{dy_}, u{u_}, c_gamma{c_gamma_};
  const V c = centered ? x - row_mean(x) : x;
  const V r = rsqrt(row_mean(c * c) + epsilon);
  const V xh = c * r;
  const V scale = zero_centered_gamma ? gamma + 1.0 : gamma;
  const V a = dy * scale;
  const V u_xh = row_mean(u * xh), a_xh = row_mean(a * xh), u_a = row_mean(u * a);
  const V G = c_gamma * dy - r * (a * u_xh + u * a_xh);
  const V G_xh = row_mean(G * xh);
  V P = u - xh * u_xh, s = u_a - a_xh * u_xh, G_centered = G - xh * G_xh;
  if (centered) {
    const V u_m = row_mean(u);
    P = P - u_m;
    s = s - row_mean(a) * u_m;
    G_centered = G_centered - row_mean(G);
  }
  P = r * P;
  const V dx = r * G_centered - r * r * xh * s;
  const Var<T> dgamma = sum_to((P * dy).v, gamma_.shape());
  V ddy = P * scale + c_gamma * xh;
  if (c_beta) ddy = ddy + V{*c_beta};
  return {dx.v, dgamma, ddy.v};
}

}  // namespace tapegrad::detail
