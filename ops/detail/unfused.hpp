// Var values whose every op is a node of its own, run by the library's precompiled single-op kernels
// (expr::recorded_unary and recorded_binary, ops/detail/elementwise_graph.hpp): for library code instantiated in
// every dtype whose ops are there to be recorded rather than to be fast (the formulas of recorded backwards, the
// layernorm_mlp composite), which would otherwise compile a fused expression of its own per dtype.
//
//   const Unfused<T> x{v}, y{w};
//   const Var<T> z = (x * y - exp(x) + 1.0).v;
#pragma once

#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/reduce.hpp"

namespace tapegrad::detail {

template <class T> struct Unfused {
  Var<T> v;

  friend Unfused operator+(const Unfused& a, const Unfused& b) { return {expr::recorded_binary<ops::Add>(a.v, b.v)}; }
  friend Unfused operator-(const Unfused& a, const Unfused& b) { return {expr::recorded_binary<ops::Sub>(a.v, b.v)}; }
  friend Unfused operator*(const Unfused& a, const Unfused& b) { return {expr::recorded_binary<ops::Mul>(a.v, b.v)}; }
  friend Unfused operator/(const Unfused& a, const Unfused& b) { return {expr::recorded_binary<ops::Div>(a.v, b.v)}; }
  friend Unfused operator+(const Unfused& a, double c) { return {expr::recorded_unary(ops::AddScalar{c}, a.v)}; }
  friend Unfused operator*(const Unfused& a, double c) { return {expr::recorded_unary(ops::MulScalar{c}, a.v)}; }
  friend Unfused exp(const Unfused& a) { return {expr::recorded_unary(ops::Exp{}, a.v)}; }
  friend Unfused log(const Unfused& a) { return {expr::recorded_unary(ops::Log{}, a.v)}; }
  friend Unfused square(const Unfused& a) { return {expr::recorded_unary(ops::Square{}, a.v)}; }
  friend Unfused rsqrt(const Unfused& a) { return {expr::recorded_unary(ops::Rsqrt{}, a.v)}; }
  // Any other precompiled unary op: an activation, a scalar op.
  template <class Op> Unfused apply(const Op& op) const { return {expr::recorded_unary(op, v)}; }
};

}  // namespace tapegrad::detail
