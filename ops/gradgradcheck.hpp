// gradgradcheck: compares the second derivatives that a create_graph backward records with central finite
// differences of the gradient, in double precision (PyTorch's gradgradcheck).
//
//   CHECK(gradgradcheck([](const std::vector<Var<double>>& in) { return sum(tanh(in[0]) * in[1]); }, {x, y}));
//
// It runs gradcheck (autodiff/gradcheck.hpp: full or fast mode, the same tolerances and report) on the function
// x ↦ Jᵀw, the gradient of f's output seeded with a fixed random w (ones for a scalar output), computed by
// grad(create_graph), the inputs' gradients flattened into one vector. Every op on the way must record its
// backward; one that does not throws naming it.
#pragma once

#include <vector>

#include "tapegrad/autodiff/gradcheck.hpp"

namespace tapegrad {

GradcheckResult gradgradcheck(const GradcheckFunction& f, const std::vector<Tensor<double>>& inputs,
                              const GradcheckOptions& options = {});

}  // namespace tapegrad
