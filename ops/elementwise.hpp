// Elementwise arithmetic and math on Vars, with NumPy broadcasting. Every function here returns a lazy
// expression (see ops/detail/expression.hpp); a whole expression records as one tape node when it becomes a Var.
// Each op is its forward and its derivative side by side, written as Eigen expressions in the compute type.
#pragma once

#include <cmath>

#include "tapegrad/ops/detail/expression.hpp"
#include "tapegrad/ops/detail/packet_math.hpp"

namespace tapegrad {

namespace ops {

// ---- binary ------------------------------------------------------------------------------------------------
struct Add {
  static const char* name() { return "add"; }
  template <class X, class Y> static auto forward(const X& x, const Y& y) { return x + y; }
  template <class X, class Y, class G> static auto backward_a(const X&, const Y&, const G& g) { return g; }
  template <class X, class Y, class G> static auto backward_b(const X&, const Y&, const G& g) { return g; }
};
struct Sub {
  static const char* name() { return "sub"; }
  template <class X, class Y> static auto forward(const X& x, const Y& y) { return x - y; }
  template <class X, class Y, class G> static auto backward_a(const X&, const Y&, const G& g) { return g; }
  template <class X, class Y, class G> static auto backward_b(const X&, const Y&, const G& g) { return -g; }
};
struct Mul {
  static const char* name() { return "mul"; }
  template <class X, class Y> static auto forward(const X& x, const Y& y) { return x * y; }
  template <class X, class Y, class G> static auto backward_a(const X&, const Y& y, const G& g) { return g * y; }
  template <class X, class Y, class G> static auto backward_b(const X& x, const Y&, const G& g) { return g * x; }
};
struct Div {
  static const char* name() { return "div"; }
  template <class X, class Y> static auto forward(const X& x, const Y& y) { return x / y; }
  template <class X, class Y, class G> static auto backward_a(const X&, const Y& y, const G& g) { return g / y; }
  // d(x/y)/dy = -x / y²
  template <class X, class Y, class G> static auto backward_b(const X& x, const Y& y, const G& g) {
    return -(g * x / y.square());
  }
};
struct Pow {
  static const char* name() { return "pow"; }
  template <class S> struct Power {
    S operator()(S x, S y) const { return std::pow(x, y); }
  };
  template <class X, class Y> static auto forward(const X& x, const Y& y) {
    if constexpr (std::is_same_v<X, Term> || expr::Recorded<X>) {
      return x.pow(y);
    } else {
      using S = typename Eigen::internal::traits<X>::Scalar;
      return x.binaryExpr(y, Power<S>{});
    }
  }
  // d(x^y)/dx = y·x^(y-1); d(x^y)/dy = x^y·log(x)
  template <class X, class Y, class G> static auto backward_a(const X& x, const Y& y, const G& g) {
    return g * y * forward(x, y - expr::scalar_of(y, 1.0));
  }
  template <class X, class Y, class G> static auto backward_b(const X& x, const Y& y, const G& g) {
    return g * forward(x, y) * x.log();
  }
};

// ---- unary (some with a scalar parameter) -------------------------------------------------------------------
struct Neg {
  static const char* name() { return "neg"; }
  template <class X> auto forward(const X& x) const { return -x; }
  template <class X, class G> auto backward(const X&, const G& g) const { return -g; }
};
struct Exp {
  static const char* name() { return "exp"; }
  template <class X> auto forward(const X& x) const { return expr::math::exp(x); }
  template <class X, class G> auto backward(const X& x, const G& g) const { return g * expr::math::exp(x); }
};
struct Log {
  static const char* name() { return "log"; }
  template <class X> auto forward(const X& x) const { return expr::math::log(x); }
  template <class X, class G> auto backward(const X& x, const G& g) const { return g / x; }
};
struct Sqrt {
  static const char* name() { return "sqrt"; }
  template <class X> auto forward(const X& x) const { return x.sqrt(); }
  template <class X, class G> auto backward(const X& x, const G& g) const {
    return g * expr::math::rsqrt(x) * expr::scalar_of(x, 0.5);
  }
};
struct Rsqrt {
  static const char* name() { return "rsqrt"; }
  template <class X> auto forward(const X& x) const { return expr::math::rsqrt(x); }
  // d(x^-1/2)/dx = -x^-1/2 / (2x)
  template <class X, class G> auto backward(const X& x, const G& g) const {
    return g * expr::math::rsqrt(x) / x * expr::scalar_of(x, -0.5);
  }
};
struct Square {
  static const char* name() { return "square"; }
  template <class X> auto forward(const X& x) const { return x.square(); }
  template <class X, class G> auto backward(const X& x, const G& g) const { return g * x * expr::scalar_of(x, 2.0); }
};
struct Abs {
  static const char* name() { return "abs"; }
  template <class X> auto forward(const X& x) const { return x.abs(); }
  template <class X, class G> auto backward(const X& x, const G& g) const { return g * x.sign(); }
};
// The sign, -1, 0 or 1: what abs's derivative is made of; its own derivative is 0 (almost everywhere).
struct Sign {
  static const char* name() { return "sign"; }
  template <class X> auto forward(const X& x) const { return x.sign(); }
  template <class X, class G> auto backward(const X& x, const G& g) const { return g * expr::scalar_of(x, 0.0); }
};
struct AddScalar {
  double c;
  static const char* name() { return "add_scalar"; }
  template <class X> auto forward(const X& x) const { return x + expr::scalar_of(x, c); }
  template <class X, class G> auto backward(const X&, const G& g) const { return g; }
};
struct MulScalar {
  double c;
  static const char* name() { return "mul_scalar"; }
  template <class X> auto forward(const X& x) const { return x * expr::scalar_of(x, c); }
  template <class X, class G> auto backward(const X& x, const G& g) const { return g * expr::scalar_of(x, c); }
};
struct ScalarMinus {  // c - x
  double c;
  static const char* name() { return "scalar_sub"; }
  template <class X> auto forward(const X& x) const { return expr::scalar_of(x, c) - x; }
  template <class X, class G> auto backward(const X&, const G& g) const { return -g; }
};
struct ScalarOver {  // c / x
  double c;
  static const char* name() { return "scalar_div"; }
  template <class X> auto forward(const X& x) const { return expr::scalar_of(x, c) / x; }
  template <class X, class G> auto backward(const X& x, const G& g) const {
    return g * expr::scalar_of(x, -c) / x.square();
  }
};
struct PowScalar {  // x^p
  double p;
  static const char* name() { return "pow_scalar"; }
  template <class X> auto forward(const X& x) const { return x.pow(expr::scalar_of(x, p)); }
  template <class X, class G> auto backward(const X& x, const G& g) const {
    return g * x.pow(expr::scalar_of(x, p - 1)) * expr::scalar_of(x, p);
  }
};

}  // namespace ops

// ---- the user-facing functions ----------------------------------------------------------------------------------
template <class X> concept Scalar = std::is_arithmetic_v<X>;

template <expr::Operand X, expr::Operand Y> auto operator+(const X& x, const Y& y) {
  return expr::make_binary<ops::Add>(x, y);
}
template <expr::Operand X, expr::Operand Y> auto operator-(const X& x, const Y& y) {
  return expr::make_binary<ops::Sub>(x, y);
}
template <expr::Operand X, expr::Operand Y> auto operator*(const X& x, const Y& y) {
  return expr::make_binary<ops::Mul>(x, y);
}
template <expr::Operand X, expr::Operand Y> auto operator/(const X& x, const Y& y) {
  return expr::make_binary<ops::Div>(x, y);
}
template <expr::Operand X, expr::Operand Y> auto pow(const X& x, const Y& y) {
  return expr::make_binary<ops::Pow>(x, y);
}

template <expr::Operand X, Scalar S> auto operator+(const X& x, S c) { return expr::make_unary(ops::AddScalar{double(c)}, x); }
template <expr::Operand X, Scalar S> auto operator+(S c, const X& x) { return expr::make_unary(ops::AddScalar{double(c)}, x); }
template <expr::Operand X, Scalar S> auto operator-(const X& x, S c) { return expr::make_unary(ops::AddScalar{-double(c)}, x); }
template <expr::Operand X, Scalar S> auto operator-(S c, const X& x) { return expr::make_unary(ops::ScalarMinus{double(c)}, x); }
template <expr::Operand X, Scalar S> auto operator*(const X& x, S c) { return expr::make_unary(ops::MulScalar{double(c)}, x); }
template <expr::Operand X, Scalar S> auto operator*(S c, const X& x) { return expr::make_unary(ops::MulScalar{double(c)}, x); }
template <expr::Operand X, Scalar S> auto operator/(const X& x, S c) { return expr::make_unary(ops::MulScalar{1.0 / double(c)}, x); }
template <expr::Operand X, Scalar S> auto operator/(S c, const X& x) { return expr::make_unary(ops::ScalarOver{double(c)}, x); }
template <expr::Operand X, Scalar S> auto pow(const X& x, S p) { return expr::make_unary(ops::PowScalar{double(p)}, x); }

template <expr::Operand X> auto operator-(const X& x) { return expr::make_unary(ops::Neg{}, x); }
template <expr::Operand X> auto neg(const X& x) { return expr::make_unary(ops::Neg{}, x); }
template <expr::Operand X> auto exp(const X& x) { return expr::make_unary(ops::Exp{}, x); }
template <expr::Operand X> auto log(const X& x) { return expr::make_unary(ops::Log{}, x); }
template <expr::Operand X> auto sqrt(const X& x) { return expr::make_unary(ops::Sqrt{}, x); }
template <expr::Operand X> auto rsqrt(const X& x) { return expr::make_unary(ops::Rsqrt{}, x); }
template <expr::Operand X> auto square(const X& x) { return expr::make_unary(ops::Square{}, x); }
template <expr::Operand X> auto abs(const X& x) { return expr::make_unary(ops::Abs{}, x); }

// Named forms of the operators, evaluated at once: each records its own node (useful to compare with fusion).
template <expr::Operand X, expr::Operand Y> auto add(const X& x, const Y& y) { return eval(x + y); }
template <expr::Operand X, expr::Operand Y> auto sub(const X& x, const Y& y) { return eval(x - y); }
template <expr::Operand X, expr::Operand Y> auto mul(const X& x, const Y& y) { return eval(x * y); }
template <expr::Operand X, expr::Operand Y> auto div(const X& x, const Y& y) { return eval(x / y); }

}  // namespace tapegrad
