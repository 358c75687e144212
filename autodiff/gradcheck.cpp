#include "tapegrad/autodiff/gradcheck.hpp"

#include <cmath>
#include <ostream>
#include <sstream>

#include "tapegrad/tensor/factories.hpp"

namespace tapegrad {

namespace {

struct Checker {
  const GradcheckFunction& f;
  std::vector<Tensor<double>> x;  // private copies, perturbed in place by the numeric pass
  const GradcheckOptions& options;
  GradcheckResult result;
  double worst_ratio = -1.0;
  std::int64_t entries = 0;
  double max_diff = 0.0;

  // Records f on `tape` with every input a parameter (in the numeric pass too: an f that differentiates its inputs
  // inside, a gradient penalty or gradgradcheck's, runs alike in both passes).
  std::pair<std::vector<Var<double>>, Var<double>> record(Tape& tape) {
    TapeScope scope(tape);
    std::vector<Var<double>> in;
    for (auto& t : x) in.push_back(param(t));
    Var<double> y = f(in);
    return {in, y};
  }

  // f at the current x, recorded on a scratch tape.
  Var<double> evaluate() {
    Tape scratch;
    return record(scratch).second;
  }

  void compare(std::size_t input, std::int64_t in_el, std::int64_t out_el, double analytic, double numeric) {
    ++entries;
    const double diff = std::abs(analytic - numeric);
    max_diff = std::max(max_diff, diff);
    // An exact match passes even with atol = 0 where numeric is 0 (0/0 would read as NaN, a failure).
    const double ratio = diff == 0.0 ? 0.0 : diff / (options.atol + options.rtol * std::abs(numeric));
    if (!(ratio <= 1.0)) result.passed = false;  // NaN fails too
    if (ratio > worst_ratio || std::isnan(ratio)) {
      worst_ratio = std::isnan(ratio) ? INFINITY : ratio;
      result.input = input;
      result.input_element = in_el;
      result.output_element = out_el;
      result.analytic = analytic;
      result.numeric = numeric;
    }
  }

  // d f / d x[k][e] for every output element, by central differences.
  Tensor<double> numeric_column(std::size_t k, std::int64_t e) {
    double& xe = x[k].flat(e);
    const double saved = xe;
    xe = saved + options.eps;
    const Tensor<double> plus = evaluate().value().clone();
    xe = saved - options.eps;
    const Tensor<double> minus = evaluate().value().clone();  // f may return a view of x
    xe = saved;
    Tensor<double> column(plus.shape());
    for (std::int64_t j = 0; j < plus.numel(); ++j) column.flat(j) = (plus.flat(j) - minus.flat(j)) / (2 * options.eps);
    return column;
  }

  void full() {
    Tape tape;
    auto [in, y] = record(tape);
    check(y.requires_grad(), "gradcheck", "the output of shape ", y.shape(), " does not depend on any input");
    const std::int64_t m = y.numel();
    // analytic[k] is the [m, numel(x_k)] Jacobian block, row j from a backward seeded with e_j.
    std::vector<std::vector<double>> analytic(x.size());
    for (std::size_t k = 0; k < x.size(); ++k) analytic[k].resize(static_cast<std::size_t>(m * x[k].numel()));
    for (std::int64_t j = 0; j < m; ++j) {
      for (auto& v : in) v.zero_grad();
      Tensor<double> seed = zeros<double>(y.shape());
      seed.flat(j) = 1.0;
      backward(y, seed, {.retain_graph = true});
      for (std::size_t k = 0; k < x.size(); ++k) {
        const Tensor<double>& g = in[k].grad();
        for (std::int64_t e = 0; e < x[k].numel(); ++e) {
          analytic[k][static_cast<std::size_t>(j * x[k].numel() + e)] = g.defined() ? g.flat(e) : 0.0;
        }
      }
    }
    for (std::size_t k = 0; k < x.size(); ++k) {
      for (std::int64_t e = 0; e < x[k].numel(); ++e) {
        const Tensor<double> column = numeric_column(k, e);
        for (std::int64_t j = 0; j < m; ++j) {
          compare(k, e, j, analytic[k][static_cast<std::size_t>(j * x[k].numel() + e)], column.flat(j));
        }
      }
    }
  }

  void fast() {
    Tape tape;
    auto [in, y] = record(tape);
    check(y.requires_grad(), "gradcheck", "the output of shape ", y.shape(), " does not depend on any input");
    for (int p = 0; p < options.projections; ++p) {
      const std::uint64_t seed = options.seed * 1000003u + static_cast<std::uint64_t>(p) * 7919u;
      const Tensor<double> v = randn<double>(y.shape(), seed);
      std::vector<Tensor<double>> u;
      for (std::size_t k = 0; k < x.size(); ++k) u.push_back(randn<double>(x[k].shape(), seed + 1 + k));
      // (vᵀJ) u from one backward.
      for (auto& var : in) var.zero_grad();
      backward(y, v, {.retain_graph = true});
      double analytic = 0.0;
      for (std::size_t k = 0; k < x.size(); ++k) {
        const Tensor<double>& g = in[k].grad();
        if (!g.defined()) continue;
        for (std::int64_t e = 0; e < g.numel(); ++e) analytic += g.flat(e) * u[k].flat(e);
      }
      // vᵀ(J u) from one central difference along u.
      const std::vector<Tensor<double>> base = [&] {
        std::vector<Tensor<double>> copy;
        for (auto& t : x) copy.push_back(t.clone());
        return copy;
      }();
      auto shift = [&](double step) {
        for (std::size_t k = 0; k < x.size(); ++k) {
          for (std::int64_t e = 0; e < x[k].numel(); ++e) x[k].flat(e) = base[k].flat(e) + step * u[k].flat(e);
        }
        return evaluate().value().clone();
      };
      const Tensor<double> plus = shift(options.eps), minus = shift(-options.eps);
      shift(0.0);
      double numeric = 0.0;
      for (std::int64_t j = 0; j < v.numel(); ++j) numeric += v.flat(j) * (plus.flat(j) - minus.flat(j)) / (2 * options.eps);
      compare(static_cast<std::size_t>(p), -1, -1, analytic, numeric);
    }
  }
};

}  // namespace

GradcheckResult gradcheck(const GradcheckFunction& f, const std::vector<Tensor<double>>& inputs,
                          const GradcheckOptions& options) {
  check(!inputs.empty(), "gradcheck", "no inputs given");
  check(options.eps > 0, "gradcheck", "eps must be positive, got ", options.eps);
  check(std::isfinite(options.eps), "gradcheck", "eps must be finite, got ", options.eps);
  // A NaN tolerance makes every comparison false, which would pass everything.
  check(options.atol >= 0 && options.rtol >= 0, "gradcheck", "atol and rtol must be non-negative numbers, got ",
        options.atol, " and ", options.rtol);
  for (std::size_t i = 0; i < inputs.size(); ++i) check_defined(inputs[i], "gradcheck", detail::concat("input ", i));
  Checker c{f, {}, options, {}};
  for (const auto& t : inputs) c.x.push_back(t.clone());
  if (options.fast_mode) {
    c.fast();
  } else {
    c.full();
  }
  std::ostringstream report;
  report.precision(10);
  auto where = [&] {
    std::ostringstream w;
    if (options.fast_mode) {
      w << "projection " << c.result.input << " (vᵀJu)";
    } else {
      w << "d output[" << c.result.output_element << "] / d input " << c.result.input << "["
        << c.result.input_element << "] (input shape " << inputs[c.result.input].shape().str() << ")";
    }
    return w.str();
  };
  report << "gradcheck " << (c.result.passed ? "passed" : "FAILED") << " over " << c.entries
         << (options.fast_mode ? " projections" : " Jacobian entries") << "; worst " << where() << ": analytic "
         << c.result.analytic << " vs numeric " << c.result.numeric << " (|diff| "
         << std::abs(c.result.analytic - c.result.numeric) << ", allowed " << options.atol << " + " << options.rtol
         << "·|numeric|)";
  c.result.report = report.str();
  return c.result;
}

std::ostream& operator<<(std::ostream& out, const GradcheckResult& result) { return out << result.report; }

}  // namespace tapegrad
