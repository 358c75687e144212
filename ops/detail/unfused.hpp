// Var values whose every op is a node of its own, run by the library's precompiled single-op kernels
// (expr::recorded_unary and recorded_binary, ops/detail/elementwise_graph.hpp): for the formulas of recorded
// backwards (create_graph), which would otherwise compile a fused expression of their own for every dtype.
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
};

}  // namespace tapegrad::detail
