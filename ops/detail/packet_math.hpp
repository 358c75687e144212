// exp, log, tanh, sigmoid and rsqrt for elementwise expressions, with the same bits for every element wherever it
// falls. Eigen's scalar and packet versions of these can differ in the last bit (std::exp against its own pexp, 1/sqrt
// against a refined rsqrt estimate), and which elements Eigen evaluates one by one (a loop's tail) depends on how it
// blocks the loop, and so on the thread count. Here the scalar path runs the packet code as lane 0 of a packet, as
// ArrayFunctor (ops/activation.hpp) does for the activations. Each also takes a GPU Term (ops/detail/element_term.hpp).
// A namespace of their own: argument-dependent lookup of exp(e) on an expression (namespace expr) must not find them.
#pragma once

#include "tapegrad/ops/detail/element_term.hpp"
#include "tapegrad/tensor/eigen.hpp"

namespace tapegrad::expr {
// A value of the recorded chain rule (create_graph: ops/elementwise_graph.cpp), which builds expressions of Vars
// from the same op definitions.
template <class X> concept Recorded = requires { typename X::recorded; };
}  // namespace tapegrad::expr

namespace tapegrad::expr::math {

// Eigen's functor F, its scalar path through F's packet code where F has one.
template <class F> struct LaneZero {
  F f;
  template <class S> S operator()(S x) const {
    if constexpr (Eigen::internal::functor_traits<F>::PacketAccess) {
      using P = typename Eigen::internal::packet_traits<S>::type;
      return Eigen::internal::pfirst(f.packetOp(Eigen::internal::pset1<P>(x)));
    } else {
      return f(x);
    }
  }
  template <class P> P packetOp(const P& x) const { return f.packetOp(x); }
};

template <template <class> class Op, class X> auto lane_zero(const X& x) {
  return x.unaryExpr(LaneZero<Op<typename Eigen::internal::traits<X>::Scalar>>{});
}

// (A recorded value, expr::Recorded, has these as members.)
template <class X> auto exp(const X& x) {
  if constexpr (Recorded<X>) return x.exp();
  else return lane_zero<Eigen::internal::scalar_exp_op>(x);
}
template <class X> auto log(const X& x) {
  if constexpr (Recorded<X>) return x.log();
  else return lane_zero<Eigen::internal::scalar_log_op>(x);
}
template <class X> auto tanh(const X& x) {
  if constexpr (Recorded<X>) return x.tanh();
  else return lane_zero<Eigen::internal::scalar_tanh_op>(x);
}
template <class X> auto sigmoid(const X& x) {
  if constexpr (Recorded<X>) return x.sigmoid();
  else return lane_zero<Eigen::internal::scalar_logistic_op>(x);
}
template <class X> auto rsqrt(const X& x) {
  if constexpr (Recorded<X>) return x.rsqrt();
  else return lane_zero<Eigen::internal::scalar_rsqrt_op>(x);
}
inline Term exp(const Term& x) { return x.exp(); }
inline Term log(const Term& x) { return x.log(); }
inline Term tanh(const Term& x) { return x.tanh(); }
inline Term sigmoid(const Term& x) { return x.sigmoid(); }
inline Term rsqrt(const Term& x) { return x.rsqrt(); }

}  // namespace tapegrad::expr::math

// LaneZero vectorizes as F does.
template <class F> struct Eigen::internal::functor_traits<tapegrad::expr::math::LaneZero<F>> : functor_traits<F> {};
