// dot_product_attention as one node: its geometry and checks (ops/detail/attention_geometry.hpp), the kernels (CPU: ops/detail/flash_attention.hpp; GPU: cuda/attention.cu and cuDNN's), and its recorded backward
// (create_graph): on the cpu one node whose backward is the fused second-order pass, on the GPU the VJP of the
// composite of recorded ops; the composite's VJP also differentiates the cpu's node, for a third derivative.
#include "tapegrad/ops/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tapegrad/autodiff/custom_op.hpp"
#include "tapegrad/autodiff/grad.hpp"
#include "tapegrad/cuda/attention.hpp"
#include "tapegrad/cuda/attention_problem.hpp"
#include "tapegrad/cuda/cudnn_attention.hpp"
#include "tapegrad/cuda/settings.hpp"
#include "tapegrad/ops/detail/flash_attention_second.hpp"
#include "tapegrad/ops/detail/attention_geometry.hpp"
#include "tapegrad/ops/detail/unfused.hpp"
#include "tapegrad/ops/layout.hpp"
#include "tapegrad/ops/matmul.hpp"
#include "tapegrad/ops/softmax.hpp"
#include "tapegrad/tensor/factories.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"

namespace tapegrad::nn {

namespace {

using detail::Geometry;
using detail::op_name;
using detail::with_host_lengths;

// The geometry with the options' and the bias's parts (bias: undefined for none).
template <class T> Geometry with_options(Geometry g, const AttentionOptions& options, const Var<T>& bias) {
  detail::apply_options(g, options);
  if (bias.defined()) detail::apply_bias(g, bias.shape());
  return g;
}

// The mask and the weights the composite multiplies the probabilities by, on the host: mask [B, 1, Sq, Sk] is 0
// where a query sees a key and -inf elsewhere (0 on a row that sees none, which the weights zero instead), weights
// [B, Hq or 1, Sq, Sk] are 0 where hidden and dropout's 1/(1 - dropout) or 0 where seen.
template <class T> std::pair<Tensor<T>, Tensor<T>> composite_masks(const attention::Problem& p) {
  const std::int64_t heads = p.dropout > 0 ? p.q_heads : 1;
  Tensor<T> mask({p.batch, 1, p.Sq, p.Sk}), weights({p.batch, heads, p.Sq, p.Sk});
  const double keep_scale = 1.0 / (1.0 - p.dropout);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t i = 0; i < p.Sq; ++i) {
      std::int64_t begin, end;
      p.key_range(b, i, begin, end);
      for (std::int64_t j = 0; j < p.Sk; ++j) {
        const bool seen = j >= begin && j < end;
        mask(b, 0, i, j) = convert<T>(seen || end <= begin ? 0.0 : -std::numeric_limits<double>::infinity());
        for (std::int64_t h = 0; h < heads; ++h) {
          const bool kept = p.dropout == 0 || p.kept(b, h, i, j);
          weights(b, h, i, j) = convert<T>(seen && kept ? (p.dropout > 0 ? keep_scale : 1.0) : 0.0);
        }
      }
    }
  }
  return {mask, weights};
}

// The attention of recorded ops over [B, H, S, D] operands: scores, softmax and the products materialized.
template <class T>
Var<T> composite(const std::vector<Var<T>>& in, const Geometry& g, const std::vector<std::int64_t>& q_lengths,
                 const std::vector<std::int64_t>& kv_lengths) {
  using V = tapegrad::detail::Unfused<T>;
  const attention::Problem p = with_host_lengths(g.problem, q_lengths, kv_lengths);
  const std::int64_t B = p.batch, G = p.q_heads / p.kv_heads;
  const std::vector<int> swap_seq_heads{0, 2, 1, 3};
  Var<T> q, k, v;
  if (g.packed && g.packing == QkvPacking::groups) {
    // [B, S, kv group, its G q heads | k | v, D]
    const Var<T> x = reshape(in[0], {B, p.Sq, p.kv_heads, G + 2, p.D});
    const auto part = [&](std::int64_t first, std::int64_t count) {
      return permute(reshape(slice(x, 3, first, first + count), {B, p.Sq, p.kv_heads * count, p.D}), swap_seq_heads);
    };
    q = part(0, G);
    k = part(G, 1);
    v = part(G + 1, 1);
  } else if (g.packed) {
    const Var<T> x = reshape(in[0], {B, p.Sq, p.q_heads + 2 * p.kv_heads, p.D});
    q = permute(slice(x, 2, 0, p.q_heads), swap_seq_heads);
    k = permute(slice(x, 2, p.q_heads, p.q_heads + p.kv_heads), swap_seq_heads);
    v = permute(slice(x, 2, p.q_heads + p.kv_heads, p.q_heads + 2 * p.kv_heads), swap_seq_heads);
  } else if (g.layout == AttentionLayout::bshd) {
    q = permute(reshape(in[0], {B, p.Sq, p.q_heads, p.D}), swap_seq_heads);
    k = permute(reshape(in[1], {B, p.Sk, p.kv_heads, p.D}), swap_seq_heads);
    v = permute(reshape(in[2], {B, p.Sk, p.kv_heads, p.Dv}), swap_seq_heads);
  } else {
    q = reshape(in[0], {B, p.q_heads, p.Sq, p.D});
    k = reshape(in[1], {B, p.kv_heads, p.Sk, p.D});
    v = reshape(in[2], {B, p.kv_heads, p.Sk, p.Dv});
  }
  // A kv head serves its G q heads by broadcasting over the group axis.
  const Var<T> scores = reshape(matmul(reshape(q, {B, p.kv_heads, G, p.Sq, p.D}),
                                       transpose(reshape(k, {B, p.kv_heads, 1, p.Sk, p.D}))),
                                {B, p.q_heads, p.Sq, p.Sk});
  V logits = V{scores} * p.scale;
  if (p.has_bias) {  // [Bb, Hb, Sq, Sk]: an axis of stride 0 is one the bias broadcasts along
    const std::int64_t Bb = p.bias_batch ? p.batch : 1, Hb = p.bias_head ? p.q_heads : 1;
    logits = logits + V{reshape(in.back(), {Bb, Hb, p.Sq, p.Sk})};
  }
  const auto [mask, weights] = composite_masks<T>(p);
  const Device device = in[0].device();
  logits = logits + V{constant(mask.to(device))};
  const V probabilities = V{softmax(logits.v, -1)} * V{constant(weights.to(device))};
  const Var<T> out = reshape(matmul(reshape(probabilities.v, {B, p.kv_heads, G, p.Sq, p.Sk}),
                                    reshape(v, {B, p.kv_heads, 1, p.Sk, p.Dv})),
                             {B, p.q_heads, p.Sq, p.Dv});
  const bool heads_first = !g.packed && g.layout == AttentionLayout::bhsd;
  return reshape(heads_first ? out : permute(out, swap_seq_heads), g.out_shape.to_vector());
}

// The per-batch lengths copied to a GPU for its kernels; undefined on the cpu (whose kernels read the host vectors)
// and when empty.
Tensor<std::int64_t> lengths_on(const std::vector<std::int64_t>& lengths, Device device) {
  if (lengths.empty() || device.is_cpu()) return {};
  return from_vector<std::int64_t>(lengths, {static_cast<std::int64_t>(lengths.size())}).to(device);
}

// What the backward needs: the inputs (shared with the caller's), O and each row's log-sum-exp.
template <class T> struct AttentionSaved {
  using C = compute_t<T>;
  Geometry geometry;
  std::vector<std::int64_t> q_lengths, kv_lengths;       // on the host: the cpu kernels' and the composite's
  Tensor<std::int64_t> q_lengths_gpu, kv_lengths_gpu;    // copies for the GPU kernels (lengths_on)
  std::vector<Tensor<T>> inputs;                         // q, k, v (or qkv), then the bias
  Tensor<T> o;
  Tensor<C> log_sums;  // [batch, q_heads, Sq]

  attention::Problem problem() const {
    attention::Problem p = with_host_lengths(geometry.problem, q_lengths, kv_lengths);
    if (q_lengths_gpu.defined()) p.q_lengths = q_lengths_gpu.data();
    if (kv_lengths_gpu.defined()) p.kv_lengths = kv_lengths_gpu.data();
    return p;
  }
  std::size_t operands() const { return geometry.packed ? 1 : 3; }
  const T* operand(std::size_t k) const { return inputs[geometry.packed ? 0 : k].data(); }
  const T* bias() const { return geometry.problem.has_bias ? inputs.back().data() : nullptr; }
};

template <class T> Tensor<T> attention_forward(AttentionSaved<T>& s) {
  const Device device = s.inputs[0].device();
  by_device(
      op_name, device,
      [&] {
        detail::attention_forward(s.problem(), s.operand(0), s.operand(1), s.operand(2), s.bias(), s.o.data(),
                                  s.log_sums.data());
      },
      [&](auto gpu) {
        cuda::attention_forward(dtype_v<T>, s.problem(), s.operand(0), s.operand(1), s.operand(2), s.bias(),
                                s.o.data(), s.log_sums.data(), gpu.index);
      });
  return s.o;
}

// One gradient per input; the bias's only when it is needed. The GPU sums the bias's gradient in the compute type.
template <class T> std::vector<Tensor<T>> attention_backward(const AttentionSaved<T>& s, const NeedsGrad& needs,
                                                             const Tensor<T>& dy) {
  using C = compute_t<T>;
  const Device device = dy.device();
  std::vector<Tensor<T>> grads;
  for (std::size_t k = 0; k < s.operands(); ++k) grads.emplace_back(s.inputs[k].shape(), device);
  const bool wants_dbias = s.bias() && needs[s.operands()];
  const auto grad_data = [&](std::size_t k) { return grads[s.geometry.packed ? 0 : k].data(); };
  by_device(
      op_name, device,
      [&] {
        Tensor<T> dbias = wants_dbias ? Tensor<T>(s.inputs.back().shape()) : Tensor<T>();
        detail::attention_backward(s.problem(), s.operand(0), s.operand(1), s.operand(2), s.bias(), s.o.data(),
                                   s.log_sums.data(), dy.data(), grad_data(0), grad_data(1), grad_data(2),
                                   wants_dbias ? dbias.data() : nullptr);
        if (s.bias()) grads.push_back(dbias);
      },
      [&](auto gpu) {
        Tensor<C> delta(s.log_sums.shape(), device);
        Tensor<C> dbias = wants_dbias ? zeros<C>(s.inputs.back().shape(), device) : Tensor<C>();
        cuda::attention_backward(dtype_v<T>, s.problem(), s.operand(0), s.operand(1), s.operand(2), s.bias(),
                                 s.o.data(), s.log_sums.data(), dy.data(), delta.data(), grad_data(0), grad_data(1),
                                 grad_data(2), wants_dbias ? dbias.data() : nullptr, gpu.index);
        if (s.bias()) grads.push_back(wants_dbias ? cast<T>(dbias) : Tensor<T>());
      });
  return grads;
}

AttentionKernels kernels_of(DType dtype, Device device, const Geometry& g, const AttentionOptions& options) {
  return by_device(
      op_name, device, [] { return AttentionKernels{"cpu", "cpu"}; },
      [&](auto gpu) {
        // Only whether lengths are set matters here.
        const attention::Problem p = with_host_lengths(g.problem, options.q_lengths, options.kv_lengths);
        const auto choice = [&](bool backward) -> std::string {
          if (cuda::attention_kernels() == cuda::AttentionKernels::tapegrad) {
            return "tapegrad: chosen by set_attention_kernels";
          }
          const std::string refusal = cuda::cudnn_attention_refusal(dtype, p, backward, gpu.index);
          return refusal.empty() ? "cudnn" : "tapegrad: " + refusal;
        };
        return AttentionKernels{choice(false), choice(true)};
      });
}

// Where the recorded backward node lays each input's gradient in its one output row: the inputs' in order.
template <class T> std::vector<std::int64_t> gradient_offsets(const std::vector<Tensor<T>>& inputs) {
  std::vector<std::int64_t> offsets{0};
  for (const Tensor<T>& x : inputs) offsets.push_back(offsets.back() + x.numel());
  return offsets;
}

// The composite's gradients (recorded ops) laid end to end as the recorded backward node lays them: what that node's
// own recorded backward differentiates, so that a third derivative exists (it materializes the S × S scores).
template <class T>
Var<T> composite_gradients(const std::vector<Var<T>>& x, const Geometry& g, const std::vector<std::int64_t>& q_lengths,
                           const std::vector<std::int64_t>& kv_lengths) {
  const std::vector<Var<T>> in(x.begin(), x.end() - 1);
  const std::vector<Var<T>> grads = composite_vjp<T>(
      [&](const std::vector<Var<T>>& y) { return composite(y, g, q_lengths, kv_lengths); }, in, x.back());
  std::vector<Var<T>> rows;
  for (std::size_t k = 0; k < in.size(); ++k) {
    const Var<T> gk = grads[k].defined() ? grads[k] : constant(zeros<T>(in[k].shape(), in[k].device()));
    rows.push_back(reshape(gk, {in[k].numel()}));
  }
  return concat(rows, 0);
}

template <class T> struct RecordedBackwardSaved {
  AttentionSaved<T> forward;
  Tensor<T> dy;
};

// The recorded backward node's backward: the gradients of <g, the backward's gradients> in every input and dy, by
// the fused second-order pass (ops/detail/flash_attention_second.hpp). g's parts lie at `offsets`.
template <class T>
std::vector<Tensor<T>> attention_second_order(const RecordedBackwardSaved<T>& r, const std::vector<std::int64_t>& offsets,
                                              const Tensor<T>& g) {
  const AttentionSaved<T>& s = r.forward;
  std::vector<Tensor<T>> grads;
  for (const Tensor<T>& x : s.inputs) grads.emplace_back(x.shape());
  Tensor<T> ddy(r.dy.shape());
  const auto part = [&](std::size_t k) { return g.data() + offsets[s.geometry.packed ? 0 : k]; };
  const auto grad = [&](std::size_t k) { return grads[s.geometry.packed ? 0 : k].data(); };
  const T* gbias = s.bias() ? g.data() + offsets[s.operands()] : nullptr;
  detail::attention_second_order(s.problem(), s.operand(0), s.operand(1), s.operand(2), s.bias(), s.o.data(),
                                 s.log_sums.data(), r.dy.data(), {part(0), part(1), part(2), gbias}, grad(0), grad(1),
                                 grad(2), s.bias() ? grads.back().data() : nullptr, ddy.data());
  grads.push_back(ddy);
  return grads;
}

// The cpu's create_graph backward: one node from (inputs..., dy) to every input's gradient, laid end to end in one
// row and sliced into the inputs' shapes, whose backward is the fused second-order pass (memory linear in S).
template <class T>
std::vector<Var<T>> recorded_backward(const AttentionSaved<T>& s, const std::vector<Var<T>>& in, const Var<T>& dy) {
  std::vector<Var<T>> x = in;
  x.push_back(dy);
  const std::vector<std::int64_t> offsets = gradient_offsets(s.inputs);
  const Var<T> row = custom_op<RecordedBackwardSaved<T>>(
      "dot_product_attention_backward",
      [&](RecordedBackwardSaved<T>& r, const std::vector<Tensor<T>>& values) {
        r = {s, values.back()};
        const std::vector<Tensor<T>> grads =
            attention_backward(s, NeedsGrad(std::vector<bool>(s.inputs.size(), true)), values.back());
        Tensor<T> out({offsets.back()});
        for (std::size_t k = 0; k < grads.size(); ++k) {
          std::copy(grads[k].data(), grads[k].data() + grads[k].numel(), out.data() + offsets[k]);
        }
        return out;
      },
      [offsets](const RecordedBackwardSaved<T>& r, const NeedsGrad&, const Tensor<T>& g) {
        return attention_second_order(r, offsets, g);
      },
      graph_backward([](const RecordedBackwardSaved<T>& r, const NeedsGrad&, const std::vector<Var<T>>& xs,
                        const Var<T>& g) {
        const AttentionSaved<T>& f = r.forward;
        return composite_vjp<T>(
            [&](const std::vector<Var<T>>& y) { return composite_gradients(y, f.geometry, f.q_lengths, f.kv_lengths); },
            xs, g);
      }),
      x);
  std::vector<Var<T>> grads;
  for (std::size_t k = 0; k < in.size(); ++k) {
    grads.push_back(reshape(slice(row, 0, offsets[k], offsets[k + 1]), in[k].shape().to_vector()));
  }
  return grads;
}

template <class T>
Var<T> record(std::vector<Var<T>> inputs, Geometry geometry, const AttentionOptions& options) {
  const Geometry g = with_options(std::move(geometry), options, inputs.back());
  if (!inputs.back().defined()) inputs.pop_back();
  return custom_op<AttentionSaved<T>>(
      op_name,
      [&](AttentionSaved<T>& s, const std::vector<Tensor<T>>& in) {
        const Device device = in[0].device();
        s = {g,
             options.q_lengths,
             options.kv_lengths,
             lengths_on(options.q_lengths, device),
             lengths_on(options.kv_lengths, device),
             in,
             Tensor<T>(g.out_shape, device),
             Tensor<compute_t<T>>({g.problem.batch, g.problem.q_heads, g.problem.Sq}, device)};
        return attention_forward(s);
      },
      [](const AttentionSaved<T>& s, const NeedsGrad& needs, const Tensor<T>& dy) {
        return attention_backward(s, needs, dy);
      },
      graph_backward([](const AttentionSaved<T>& s, const NeedsGrad&, const std::vector<Var<T>>& in,
                        const Var<T>& dy) {
        if (dy.device().is_cpu()) return recorded_backward(s, in, dy);
        return composite_vjp<T>(
            [&](const std::vector<Var<T>>& x) { return composite(x, s.geometry, s.q_lengths, s.kv_lengths); }, in,
            dy);
      }),
      inputs);
}

}  // namespace

template <class U>
Var<U> dot_product_attention(const Var<U>& q, const Var<U>& k, const Var<U>& v, const AttentionOptions& options,
                             const Var<U>& bias) {
  const OpScope scope = enter_op(op_name, q, k, v);
  return record<U>({q, k, v, bias}, detail::separate_geometry(q.shape(), k.shape(), v.shape(), options.layout), options);
}

template <class U>
Var<U> dot_product_attention_qkv(const Var<U>& qkv, std::int64_t q_heads, std::int64_t kv_heads,
                                 const AttentionOptions& options, const Var<U>& bias) {
  const OpScope scope = enter_op(op_name, qkv);
  return record<U>({qkv, bias}, detail::packed_geometry(qkv.shape(), q_heads, kv_heads, options.packing), options);
}

template <class U>
AttentionKernels dot_product_attention_kernels(const Var<U>& q, const Var<U>& k, const Var<U>& v,
                                               const AttentionOptions& options, const Var<U>& bias) {
  const OpScope scope = enter_op(op_name, q, k, v);
  return kernels_of(dtype_v<U>, q.device(),
                    with_options(detail::separate_geometry(q.shape(), k.shape(), v.shape(), options.layout), options, bias),
                    options);
}

template <class U>
AttentionKernels dot_product_attention_qkv_kernels(const Var<U>& qkv, std::int64_t q_heads, std::int64_t kv_heads,
                                                   const AttentionOptions& options, const Var<U>& bias) {
  const OpScope scope = enter_op(op_name, qkv);
  return kernels_of(dtype_v<U>, qkv.device(),
                    with_options(detail::packed_geometry(qkv.shape(), q_heads, kv_heads, options.packing), options, bias),
                    options);
}

#define TAPEGRAD_INSTANTIATE_DOT_PRODUCT_ATTENTION(U)                                                          \
  template Var<U> dot_product_attention<U>(const Var<U>&, const Var<U>&, const Var<U>&, const AttentionOptions&, \
                                           const Var<U>&);                                                     \
  template Var<U> dot_product_attention_qkv<U>(const Var<U>&, std::int64_t, std::int64_t,                      \
                                               const AttentionOptions&, const Var<U>&);                   \
  template AttentionKernels dot_product_attention_kernels<U>(const Var<U>&, const Var<U>&, const Var<U>&,      \
                                                             const AttentionOptions&, const Var<U>&);           \
  template AttentionKernels dot_product_attention_qkv_kernels<U>(const Var<U>&, std::int64_t, std::int64_t,    \
                                                                 const AttentionOptions&, const Var<U>&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_DOT_PRODUCT_ATTENTION)

}  // namespace tapegrad::nn
