// layernorm_mlp's backward as recorded ops, for create_graph (autodiff/grad.hpp): the vector-Jacobian product of
// layernorm_mlp_composite, so that the node's gradients can be differentiated again. The fused backward still runs
// every backward without create_graph. Internal to ops/layernorm_mlp/.
#pragma once

#include <tuple>

#include "tapegrad/ops/layernorm_mlp/layernorm_mlp.hpp"

namespace tapegrad::detail::mlp {

// The node's inputs in its order: x, gamma, beta, w1, b1, w2, b2 (an absent one as the node's empty placeholder).
template <class T, class P> using NodeVars = std::tuple<Var<T>, Var<P>, Var<P>, Var<P>, Var<P>, Var<P>, Var<P>>;

// Which of the optional inputs the call had.
struct Present {
  bool beta, b1, b2;
};

// The gradients of Σ y·dy (+ Σ h·dh where dh is defined) with respect to each input, recorded. The composite runs in
// T, the node's compute dtype (parameters in another dtype cast to T, their gradients cast back), as PyTorch's double
// backward runs an unfused block: so its bf16 products run on the tensor cores.
// Throws AutodiffError for fp8 and tensor-parallel calls, which have no composite.
template <class T, class P>
NodeVars<T, P> recorded_backward(const LayerNormMLPOptions& options, Present present, const NodeVars<T, P>& inputs,
                                 const Var<T>& dy, const Var<T>& dh);

}  // namespace tapegrad::detail::mlp
