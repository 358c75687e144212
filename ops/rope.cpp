// rope: one node whose forward and backward are the same rotation, by +angle and -angle (cuda/rope.hpp holds the rule
// both devices compute by). Nothing is saved but the problem: a rotation is linear, its transpose its inverse.
#include "tapegrad/ops/rope.hpp"

#include <cmath>
#include <vector>

#include "tapegrad/autodiff/custom_op.hpp"
#include "tapegrad/cuda/rope.hpp"
#include "tapegrad/ops/detail/head_layout.hpp"
#include "tapegrad/tensor/eigen.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"

namespace tapegrad::nn {

namespace {

// out = x turned by p, on the cpu: the rotations of each position computed once (in double, as the GPU computes them).
template <class T> void rotate_on_cpu(const cuda::RopeProblem& p, const Tensor<T>& x, Tensor<T>& out) {
  using C = compute_t<T>;
  const std::int64_t half = p.rotary_dim / 2, slots = (p.D + 1) / 2;
  std::vector<C> cosines(static_cast<std::size_t>(p.S * half)), sines(cosines.size());
  for (std::int64_t s = 0; s < p.S; ++s) {
    for (std::int64_t i = 0; i < half; ++i) {
      double c, sn;
      p.rotation(s, i, c, sn);
      cosines[s * half + i] = static_cast<C>(c);
      sines[s * half + i] = static_cast<C>(sn);
    }
  }
  parallel_for(p.batch * p.heads * p.S, 4 * p.D, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t row = first; row < last; ++row) {
      const std::int64_t s = row % p.S, h = (row / p.S) % p.heads, b = row / (p.S * p.heads);
      const T* in = x.data() + p.row_at(b, h, s);
      T* to = out.data() + p.row_at(b, h, s);
      for (std::int64_t j = 0; j < slots; ++j) {
        std::int64_t a, c;
        if (p.slot(h, j, a, c)) {
          C turned_a, turned_c;
          cuda::rotate_pair(static_cast<C>(in[a]), static_cast<C>(in[c]), cosines[s * half + j], sines[s * half + j],
                            turned_a, turned_c);
          to[a] = convert<T>(turned_a);
          to[c] = convert<T>(turned_c);
        } else {
          to[a] = in[a];
          if (c < p.D) to[c] = in[c];
        }
      }
    }
  });
}

template <class T> Tensor<T> rotated(const cuda::RopeProblem& p, const Tensor<T>& x) {
  Tensor<T> out(x.shape(), x.device());
  by_device(
      "rope", x.device(), [&] { rotate_on_cpu(p, x, out); },
      [&](auto gpu) { cuda::rope(dtype_v<T>, p, x.data(), out.data(), gpu.index); });
  return out;
}

// x turned by p, recorded: the backward turns dy by -p (recorded the same way under create_graph).
template <class T> Var<T> rotate(const Var<T>& x, const cuda::RopeProblem& p) {
  cuda::RopeProblem back = p;
  back.inverse = !p.inverse;
  return custom_op<cuda::RopeProblem>(
      "rope",
      [&](cuda::RopeProblem& saved, const Tensor<T>& xv) {
        saved = back;
        return rotated(p, xv);
      },
      [](const cuda::RopeProblem& back, const NeedsGrad&, const Tensor<T>& dy) { return rotated(back, dy); },
      graph_backward([](const cuda::RopeProblem& back, const NeedsGrad&, const std::tuple<Var<T>>&,
                        const Var<T>& dy) { return rotate(dy, back); }),
      x);
}

cuda::RopeProblem rope_problem(const Shape& shape, const RopeOptions& o) {
  check(shape.rank() >= tapegrad::detail::min_rank(o.layout), "rope", "x ", shape, " should be ",
        tapegrad::detail::layout_form(o.layout));
  const tapegrad::detail::HeadLayout x = tapegrad::detail::head_layout(shape, o.layout);
  const std::int64_t rotary = o.rotary_dim == 0 ? x.D : o.rotary_dim;
  check(rotary > 0 && rotary % 2 == 0 && rotary <= x.D, "rope", "rotary_dim ", rotary, " should be even, positive and ",
        "at most the head size ", x.D, " of x ", shape);
  const std::int64_t period = o.head_period == 0 ? x.heads : o.head_period;
  check(period > 0 && x.heads % period == 0, "rope", "head_period ", o.head_period, " should divide the ", x.heads,
        " heads of x ", shape);
  check(o.rotated_heads >= -1 && o.rotated_heads <= period, "rope", "rotated_heads ", o.rotated_heads,
        " should be -1 (all) or in [0, ", period, "] for x ", shape);
  check(std::isfinite(o.base) && o.base > 0, "rope", "base must be positive and finite, got ", o.base);
  return {.batch = x.batch, .heads = x.heads, .S = x.S, .D = x.D, .batch_stride = x.batch_stride,
          .head_stride = x.head_stride, .row_stride = x.row_stride, .head_period = period,
          .rotated_heads = o.rotated_heads < 0 ? period : o.rotated_heads, .rotary_dim = rotary,
          .position_offset = o.position_offset, .base = o.base, .interleaved = o.interleaved};
}

}  // namespace

template <class U> Var<U> rope(const Var<U>& x, const RopeOptions& options) {
  const OpScope scope = enter_op("rope", x);
  return rotate(x, rope_problem(x.shape(), options));
}

#define TAPEGRAD_INSTANTIATE_ROPE(U) template Var<U> rope<U>(const Var<U>&, const RopeOptions&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_ROPE)

}  // namespace tapegrad::nn
