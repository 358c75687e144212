// Second derivatives of the layernorm_mlp node for the precision and device comparisons: the Hessian of a weighted
// sum of y applied to a direction, in any dtype and on any device, returned in double on the cpu.
#pragma once

#include <vector>

#include "mlp_cases.hpp"

namespace tapegrad::mlp_test {

// The Hessian of Σ y·w at (x, p), for the node in T with parameters in P, applied to v (x's direction first, then
// the parameters'), by two backwards: create_graph, then one through Σ ⟨∇, v⟩. w and v are cpu tensors; they are
// rounded to the node's dtypes and moved to x's device.
template <class T, class P>
std::vector<Tensor<double>> node_hvp(const Case& c, const Var<T>& x, const Params<P>& p, const Tensor<double>& w,
                                     const std::vector<Tensor<double>>& v) {
  const Device device = x.device();
  backward(sum(node(x, p, c.options).y * constant(cast<T>(w).to(device))), {.create_graph = true});
  const std::vector<Var<P>> params = defined_params(p);
  Var<double> inner = cast<double>(sum(x.grad_var() * constant(cast<T>(v[0]).to(device))));
  for (std::size_t k = 0; k < params.size(); ++k) {
    inner = inner + cast<double>(sum(params[k].grad_var() * constant(cast<P>(v[k + 1]).to(device))));
  }
  for (Var<P> leaf : params) leaf.zero_grad();
  Var<T>(x).zero_grad();
  backward(inner);
  // An input the gradients do not depend on (b2: its gradient is Σ dy) gets no gradient: zeros.
  const auto hv_of = [](const auto& leaf) {
    return leaf.grad().defined() ? cast<double>(leaf.grad().to(Device::cpu())) : zeros<double>(leaf.shape());
  };
  std::vector<Tensor<double>> hv{hv_of(x)};
  for (const Var<P>& leaf : params) hv.push_back(hv_of(leaf));
  Tape::active().clear();
  return hv;
}

// t's values rounded to U, in double.
template <class U>
Tensor<double> rounded_to(const Tensor<double>& t) {
  return cast<double>(cast<U>(t));
}

}  // namespace tapegrad::mlp_test
