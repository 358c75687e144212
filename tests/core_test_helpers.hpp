// Helpers the core tests share: a reduction built on the public custom-op API (the core itself has none), and a
// tensor comparison that doctest's CHECK prints on failure.
#pragma once

#include <cmath>
#include <ostream>
#include <sstream>
#include <string>

#include "tapegrad.hpp"

namespace tapegrad::test {

// out[i] = f(in[i]), and out[i] = f(a[i], b[i]) for tensors of one shape: plain loops for custom ops in tests.
template <class F> Tensor<double> map(const Tensor<double>& in, F f) {
  Tensor<double> out(in.shape());
  for (std::int64_t i = 0; i < in.numel(); ++i) out.flat(i) = f(in.flat(i));
  return out;
}
template <class F> Tensor<double> zip(const Tensor<double>& a, const Tensor<double>& b, F f) {
  Tensor<double> out(a.shape());
  for (std::int64_t i = 0; i < a.numel(); ++i) out.flat(i) = f(a.flat(i), b.flat(i));
  return out;
}

// The sum of every element, as a rank-0 Var: one custom node.
template <class T> Var<T> total(const Var<T>& x) {
  struct Saved {
    Shape shape;
  };
  return custom_op<Saved>(
      "total",
      [](Saved& s, const Tensor<T>& in) {
        s.shape = in.shape();
        double acc = 0;
        for (std::int64_t i = 0; i < in.numel(); ++i) acc += convert<double>(in.flat(i));
        return full<T>({}, acc);
      },
      [](const Saved& s, const NeedsGrad&, const Tensor<T>& dy) {
        return full<T>(s.shape, convert<double>(dy.item()));
      },
      x);
}
template <VarExpression E> auto total(const E& e) { return total(e.evaluate()); }

// Whether two tensors agree elementwise within atol + rtol·|expected|; prints the worst element when not.
struct Closeness {
  bool ok = true;
  std::string report;
  explicit operator bool() const { return ok; }
  friend std::ostream& operator<<(std::ostream& out, const Closeness& c) { return out << c.report; }
};

template <class A, class B>
Closeness allclose(const Tensor<A>& actual, const Tensor<B>& expected, double rtol = 1e-12, double atol = 1e-12) {
  Closeness c;
  std::ostringstream report;
  report.precision(10);
  if (!(actual.shape() == expected.shape())) {
    c.ok = false;
    report << "shape " << actual.shape() << " vs expected " << expected.shape();
    c.report = report.str();
    return c;
  }
  if (actual.numel() == 0) return c;
  double worst = -1;
  std::int64_t at = 0;
  for (std::int64_t i = 0; i < actual.numel(); ++i) {
    const double a = convert<double>(actual.flat(i)), e = convert<double>(expected.flat(i));
    const double ratio = std::abs(a - e) / (atol + rtol * std::abs(e));
    if (!(ratio <= 1.0)) c.ok = false;
    if (!(ratio <= worst)) {
      worst = std::isnan(ratio) ? INFINITY : ratio;
      at = i;
    }
  }
  report << (c.ok ? "close" : "NOT close") << " over shape " << actual.shape() << "; worst element " << at << ": "
         << convert<double>(actual.flat(at)) << " vs expected " << convert<double>(expected.flat(at))
         << " (rtol " << rtol << ", atol " << atol << ")";
  c.report = report.str();
  return c;
}

}  // namespace tapegrad::test
