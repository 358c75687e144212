// Activation functions as elementwise expressions: they fuse with the arithmetic around them into one node. tanh and
// sigmoid use Eigen's kernels (ops/detail/packet_math.hpp); the others the array formulas of
// ops/detail/activation_arrays.hpp, which layernorm_mlp shares. All are vectorized.
#pragma once

#include "tapegrad/ops/detail/activation_arrays.hpp"
#include "tapegrad/ops/elementwise.hpp"

namespace tapegrad {

namespace ops {

struct Tanh {
  static const char* name() { return "tanh"; }
  template <class X> auto forward(const X& x) const { return expr::math::tanh(x); }
  template <class X, class G> auto backward(const X& x, const G& g) const {
    return g * (expr::scalar_of(x, 1.0) - expr::math::tanh(x).square());
  }
};
struct Sigmoid {
  static const char* name() { return "sigmoid"; }
  template <class X> auto forward(const X& x) const { return expr::math::sigmoid(x); }
  template <class X, class G> auto backward(const X& x, const G& g) const {
    return g * expr::math::sigmoid(x) * (expr::scalar_of(x, 1.0) - expr::math::sigmoid(x));
  }
};

// Evaluates the array function Fn of ops/detail/activation_arrays.hpp (its derivative when Derivative is true) as an
// Eigen functor: packetOp gives it one packet as a fixed-size array, so a Tensor expression of it stays vectorized; a
// scalar (a loop's tail, which depends on how Eigen blocks the loop, and so on the thread count) goes through the same
// packet code as lane 0 of a packet, so every element gets the same bits wherever it falls. (functor_traits, at the end
// of this file, tells Eigen that packetOp exists.)
template <class Fn, bool Derivative> struct ArrayFunctor {
  Fn fn;
  // The same function on the GPU (see ops/detail/element_term.hpp): its op, and its parameter where it has one.
  cuda::ElementOp gpu_op() const { return Derivative ? Fn::gpu_grad : Fn::gpu_value; }
  double gpu_scalar() const {
    if constexpr (requires { fn.alpha; }) {
      return fn.alpha;
    } else {
      return 0.0;
    }
  }
  template <class A> A apply(const A& x) const {
    A value, grad;
    if constexpr (Derivative) {
      fn(x, value, &grad);  // the unused value is cheap beside the exp both share
      return grad;
    } else {
      fn(x, value, nullptr);
      return value;
    }
  }
  template <class S> S operator()(S x) const {
    using P = typename Eigen::internal::packet_traits<S>::type;
    return Eigen::internal::pfirst(packetOp(Eigen::internal::pset1<P>(x)));
  }
  template <class P> P packetOp(const P& x) const {
    using S = typename Eigen::internal::unpacket_traits<P>::type;
    Eigen::Array<S, Eigen::internal::unpacket_traits<P>::size, 1> xs;
    Eigen::internal::pstoreu(xs.data(), x);
    return Eigen::internal::ploadu<P>(apply(xs).data());
  }
};

template <class Fn, const char* Name> struct ArrayActivation {
  Fn fn;
  static const char* name() { return Name; }
  template <class X> auto forward(const X& x) const { return x.unaryExpr(ArrayFunctor<Fn, false>{fn}); }
  template <class X, class G> auto backward(const X& x, const G& g) const {
    return g * x.unaryExpr(ArrayFunctor<Fn, true>{fn});
  }
};

// The second derivatives of the activations, as expressions of basic ops (so that they differentiate again): what
// a derivative's own backward multiplies by. s = σ(·) below; the limits at ±∞ are not special-cased (an activation's
// derivative of a non-finite input has no second derivative to give).
template <class X> auto second_derivative(const detail::ReluFn&, const X& x) { return expr::scalar_of(x, 0.0) * x; }
template <class X> auto second_derivative(const detail::SquaredReluFn&, const X& x) {
  return x.unaryExpr(ArrayFunctor<detail::ReluFn, true>{}) * expr::scalar_of(x, 2.0);
}
// x·σ(αx): f'' = α·s(1 - s)·(2 + αx(1 - 2s)), s = σ(αx).
template <class X> auto second_derivative(const detail::SwishFn& fn, const X& x) {
  const auto s = expr::math::sigmoid(x * expr::scalar_of(x, fn.alpha));
  return s * (expr::scalar_of(x, 1.0) - s) * expr::scalar_of(x, fn.alpha) *
         (expr::scalar_of(x, 2.0) +
          x * expr::scalar_of(x, fn.alpha) * (expr::scalar_of(x, 1.0) - s * expr::scalar_of(x, 2.0)));
}
// x·σ(z), z = c0(x + c1·x³): f'' = s(1 - s)·(2z' + x·z'²(1 - 2s) + x·z''), z' = c0(1 + 3c1·x²), z'' = 6c0c1·x.
template <class X> auto second_derivative(const detail::GeluTanhFn&, const X& x) {
  const double c0 = 2 * activation::sqrt_2_over_pi, c1 = activation::gelu_tanh_cubic;
  const auto s = expr::math::sigmoid((x + x.square() * x * expr::scalar_of(x, c1)) * expr::scalar_of(x, c0));
  const auto dz = (x.square() * expr::scalar_of(x, 3 * c1) + expr::scalar_of(x, 1.0)) * expr::scalar_of(x, c0);
  return s * (expr::scalar_of(x, 1.0) - s) *
         (dz * expr::scalar_of(x, 2.0) + x * dz.square() * (expr::scalar_of(x, 1.0) - s * expr::scalar_of(x, 2.0)) +
          x.square() * expr::scalar_of(x, 6 * c0 * c1));
}
// x·Φ(x): f'' = φ(x)·(2 - x²), φ the standard normal density.
template <class X> auto second_derivative(const detail::GeluErfFn&, const X& x) {
  return expr::math::exp(x.square() * expr::scalar_of(x, -0.5)) * expr::scalar_of(x, activation::inv_sqrt_2pi) *
         (expr::scalar_of(x, 2.0) - x.square());
}

// An activation's derivative as an op of its own: what the backward of an activation records under create_graph.
template <class Fn, const char* Name> struct ActivationGrad {
  Fn fn;
  static const char* name() { return Name; }
  template <class X> auto forward(const X& x) const { return x.unaryExpr(ArrayFunctor<Fn, true>{fn}); }
  template <class X, class G> auto backward(const X& x, const G& g) const { return g * second_derivative(fn, x); }
};

inline constexpr char relu_name[] = "relu";
inline constexpr char gelu_name[] = "gelu";
inline constexpr char gelu_tanh_name[] = "gelu_tanh";
inline constexpr char silu_name[] = "silu";
inline constexpr char quick_gelu_name[] = "quick_gelu";
inline constexpr char squared_relu_name[] = "squared_relu";
using Relu = ArrayActivation<detail::ReluFn, relu_name>;
using Gelu = ArrayActivation<detail::GeluErfFn, gelu_name>;
using GeluTanh = ArrayActivation<detail::GeluTanhFn, gelu_tanh_name>;
using Silu = ArrayActivation<detail::SwishFn, silu_name>;
using QuickGelu = ArrayActivation<detail::SwishFn, quick_gelu_name>;
using SquaredRelu = ArrayActivation<detail::SquaredReluFn, squared_relu_name>;

inline constexpr char relu_grad_name[] = "relu_grad";
inline constexpr char gelu_grad_name[] = "gelu_grad";
inline constexpr char gelu_tanh_grad_name[] = "gelu_tanh_grad";
inline constexpr char swish_grad_name[] = "swish_grad";
inline constexpr char squared_relu_grad_name[] = "squared_relu_grad";
// The derivative op of each activation function.
template <class Fn> struct GradOp;
template <> struct GradOp<detail::ReluFn> : std::type_identity<ActivationGrad<detail::ReluFn, relu_grad_name>> {};
template <> struct GradOp<detail::GeluErfFn> : std::type_identity<ActivationGrad<detail::GeluErfFn, gelu_grad_name>> {};
template <>
struct GradOp<detail::GeluTanhFn> : std::type_identity<ActivationGrad<detail::GeluTanhFn, gelu_tanh_grad_name>> {};
template <> struct GradOp<detail::SwishFn> : std::type_identity<ActivationGrad<detail::SwishFn, swish_grad_name>> {};
template <>
struct GradOp<detail::SquaredReluFn>
    : std::type_identity<ActivationGrad<detail::SquaredReluFn, squared_relu_grad_name>> {};

}  // namespace ops

enum class GeluApproximation { erf, tanh };

template <expr::Operand X> auto tanh(const X& x) { return expr::make_unary(ops::Tanh{}, x); }
template <expr::Operand X> auto sigmoid(const X& x) { return expr::make_unary(ops::Sigmoid{}, x); }
template <expr::Operand X> auto relu(const X& x) { return expr::make_unary(ops::Relu{}, x); }
// gelu(x) uses the exact erf form; gelu_tanh(x) the tanh approximation.
template <expr::Operand X> auto gelu(const X& x) { return expr::make_unary(ops::Gelu{}, x); }
template <expr::Operand X> auto gelu_tanh(const X& x) { return expr::make_unary(ops::GeluTanh{}, x); }
template <expr::Operand X> auto silu(const X& x) { return expr::make_unary(ops::Silu{{1.0}}, x); }
template <expr::Operand X> auto quick_gelu(const X& x) {
  return expr::make_unary(ops::QuickGelu{{activation::quick_gelu_alpha}}, x);
}
template <expr::Operand X> auto squared_relu(const X& x) { return expr::make_unary(ops::SquaredRelu{}, x); }

}  // namespace tapegrad

// ArrayFunctor has a packetOp: let Eigen call it.
template <class Fn, bool Derivative>
struct Eigen::internal::functor_traits<tapegrad::ops::ArrayFunctor<Fn, Derivative>> {
  enum { Cost = 30 * NumTraits<float>::MulCost, PacketAccess = true };
};
