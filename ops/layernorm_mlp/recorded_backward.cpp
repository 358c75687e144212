#include "tapegrad/ops/layernorm_mlp/detail/recorded_backward.hpp"

#include <algorithm>
#include <vector>

#include "tapegrad/autodiff/grad.hpp"
#include "tapegrad/ops/cast.hpp"
#include "tapegrad/ops/detail/matmul_vjp.hpp"
#include "tapegrad/ops/detail/unfused.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/composite_stages.hpp"
#include "tapegrad/ops/layout.hpp"
#include "tapegrad/ops/matmul.hpp"
#include "tapegrad/ops/reduce.hpp"

namespace tapegrad::detail::mlp {

namespace {

void check_differentiable_twice(const LayerNormMLPOptions& options) {
  const char* refused = options.fp8               ? "fp8 quantization (its products have no second derivative)"
                        : options.tensor_parallel ? "tensor parallelism"
                                                  : nullptr;
  if (refused) {
    throw AutodiffError(concat("layernorm_mlp: a create_graph backward (a derivative of the gradients) is not "
                               "available with ",
                               refused, "; run the node without it where gradients are differentiated again"));
  }
}

// The composite's gradients stage by stage, each stage's vector-Jacobian product recorded: the forward stages up to
// the activation (h, z, a) rerun as recorded ops; the output product's gradients from dy alone (it is never
// recomputed); the activation's and the norm's through composite_vjp (the activation's value is the one it records).
template <class T>
std::vector<Var<T>> composite_gradients(const LayerNormMLPOptions& options, const std::vector<Var<T>>& in,
                                        const Var<T>& dy, const Var<T>& dh) {
  const Var<T>&x = in[0], &gamma = in[1], &beta = in[2], &w1 = in[3], &b1 = in[4], &w2 = in[5], &b2 = in[6];
  const std::int64_t H = w1.shape().dim(0), n = w1.shape().dim(1), F = w1.shape().dim(2);
  const std::vector<Var<T>> norm_in = beta.defined() ? std::vector{x, gamma, beta} : std::vector{x, gamma};
  const auto norm = [&](const std::vector<Var<T>>& v) {
    return composite_norm(v[0], v[1], v.size() > 2 ? v[2] : Var<T>(), options);
  };
  std::vector<Var<T>> g(in.size());
  const auto norm_gradients = [&](const Var<T>& seed) {
    const std::vector<Var<T>> dnorm = composite_vjp<T>(norm, norm_in, seed);
    std::copy(dnorm.begin(), dnorm.end(), g.begin());
  };
  const Var<T> h = norm(norm_in);
  const Var<T> w1_matrix = reshape(w1, {H, n * F});
  Var<T> z = matmul(h, w1_matrix);
  if (b1.defined()) z = (Unfused<T>{z} + Unfused<T>{reshape(b1, {n * F})}).v;
  const auto activation = [&](const std::vector<Var<T>>& v) { return composite_activation(v[0], F, options); };
  Var<T> a, dz;
  if (z.requires_grad()) {
    std::vector<std::int64_t> a_shape = dy.shape().to_vector();
    a_shape.back() = F;
    const Var<T> da = matmul_grad_a(Shape(a_shape), w2, dy);
    dz = composite_vjp<T>([&](const std::vector<Var<T>>& v) { return a = activation(v); }, {z}, da)[0];
  } else {
    a = activation({z});
  }
  if (w2.requires_grad()) g[5] = matmul_grad_b(a, w2.shape(), dy);
  if (b2.defined() && b2.requires_grad()) g[6] = sum_to(dy, b2.shape());
  if (dz.defined()) {
    if (w1.requires_grad()) g[3] = reshape(matmul_grad_b(h, w1_matrix.shape(), dz), w1.shape().to_vector());
    if (b1.defined() && b1.requires_grad()) g[4] = reshape(sum_to(dz, Shape{n * F}), b1.shape().to_vector());
    if (h.requires_grad()) {
      const Var<T> dh_product = matmul_grad_a(h.shape(), w1_matrix, dz);
      norm_gradients(dh.defined() ? (Unfused<T>{dh_product} + Unfused<T>{dh}).v : dh_product);
    }
  } else if (dh.defined() && h.requires_grad()) {
    norm_gradients(dh);
  }
  if (options.residual && x.requires_grad()) g[0] = g[0].defined() ? (Unfused<T>{g[0]} + Unfused<T>{dy}).v : dy;
  return g;
}

}  // namespace

template <class T, class P>
NodeVars<T, P> recorded_backward(const LayerNormMLPOptions& options, Present present, const NodeVars<T, P>& inputs,
                                 const Var<T>& dy, const Var<T>& dh) {
  check_differentiable_twice(options);
  const auto& [x, gamma, beta, w1, b1, w2, b2] = inputs;
  // In the node's compute dtype T, as its forward computes (so bf16 products run on the tensor cores).
  const auto in_t = [](const auto& v, bool present) { return present ? cast<T>(v) : Var<T>(); };
  const std::vector<Var<T>> all{in_t(x, true),  in_t(gamma, true), in_t(beta, present.beta), in_t(w1, true),
                                in_t(b1, present.b1), in_t(w2, true), in_t(b2, present.b2)};
  const std::vector<Var<T>> g = composite_gradients(options, all, dy, dh);
  const auto back = [&]<class U>(std::size_t k, const Var<U>&) {
    return g[k].defined() ? cast<U>(g[k]) : Var<U>();
  };
  return {back(0, x), back(1, gamma), back(2, beta), back(3, w1), back(4, b1), back(5, w2), back(6, b2)};
}

#define TAPEGRAD_INSTANTIATE_RECORDED_BACKWARD_PARAMS(T, P)                                                     \
  template NodeVars<T, P> recorded_backward<T, P>(const LayerNormMLPOptions&, Present, const NodeVars<T, P>&, \
                                                  const Var<T>&, const Var<T>&);
#define TAPEGRAD_INSTANTIATE_RECORDED_BACKWARD(T)                         \
  TAPEGRAD_INSTANTIATE_RECORDED_BACKWARD_PARAMS(T, float)                 \
  TAPEGRAD_INSTANTIATE_RECORDED_BACKWARD_PARAMS(T, double)                \
  TAPEGRAD_INSTANTIATE_RECORDED_BACKWARD_PARAMS(T, ::tapegrad::bf16)      \
  TAPEGRAD_INSTANTIATE_RECORDED_BACKWARD_PARAMS(T, ::tapegrad::f16)
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_RECORDED_BACKWARD)

}  // namespace tapegrad::detail::mlp
