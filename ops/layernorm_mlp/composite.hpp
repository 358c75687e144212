// The LayerNorm-MLP block built from primitive ops (norm, matmul, bias adds, slices, activations), each its own tape
// node: the reference that layernorm_mlp is tested and benchmarked against, what its create_graph backward records,
// and a way to see its maths as ordinary code. Same arguments and semantics as layernorm_mlp
// (ops/layernorm_mlp/layernorm_mlp.hpp) with one dtype for x and the parameters, any of the four; `recompute` does not
// apply (the primitive ops save what they save).
#pragma once

#include "tapegrad/ops/layernorm_mlp/layernorm_mlp.hpp"

namespace tapegrad {

template <class T>
LayerNormMLPOutput<T> layernorm_mlp_composite(const Var<T>& x, const Var<T>& gamma, const Var<T>& beta,
                                              const MLPKernels<T>& kernels, const MLPBiases<T>& biases,
                                              const LayerNormMLPOptions& options = {});

}  // namespace tapegrad
