// layernorm_mlp's stage sequence, written once for both backends and every precision. With M rows, W1 viewed as
// [H, n·F] and z as [M, n·F]:
//
//   forward                                  backward (dy [M, H])
//   h  = norm(x)          [M, H]   stats    db2 = Σ_rows dy
//   z  = h · W1 + b1      [M, nF]           da  = dy · W2ᵀ                    [M, F]
//   a  = act(z)           [M, F]            a, dz = act(z), da · ∂a/∂z        one pass over z; db1 = Σ_rows dz
//   y  = a · W2 + b2 (+x) [M, H]            dW2 = aᵀ · dy,  dW1 = hᵀ · dz
//                                           dh  = dz · W1ᵀ (+ the gradient of the returned h)
//                                           dx, dγ, dβ = norm backward of dh (dx + dy with the residual)
//
// A backend (Steps: the CPU's detail/cpu_steps.hpp, the GPU's detail/gpu_steps.hpp) supplies the operations on its
// own tensors; every product reads operands (values in T, or fp8 codes with their scales), which the recipe's policy
// makes (ops/fp8/detail/operand.hpp): input() is the values themselves without fp8. Tensor parallelism puts the
// collectives of detail/sharding.hpp between the stages. Each stage rounds to T once, as the composite of primitive
// ops does; inside a stage values are in the compute type.
//
// Saved (the backend's Saved, the node's context): what the norm needs again (x, its statistics, γ and β), the
// weights as the products read them, the biases, and by policy h (as dW1 reads it) and z. a is never saved: the
// backward's pass over z makes it beside ∂a/∂z. A recomputed h or z comes from the same operations with the same
// statistics and scales, so every policy gives the same gradients. Memory: each temporary, and each layout of a
// quantized one, is released once its last reader is queued (a GPU's pool reuses it in stream order).
#pragma once

#include <utility>

#include "tapegrad/ops/fp8/roles.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/sharding.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/types.hpp"

namespace tapegrad::detail::mlp {

template <class Steps> Forward<typename Steps::Value> forward(Steps& s) {
  using T = typename Steps::Value;
  const Sharding& sharding = s.sharding();
  const Recompute policy = s.options().recompute;
  const bool keep_h = policy == Recompute::save_all;
  Tensor<T> h_rows = s.norm(Statistics::compute);  // this rank's rows
  auto h = s.input(fp8::Role::input, {sharding.gathered_rows(h_rows)}, {.columns = true, .rows = keep_h}, Pass::first);
  if (!s.options().return_layernorm_output) h_rows = {};  // (a quantized h then holds its codes alone)
  const auto first = s.first_product(h);
  if (keep_h) s.keep_h(h.weight_gradient_layout());
  h = {};
  const auto a = s.activation(first, {.columns = true}, Pass::first);
  // The residual x joins GEMM2's sum where one rank's product holds x's rows: unsharded, or rank 0's under tensor
  // parallelism (as b2); under sequence parallelism each rank adds its own rows to its rows of the sum.
  const bool residual = s.options().residual, sequence = sharding.sequence();
  Tensor<T> y = s.second_product(a, residual && !sequence && sharding.adds_replicated_terms());
  if (policy != Recompute::recompute_all) s.keep_z(first.z);
  y = sharding.summed(y);
  if (residual && sequence) s.add_input(y);
  return {y, h_rows};
}

// dy_rows [rows, H] (this rank's rows under sequence parallelism) and, with return_layernorm_output, dh_out: the
// gradients of y and of the returned h.
template <class Steps>
Gradients<typename Steps::Value, typename Steps::Grad> backward(Steps& s, const Tensor<typename Steps::Value>& dy_rows,
                                                                const Tensor<typename Steps::Value>* dh_out,
                                                                const Needs& need) {
  using T = typename Steps::Value;
  const Sharding& sharding = s.sharding();
  const Tensor<T> dy = sharding.gathered_rows(dy_rows);
  Gradients<T, typename Steps::Grad> g;
  const bool need_dh = need.x || need.gamma || need.beta;
  const bool need_dz = need_dh || need.w1 || need.b1;
  const bool db2_with_norm = need.b2 && need_dh && s.sums_db2_with_norm();
  if (need.b2 && !db2_with_norm) g.db2 = s.column_sums(dy);
  if (!need_dz && !need.w2) return g;

  // h (as dW1 reads it) and z: kept by the forward, or made again.
  auto h = s.kept_h();
  Tensor<T> z = s.kept_z();
  if ((need.w1 && !h.defined()) || !z.defined()) {
    const Tensor<T> h_values = sharding.gathered_rows(s.norm(Statistics::reuse));
    if (need.w1 && !h.defined()) h = s.input(fp8::Role::input, {h_values}, {.rows = true}, Pass::later);
    if (!z.defined()) z = s.first_product(s.input(fp8::Role::input, {h_values}, {.columns = true}, Pass::later)).z;
  }
  const Tensor<T> dy_padded = s.padded(dy);
  auto dyq = s.input(fp8::Role::grad_output, {dy_padded}, {.columns = need_dz, .rows = need.w2}, Pass::first);
  if (!need_dz) {  // dW2 alone
    g.dw2 = s.weight_gradient(s.activation({z, {}}, {.rows = true}, Pass::later), dyq, Weight::w2);
    return g;
  }

  // da = dy · W2ᵀ made and read there (quantized: dy keeps the layout dW2 reads, the one da's product read goes)
  auto activation = s.activation_backward(std::move(z), dyq, {.rows = need.w2}, {.columns = need_dh, .rows = need.w1},
                                         need.b1);
  g.db1 = std::move(activation.db1);
  if (need.w2) {
    const auto a = s.input(fp8::Role::activation, std::move(activation.a), {.rows = true}, Pass::later);
    g.dw2 = s.weight_gradient(a, dyq, Weight::w2);
  }
  activation.a = {};
  dyq = {};
  auto dz = s.input(fp8::Role::grad_hidden, std::move(activation.dz), {.columns = need_dh, .rows = need.w1},
                    Pass::first);
  const auto weight1_gradient = [&] {  // (dz's transpose made here where its codes went over its values)
    if (need.w1) g.dw1 = s.weight_gradient(h, dz.weight_gradient_layout(), Weight::w1);
    h = {};
  };
  if (!need_dh) {
    weight1_gradient();
    return g;
  }
  Tensor<T> dh;
  if (sharding.sharded()) {
    // The ranks' partial dh summed beside dW1's product (a GPU sums on a side stream); the returned h's gradient
    // (this rank's rows) joins the sum.
    dh = s.summed_beside(s.norm_output_gradient(dz), weight1_gradient);
    if (dh_out) s.add_rows(dh, *dh_out);
  } else if (dz.quantized()) {
    // dh's product first: dz's codes along its columns (and W1's, where dh's product makes them again) go before
    // dW1's output is made
    dh = s.norm_output_gradient(dz, dh_out);
    dz = dz.weight_gradient_layout();
    weight1_gradient();
  } else {
    weight1_gradient();
    dh = s.norm_output_gradient(dz, dh_out);
  }
  dz = {};
  // The residual's gradient dy (this rank's rows) joins dx in the norm's backward.
  const Tensor<T> dx_addend = !s.options().residual || !need.x ? Tensor<T>()
                              : sharding.sequence()            ? s.padded(dy_rows)
                                                               : dy_padded;
  auto norm = s.norm_backward(dh, need, db2_with_norm ? &dy_padded : nullptr,
                              dx_addend.defined() ? &dx_addend : nullptr);
  g.dx = std::move(norm.dx);
  if (need.gamma) g.dgamma = sharding.row_sums_over_ranks(norm.dgamma);
  if (need.beta) g.dbeta = sharding.row_sums_over_ranks(norm.dbeta);
  if (db2_with_norm) g.db2 = std::move(norm.db2);
  return g;
}

}  // namespace tapegrad::detail::mlp
