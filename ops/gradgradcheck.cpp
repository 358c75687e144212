#include "tapegrad/ops/gradgradcheck.hpp"

#include <cmath>

#include "tapegrad/autodiff/grad.hpp"
#include "tapegrad/ops/layout.hpp"
#include "tapegrad/tensor/factories.hpp"

namespace tapegrad {

GradcheckResult gradgradcheck(const GradcheckFunction& f, const std::vector<Tensor<double>>& inputs,
                              const GradcheckOptions& options) {
  // The seed of f's output: ones for a scalar, else random weights, the same at every evaluation.
  const auto seed_of = [&](const Var<double>& y) {
    return constant(y.numel() == 1 ? ones<double>(y.shape(), y.device())
                                   : randn<double>(y.shape(), options.seed * 7919u + 17u, 0.0, 1.0, y.device()));
  };
  const auto gradient = [&](const std::vector<Var<double>>& x) {
    const Var<double> y = f(x);
    const std::vector<Var<double>> g =
        grad({y}, x, {.seeds = {seed_of(y)}, .create_graph = true, .allow_unused = true});
    std::vector<Var<double>> flat;
    for (std::size_t k = 0; k < g.size(); ++k) {
      flat.push_back(g[k].defined() ? reshape(g[k], {-1}) : constant(zeros<double>({x[k].numel()}, x[k].device())));
    }
    return concat(flat, 0);
  };
  // The recorded gradient must be the backward's own (a graph_backward can disagree with its op's backward in a way
  // that the finite differences of the recorded one alone would not show).
  {
    Tape tape;
    const TapeScope scope(tape);
    std::vector<Var<double>> x;
    for (const Tensor<double>& t : inputs) x.push_back(param(t.clone()));
    const Tensor<double> recorded = gradient(x).value();
    const Var<double> y = f(x);
    const std::vector<Var<double>> g = grad({y}, x, {.seeds = {seed_of(y)}, .allow_unused = true});
    std::int64_t at = 0;
    for (std::size_t k = 0; k < g.size(); ++k) {
      for (std::int64_t e = 0; e < x[k].numel(); ++e, ++at) {
        const double want = g[k].defined() ? g[k].value().flat(e) : 0.0, got = recorded.flat(at);
        if (!(std::abs(got - want) <= options.atol + options.rtol * std::abs(want))) {
          GradcheckResult failed;
          failed.passed = false;
          failed.input = k;
          failed.input_element = e;
          failed.analytic = got;
          failed.numeric = want;
          failed.report = detail::concat("gradgradcheck FAILED: the recorded gradient of input ", k, "[", e, "] is ",
                                         got, " but backward gives ", want, " (a graph_backward that disagrees with "
                                         "its op's backward?)");
          return failed;
        }
      }
    }
  }
  GradcheckResult result = gradcheck(gradient, inputs, options);
  result.report = "grad" + result.report;  // "gradgradcheck passed ..."
  return result;
}

}  // namespace tapegrad
