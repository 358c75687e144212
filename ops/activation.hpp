// Activation functions as elementwise expressions: they fuse with the arithmetic around them into one node.
// tanh and sigmoid use Eigen's vectorized kernels; the others evaluate ops/activation_math.hpp per element.
#pragma once

#include "ops/activation_math.hpp"
#include "ops/elementwise.hpp"

namespace tapegrad {

namespace ops {

struct Tanh {
  static const char* name() { return "tanh"; }
  template <class X> auto forward(const X& x) const { return x.tanh(); }
  template <class X, class G> auto backward(const X& x, const G& g) const {
    return g * (expr::scalar_of(x, 1.0) - x.tanh().square());
  }
};
struct Sigmoid {
  static const char* name() { return "sigmoid"; }
  template <class X> auto forward(const X& x) const { return x.sigmoid(); }
  template <class X, class G> auto backward(const X& x, const G& g) const {
    return g * x.sigmoid() * (expr::scalar_of(x, 1.0) - x.sigmoid());
  }
};

// An activation given by a scalar function and its derivative (functors over float or double).
template <class Value, class Derivative, const char* Name> struct ScalarActivation {
  static const char* name() { return Name; }
  template <class X> auto forward(const X& x) const { return x.unaryExpr(Value{}); }
  template <class X, class G> auto backward(const X& x, const G& g) const { return g * x.unaryExpr(Derivative{}); }
};

#define TAPEGRAD_SCALAR_FUNCTOR(NAME, FN)                    \
  struct NAME {                                              \
    template <class S> S operator()(S x) const { return FN(x); } \
  };
TAPEGRAD_SCALAR_FUNCTOR(ReluValue, activation::relu)
TAPEGRAD_SCALAR_FUNCTOR(ReluGrad, activation::relu_grad)
TAPEGRAD_SCALAR_FUNCTOR(GeluValue, activation::gelu_erf)
TAPEGRAD_SCALAR_FUNCTOR(GeluGrad, activation::gelu_erf_grad)
TAPEGRAD_SCALAR_FUNCTOR(GeluTanhValue, activation::gelu_tanh)
TAPEGRAD_SCALAR_FUNCTOR(GeluTanhGrad, activation::gelu_tanh_grad)
TAPEGRAD_SCALAR_FUNCTOR(SiluValue, activation::silu)
TAPEGRAD_SCALAR_FUNCTOR(SiluGrad, activation::silu_grad)
TAPEGRAD_SCALAR_FUNCTOR(QuickGeluValue, activation::quick_gelu)
TAPEGRAD_SCALAR_FUNCTOR(QuickGeluGrad, activation::quick_gelu_grad)
TAPEGRAD_SCALAR_FUNCTOR(SquaredReluValue, activation::squared_relu)
TAPEGRAD_SCALAR_FUNCTOR(SquaredReluGrad, activation::squared_relu_grad)
#undef TAPEGRAD_SCALAR_FUNCTOR

inline constexpr char relu_name[] = "relu";
inline constexpr char gelu_name[] = "gelu";
inline constexpr char gelu_tanh_name[] = "gelu_tanh";
inline constexpr char silu_name[] = "silu";
inline constexpr char quick_gelu_name[] = "quick_gelu";
inline constexpr char squared_relu_name[] = "squared_relu";
using Relu = ScalarActivation<ReluValue, ReluGrad, relu_name>;
using Gelu = ScalarActivation<GeluValue, GeluGrad, gelu_name>;
using GeluTanh = ScalarActivation<GeluTanhValue, GeluTanhGrad, gelu_tanh_name>;
using Silu = ScalarActivation<SiluValue, SiluGrad, silu_name>;
using QuickGelu = ScalarActivation<QuickGeluValue, QuickGeluGrad, quick_gelu_name>;
using SquaredRelu = ScalarActivation<SquaredReluValue, SquaredReluGrad, squared_relu_name>;

}  // namespace ops

enum class GeluApproximation { erf, tanh };

template <expr::Operand X> auto tanh(const X& x) { return expr::make_unary(ops::Tanh{}, x); }
template <expr::Operand X> auto sigmoid(const X& x) { return expr::make_unary(ops::Sigmoid{}, x); }
template <expr::Operand X> auto relu(const X& x) { return expr::make_unary(ops::Relu{}, x); }
// gelu(x) uses the exact erf form; gelu_tanh(x) the tanh approximation.
template <expr::Operand X> auto gelu(const X& x) { return expr::make_unary(ops::Gelu{}, x); }
template <expr::Operand X> auto gelu_tanh(const X& x) { return expr::make_unary(ops::GeluTanh{}, x); }
template <expr::Operand X> auto silu(const X& x) { return expr::make_unary(ops::Silu{}, x); }
template <expr::Operand X> auto quick_gelu(const X& x) { return expr::make_unary(ops::QuickGelu{}, x); }
template <expr::Operand X> auto squared_relu(const X& x) { return expr::make_unary(ops::SquaredRelu{}, x); }

}  // namespace tapegrad
