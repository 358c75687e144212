// gradcheck: compares the gradients backward computes with central finite differences, in double precision.
//
//   CHECK(gradcheck([](const std::vector<Var<double>>& in) { return sum(in[0] * exp(in[1])); }, {x, y}));
//
// Full mode builds the whole Jacobian both ways: one backward per output element, two evaluations of f per input
// element. Fast mode (as PyTorch's fast_mode) compares random projections vᵀ(J u), from one central difference
// along u, against (vᵀJ) u, from one backward seeded with v; it costs O(number of inputs) whatever their sizes.
// An entry passes when |analytic - numeric| <= atol + rtol * |numeric|. The result converts to bool and prints a
// report naming the worst entry with both values, so doctest's CHECK shows it on failure.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "tapegrad/autodiff/var.hpp"

namespace tapegrad {

struct GradcheckOptions {
  double eps = 1e-6;   // finite-difference step
  double atol = 1e-5;  // absolute tolerance
  double rtol = 1e-3;  // relative tolerance, against the numeric value
  bool fast_mode = false;
  int projections = 3;     // fast mode: how many random (u, v) pairs
  std::uint64_t seed = 1;  // fast mode: the projections are drawn from this seed
};

struct GradcheckResult {
  bool passed = true;
  std::string report;
  // The worst entry (the largest error relative to its tolerance).
  std::size_t input = 0;           // which input
  std::int64_t input_element = 0;  // flat index in that input (-1 for a projection)
  std::int64_t output_element = 0; // flat index in the output (-1 for a projection)
  double analytic = 0.0;
  double numeric = 0.0;
  explicit operator bool() const { return passed; }
};
std::ostream& operator<<(std::ostream& out, const GradcheckResult& result);

using GradcheckFunction = std::function<Var<double>(const std::vector<Var<double>>&)>;

// Checks the gradient of `f` with respect to every input, at `inputs`. f runs on a private tape.
GradcheckResult gradcheck(const GradcheckFunction& f, const std::vector<Tensor<double>>& inputs,
                          const GradcheckOptions& options = {});

}  // namespace tapegrad
