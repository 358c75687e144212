// Two stages of layernorm_mlp_composite (ops/layernorm_mlp/composite.cpp), for the node's create_graph backward
// (recorded_backward.cpp), which records the stages' gradients without the composite's output product.
#pragma once

#include <cstdint>

#include "tapegrad/ops/layernorm_mlp/layernorm_mlp.hpp"

namespace tapegrad::detail::mlp {

// The norm of x as `options` asks (rmsnorm; layernorm with or without beta), one recorded node.
template <class T>
Var<T> composite_norm(const Var<T>& x, const Var<T>& gamma, const Var<T>& beta, const LayerNormMLPOptions& options);

// The activation of z [..., n·F]: fn(z₀), times gate(z₁) for gated ones (z₀ = z[..., :F], z₁ = z[..., F:]), each
// op a recorded node of its own.
template <class T> Var<T> composite_activation(const Var<T>& z, std::int64_t F, const LayerNormMLPOptions& options);

}  // namespace tapegrad::detail::mlp
