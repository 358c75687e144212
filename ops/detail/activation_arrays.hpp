// The activations and their derivatives as Eigen array expressions: the CPU's one definition of them, vectorized
// (Eigen's packet exp and, for f32, erf) in f32 and f64. Internal: the elementwise activations of ops/activation.hpp
// evaluate them one packet at a time, layernorm_mlp's row kernels (ops/layernorm_mlp/detail/cpu_activation.hpp) one row
// at a time. cuda/detail/activation_math.hpp holds the same functions per scalar, for the GPU.
//
// Each is a functor `fn(x, value, grad)` over any Eigen array expression x (those the elementwise ops use also name
// their GPU ops, gpu_value and gpu_grad, which run cuda/detail/activation_math.hpp's scalar forms): it writes fn(x) to
// value and, when grad is not null, fn'(x) to *grad, from one evaluation of exp or erf. Where a factor that saturates
// to 0 multiplies one that grows without bound (x·σ at x = -inf, x·σ'(z)·z' once x³ overflows f32), the product is its
// limit 0, not 0·inf = NaN: every function is finite or ±inf, never NaN, for every non-NaN x.
#pragma once

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>

#include <cmath>
#include <limits>

#include "tapegrad/cuda/detail/element_op.hpp"
#include "tapegrad/cuda/detail/activation_math.hpp"

namespace tapegrad::detail {

template <class X> using plain_t = typename X::PlainObject;

// Eigen 3.4 vectorizes neither select nor casts of comparisons: the two masks the activations need are functors
// with a packetOp of their own (their functor_traits are at the end of this file).

// 1 where x > 0, else 0: the derivative of max(x, 0).
struct StepOp {
  template <class S> S operator()(S x) const { return x > S(0) ? S(1) : S(0); }
  template <class P> P packetOp(const P& x) const {
    using namespace Eigen::internal;
    return pselect(pcmp_lt(pzero(x), x), pset1<P>(1), pzero(x));
  }
};

// a·b, but 0 where |b| is below the normal range, even for infinite a: the limit of a vanishing factor times a
// growing one. Subnormal b counts as 0 because Eigen's f64 exp stops short of 0 (at ~5e-309); the terms dropped
// so are below 1e-35 in f32 and 1e-300 in f64.
struct TimesVanishingOp {
  template <class S> S operator()(S a, S b) const {
    return std::abs(b) < std::numeric_limits<S>::min() ? S(0) : a * b;
  }
  template <class P> P packetOp(const P& a, const P& b) const {
    using namespace Eigen::internal;
    using S = typename unpacket_traits<P>::type;
    return pselect(pcmp_lt(pabs(b), pset1<P>(std::numeric_limits<S>::min())), pzero(a), pmul(a, b));
  }
};

template <class X> auto step(const Eigen::ArrayBase<X>& x) { return x.unaryExpr(StepOp{}); }
template <class A, class B> auto times_vanishing(const Eigen::ArrayBase<A>& a, const Eigen::ArrayBase<B>& b) {
  return a.binaryExpr(b, TimesVanishingOp{});
}

// σ(x) = 1 / (1 + exp(-x)) with Eigen's vectorized exp, for f32 and f64 alike (its tanh and logistic are only
// vectorized for f32). It reaches exactly 0 and 1.
template <class X> auto sigmoid_of(const Eigen::ArrayBase<X>& x) {
  using C = typename X::Scalar;
  return (C(1) + (-x).exp()).inverse();
}

// x·σ(z) for z = z(x), and its derivative σ(z) + x·σ(z)(1 - σ(z))·dz, given z and dz = z'(x).
template <class X, class Z, class DZ>
void times_sigmoid(const Eigen::ArrayBase<X>& x, const Z& z, const DZ& dz, plain_t<X>& value, plain_t<X>* grad) {
  using C = typename X::Scalar;
  const plain_t<X> s = sigmoid_of(z);
  value = times_vanishing(x, s);
  if (grad) {
    const plain_t<X> slope = s * (C(1) - s);
    *grad = s + times_vanishing(x * dz, slope);
  }
}

struct ReluFn {
  static constexpr cuda::ElementOp gpu_value = cuda::ElementOp::relu, gpu_grad = cuda::ElementOp::relu_grad;
  template <class X> void operator()(const Eigen::ArrayBase<X>& x, plain_t<X>& value, plain_t<X>* grad) const {
    using C = typename X::Scalar;
    value = x.max(C(0));
    if (grad) *grad = step(x);
  }
};

struct SquaredReluFn {
  static constexpr cuda::ElementOp gpu_value = cuda::ElementOp::squared_relu,
                                   gpu_grad = cuda::ElementOp::squared_relu_grad;
  template <class X> void operator()(const Eigen::ArrayBase<X>& x, plain_t<X>& value, plain_t<X>* grad) const {
    using C = typename X::Scalar;
    const plain_t<X> r = x.max(C(0));
    value = r.square();
    if (grad) *grad = C(2) * r;
  }
};

struct SigmoidFn {
  template <class X> void operator()(const Eigen::ArrayBase<X>& x, plain_t<X>& value, plain_t<X>* grad) const {
    using C = typename X::Scalar;
    value = sigmoid_of(x);
    if (grad) *grad = value * (C(1) - value);
  }
};

// x·σ(alpha·x): silu for alpha = 1, quick_gelu for alpha = 1.702.
struct SwishFn {
  static constexpr cuda::ElementOp gpu_value = cuda::ElementOp::swish, gpu_grad = cuda::ElementOp::swish_grad;
  double alpha;
  template <class X> void operator()(const Eigen::ArrayBase<X>& x, plain_t<X>& value, plain_t<X>* grad) const {
    using C = typename X::Scalar;
    const C a = C(alpha);
    times_sigmoid(x, a * x, a, value, grad);
  }
};

// The tanh form 0.5·x·(1 + tanh(u)), u = √(2/π)·(x + 0.044715·x³), computed as x·σ(2u).
struct GeluTanhFn {
  static constexpr cuda::ElementOp gpu_value = cuda::ElementOp::gelu_tanh,
                                   gpu_grad = cuda::ElementOp::gelu_tanh_grad;
  template <class X> void operator()(const Eigen::ArrayBase<X>& x, plain_t<X>& value, plain_t<X>* grad) const {
    using C = typename X::Scalar;
    const C k0 = C(2 * activation::sqrt_2_over_pi), k1 = C(activation::gelu_tanh_cubic);
    times_sigmoid(x, k0 * (x + k1 * x.cube()), k0 * (C(1) + C(3) * k1 * x.square()), value, grad);
  }
};

// The exact form x·Φ(x), Φ the standard normal CDF; its derivative Φ(x) + x·φ(x).
struct GeluErfFn {
  static constexpr cuda::ElementOp gpu_value = cuda::ElementOp::gelu_erf, gpu_grad = cuda::ElementOp::gelu_erf_grad;
  template <class X> void operator()(const Eigen::ArrayBase<X>& x, plain_t<X>& value, plain_t<X>* grad) const {
    using C = typename X::Scalar;
    const plain_t<X> cdf = C(0.5) * (C(1) + (x * C(activation::inv_sqrt_2)).erf());
    value = times_vanishing(x, cdf);
    if (grad) {
      const plain_t<X> pdf = C(activation::inv_sqrt_2pi) * (C(-0.5) * x.square()).exp();
      *grad = cdf + times_vanishing(x, pdf);
    }
  }
};

}  // namespace tapegrad::detail

template <> struct Eigen::internal::functor_traits<tapegrad::detail::StepOp> {
  enum { Cost = 2, PacketAccess = true };
};
template <> struct Eigen::internal::functor_traits<tapegrad::detail::TimesVanishingOp> {
  enum { Cost = 3, PacketAccess = true };
};
