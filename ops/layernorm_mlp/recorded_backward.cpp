#include "tapegrad/ops/layernorm_mlp/detail/recorded_backward.hpp"

#include <vector>

#include "tapegrad/autodiff/grad.hpp"
#include "tapegrad/ops/cast.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/layernorm_mlp/composite.hpp"
#include "tapegrad/ops/reduce.hpp"
#include "tapegrad/tensor/factories.hpp"

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

}  // namespace

template <class T, class P>
NodeVars<T, P> recorded_backward(const LayerNormMLPOptions& options, Present present, const NodeVars<T, P>& inputs,
                                 const Var<T>& dy, const Var<T>& dh) {
  check_differentiable_twice(options);
  const auto& [x, gamma, beta, w1, b1, w2, b2] = inputs;
  // In the node's compute dtype T, as its forward computes (so bf16 products run on the tensor cores).
  const auto in_t = [](const auto& v, bool present) { return present ? cast<T>(v) : Var<T>(); };
  // The composite's inputs: defined ones only (composite_vjp differentiates each), absent ones stay undefined.
  const std::vector<Var<T>> all{in_t(x, true),  in_t(gamma, true), in_t(beta, present.beta), in_t(w1, true),
                                in_t(b1, present.b1), in_t(w2, true), in_t(b2, present.b2)};
  std::vector<Var<T>> defined;
  for (const Var<T>& v : all) {
    if (v.defined()) defined.push_back(v);
  }
  const DifferentiableFunction<T> surrogate = [&](const std::vector<Var<T>>& in) {
    std::size_t next = 0;
    const auto take = [&](const Var<T>& v) { return v.defined() ? in[next++] : Var<T>(); };
    const Var<T> xc = take(all[0]), gc = take(all[1]), bc = take(all[2]), w1c = take(all[3]), b1c = take(all[4]),
                 w2c = take(all[5]), b2c = take(all[6]);
    LayerNormMLPOptions composite_options = options;
    composite_options.return_layernorm_output = dh.defined();
    const LayerNormMLPOutput<T> out = layernorm_mlp_composite(xc, gc, bc, {w1c, w2c}, {b1c, b2c}, composite_options);
    Var<T> s = sum(out.y * dy);
    if (dh.defined()) s = s + sum(out.layernorm_output * dh);
    return s;
  };
  const std::vector<Var<T>> g = composite_vjp(surrogate, defined, constant(ones<T>(Shape{}, dy.device())));
  std::size_t next = 0;
  const auto back = [&]<class U>(const Var<T>& v, const Var<U>&) {
    if (!v.defined()) return Var<U>();
    const Var<T>& gv = g[next++];
    return gv.defined() ? cast<U>(gv) : Var<U>();
  };
  return {back(all[0], x), back(all[1], gamma), back(all[2], beta), back(all[3], w1),
          back(all[4], b1), back(all[5], w2),   back(all[6], b2)};
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
