// The recorded chain rule of the elementwise ops (create_graph, ops/detail/expression.hpp's backward_recorded). Each
// op's backward, written once against Eigen's array interface (ops/elementwise.hpp, ops/activation.hpp), is called
// here with Recorded values, Vars whose every operation records: the op's step of the chain rule becomes a few
// single-op nodes, differentiable again by the same means. Compiled once for every op and dtype (one file per dtype,
// ops/elementwise_graph/), so that the expressions a program writes instantiate none of it.
#pragma once
#include "tapegrad/ops/activation.hpp"
#include "tapegrad/ops/elementwise.hpp"

namespace tapegrad::expr {

namespace chain_rule {  // (a header of one includer per dtype: ops/elementwise_graph/)

template <class T> struct Recorded;
template <class T> Recorded<T> value(const Var<T>& v) { return {v}; }
// An expression evaluated (recorded) at once: each op of a step is its own node over variables, so that only
// single-op expressions are ever instantiated (fusing a whole step would compile its chain rule in Eigen again).
template <class E> auto as_recorded(const E& e) {
  if constexpr (is_var<E>::value) {
    return value(e);
  } else {
    return value(e.evaluate());
  }
}

// A value of the chain rule, a Var, with the part of the array interface that the op definitions use (as Term has
// for the GPU).
template <class T> struct Recorded {
  using recorded = void;  // (expr::Recorded)
  Var<T> v;

  auto exp() const { return as_recorded(tapegrad::exp(v)); }
  auto log() const { return as_recorded(tapegrad::log(v)); }
  auto sqrt() const { return as_recorded(tapegrad::sqrt(v)); }
  auto rsqrt() const { return as_recorded(tapegrad::rsqrt(v)); }
  auto square() const { return as_recorded(tapegrad::square(v)); }
  auto abs() const { return as_recorded(tapegrad::abs(v)); }
  auto sign() const { return as_recorded(make_unary(ops::Sign{}, v)); }
  auto tanh() const { return as_recorded(tapegrad::tanh(v)); }
  auto sigmoid() const { return as_recorded(tapegrad::sigmoid(v)); }
  auto pow(const Recorded& y) const { return as_recorded(tapegrad::pow(v, y.v)); }
  auto pow(double p) const { return as_recorded(tapegrad::pow(v, p)); }
  // An activation's derivative: the op of its own (ops::ActivationGrad), whose backward is the second derivative.
  template <class Fn> auto unaryExpr(const ops::ArrayFunctor<Fn, true>& f) const {
    return as_recorded(make_unary(typename ops::GradOp<Fn>::type{f.fn}, v));
  }
};

// (The Var operators are named: from here ordinary lookup would find only these.)
template <class T> auto operator+(const Recorded<T>& a, const Recorded<T>& b) {
  return as_recorded(tapegrad::operator+(a.v, b.v));
}
template <class T> auto operator-(const Recorded<T>& a, const Recorded<T>& b) {
  return as_recorded(tapegrad::operator-(a.v, b.v));
}
template <class T> auto operator*(const Recorded<T>& a, const Recorded<T>& b) {
  return as_recorded(tapegrad::operator*(a.v, b.v));
}
template <class T> auto operator/(const Recorded<T>& a, const Recorded<T>& b) {
  return as_recorded(tapegrad::operator/(a.v, b.v));
}
template <class T> auto operator+(const Recorded<T>& a, double c) { return as_recorded(tapegrad::operator+(a.v, c)); }
template <class T> auto operator+(double c, const Recorded<T>& a) { return as_recorded(tapegrad::operator+(c, a.v)); }
template <class T> auto operator-(const Recorded<T>& a, double c) { return as_recorded(tapegrad::operator-(a.v, c)); }
template <class T> auto operator-(double c, const Recorded<T>& a) { return as_recorded(tapegrad::operator-(c, a.v)); }
template <class T> auto operator*(const Recorded<T>& a, double c) { return as_recorded(tapegrad::operator*(a.v, c)); }
template <class T> auto operator*(double c, const Recorded<T>& a) { return as_recorded(tapegrad::operator*(c, a.v)); }
template <class T> auto operator/(const Recorded<T>& a, double c) { return as_recorded(tapegrad::operator/(a.v, c)); }
template <class T> auto operator/(double c, const Recorded<T>& a) { return as_recorded(tapegrad::operator/(c, a.v)); }
template <class T> auto operator-(const Recorded<T>& a) { return as_recorded(tapegrad::operator-(a.v)); }

}  // namespace chain_rule

template <class Op, class T> Var<T> recorded_unary(const Op& op, const Var<T>& x) {
  return make_unary(op, x).evaluate();
}
template <class Op, class T> Var<T> recorded_binary(const Var<T>& x, const Var<T>& y) {
  return make_binary<Op>(x, y).evaluate();
}
template <class Op, class T> Var<T> recorded_backward(const Op& op, const Var<T>& x, const Var<T>& g) {
  return op.backward(chain_rule::value(x), chain_rule::value(g)).v;
}
template <class Op, class T> Var<T> recorded_backward_a(const Var<T>& x, const Var<T>& y, const Var<T>& g) {
  return Op::backward_a(chain_rule::value(x), chain_rule::value(y), chain_rule::value(g)).v;
}
template <class Op, class T> Var<T> recorded_backward_b(const Var<T>& x, const Var<T>& y, const Var<T>& g) {
  return Op::backward_b(chain_rule::value(x), chain_rule::value(y), chain_rule::value(g)).v;
}

#define TAPEGRAD_RECORDED_UNARY(Op, T)                                                \
  template Var<T> recorded_unary<Op, T>(const Op&, const Var<T>&);                     \
  template Var<T> recorded_backward<Op, T>(const Op&, const Var<T>&, const Var<T>&);
#define TAPEGRAD_RECORDED_BINARY(Op, T)                                                         \
  template Var<T> recorded_binary<Op, T>(const Var<T>&, const Var<T>&);                         \
  template Var<T> recorded_backward_a<Op, T>(const Var<T>&, const Var<T>&, const Var<T>&);      \
  template Var<T> recorded_backward_b<Op, T>(const Var<T>&, const Var<T>&, const Var<T>&);
#define TAPEGRAD_RECORDED_OPS(T)                                              \
  TAPEGRAD_RECORDED_BINARY(ops::Add, T)                                       \
  TAPEGRAD_RECORDED_BINARY(ops::Sub, T)                                       \
  TAPEGRAD_RECORDED_BINARY(ops::Mul, T)                                       \
  TAPEGRAD_RECORDED_BINARY(ops::Div, T)                                       \
  TAPEGRAD_RECORDED_BINARY(ops::Pow, T)                                       \
  TAPEGRAD_RECORDED_UNARY(ops::Neg, T)                                        \
  TAPEGRAD_RECORDED_UNARY(ops::Exp, T)                                        \
  TAPEGRAD_RECORDED_UNARY(ops::Log, T)                                        \
  TAPEGRAD_RECORDED_UNARY(ops::Sqrt, T)                                       \
  TAPEGRAD_RECORDED_UNARY(ops::Rsqrt, T)                                      \
  TAPEGRAD_RECORDED_UNARY(ops::Square, T)                                     \
  TAPEGRAD_RECORDED_UNARY(ops::Abs, T)                                        \
  TAPEGRAD_RECORDED_UNARY(ops::Sign, T)                                       \
  TAPEGRAD_RECORDED_UNARY(ops::AddScalar, T)                                  \
  TAPEGRAD_RECORDED_UNARY(ops::MulScalar, T)                                  \
  TAPEGRAD_RECORDED_UNARY(ops::ScalarMinus, T)                                \
  TAPEGRAD_RECORDED_UNARY(ops::ScalarOver, T)                                 \
  TAPEGRAD_RECORDED_UNARY(ops::PowScalar, T)                                  \
  TAPEGRAD_RECORDED_UNARY(ops::Tanh, T)                                       \
  TAPEGRAD_RECORDED_UNARY(ops::Sigmoid, T)                                    \
  TAPEGRAD_RECORDED_UNARY(ops::Relu, T)                                       \
  TAPEGRAD_RECORDED_UNARY(ops::Gelu, T)                                       \
  TAPEGRAD_RECORDED_UNARY(ops::GeluTanh, T)                                   \
  TAPEGRAD_RECORDED_UNARY(ops::Silu, T)                                       \
  TAPEGRAD_RECORDED_UNARY(ops::QuickGelu, T)                                  \
  TAPEGRAD_RECORDED_UNARY(ops::SquaredRelu, T)                                \
  TAPEGRAD_RECORDED_UNARY(ops::GradOp<detail::ReluFn>::type, T)               \
  TAPEGRAD_RECORDED_UNARY(ops::GradOp<detail::GeluErfFn>::type, T)            \
  TAPEGRAD_RECORDED_UNARY(ops::GradOp<detail::GeluTanhFn>::type, T)           \
  TAPEGRAD_RECORDED_UNARY(ops::GradOp<detail::SwishFn>::type, T)              \
  TAPEGRAD_RECORDED_UNARY(ops::GradOp<detail::SquaredReluFn>::type, T)
}  // namespace tapegrad::expr
