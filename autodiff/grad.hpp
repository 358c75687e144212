// grad: the gradients of outputs with respect to chosen inputs, returned as variables; nothing is added into any
// `.grad` (PyTorch's torch.autograd.grad). With create_graph the backward is recorded, so the gradients can be
// differentiated again: gradient penalties, Hessian-vector products (autodiff/higher_order.hpp), meta-learning.
//
//   std::vector<Var<double>> g = grad({loss}, {w}, {.create_graph = true});
//   backward(sum(g[0] * g[0]));  // the gradient of the squared gradient norm reaches w.grad()
#pragma once

#include <functional>
#include <initializer_list>
#include <optional>
#include <vector>

#include "tapegrad/autodiff/var.hpp"

namespace tapegrad {

template <class T> struct GradOptions {
  // One per output, of its shape; none: ones, for outputs of one element. A seed may itself require grad (with
  // create_graph): the gradients are then differentiable in it too.
  std::vector<Var<T>> seeds{};
  bool create_graph = false;
  std::optional<bool> retain_graph{};  // default: create_graph
  // An input no output depends on gets an undefined Var; without it such an input throws naming it.
  bool allow_unused = false;
};

// The gradient of the outputs (each seeded with its seed, summed) with respect to each input, in the inputs' order:
// constants, or with create_graph recorded variables. Inputs must require grad; the outputs must be recorded on one
// tape. Throws AutodiffError naming what does not fit.
template <class T>
std::vector<Var<T>> grad(const std::vector<Var<T>>& outputs, const std::vector<Var<T>>& inputs,
                         const GradOptions<T>& options = {});
// A function of variables, as the helpers below differentiate.
template <class T> using DifferentiableFunction = std::function<Var<T>(const std::vector<Var<T>>&)>;

// The vector-Jacobian product dyᵀ · ∂composite/∂inputs, recorded: for a custom_op's graph_backward whose kernels have
// no recorded backward, the same gradients from a composite of recorded ops (the op's forward written with them).
// composite(inputs) records on the active tape and is differentiated there, without touching the pass that calls
// it; inputs that do not require grad get an undefined Var.
template <class T>
std::vector<Var<T>> composite_vjp(const DifferentiableFunction<T>& composite, const std::vector<Var<T>>& inputs,
                                  const Var<T>& dy);

// grad({y}, {x, w}, {...}): the lists as braces.
template <class T>
std::vector<Var<T>> grad(std::initializer_list<Var<T>> outputs, std::initializer_list<Var<T>> inputs,
                         const GradOptions<T>& options = {}) {
  return grad(std::vector<Var<T>>(outputs), std::vector<Var<T>>(inputs), options);
}

}  // namespace tapegrad
