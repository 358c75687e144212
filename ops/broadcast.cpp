// Broadcast plans, and expand_to / sum_to on the cpu (odometer loops) and on a GPU (a strided copy with zero
// strides on the broadcast axes; the reduction kernels over them).
#include "tapegrad/ops/detail/broadcast.hpp"

#include <algorithm>

#include "tapegrad/cuda/reduce.hpp"
#include "tapegrad/cuda/strided_copy.hpp"
#include "tapegrad/tensor/eigen.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"

namespace tapegrad {

BroadcastPlan plan_broadcast(std::span<const Shape> operands, const char* op) {
  BroadcastPlan plan;
  Shape out = operands.empty() ? Shape{} : operands[0];
  for (std::size_t k = 1; k < operands.size(); ++k) {
    if (!(operands[k] == out)) out = broadcast_shapes(out, operands[k], op);
  }
  plan.output = out;
  if (std::all_of(operands.begin(), operands.end(), [&](const Shape& s) { return s == out; })) return plan;  // flat
  for (const Shape& s : operands) plan.operand_is_full.push_back(s == out);
  if (out.numel() == 0) {  // Eigen cannot broadcast over empty axes; expanding nothing costs nothing
    plan.kind = BroadcastPlan::Kind::expand;
    return plan;
  }

  // Right-align every operand against the output; drop size-1 output axes; merge neighbours that broadcast alike.
  const int n = out.rank();
  std::vector<std::int64_t> merged_out;
  std::vector<std::vector<std::int64_t>> merged(operands.size());
  std::vector<bool> previous_pattern;
  for (int i = 0; i < n; ++i) {
    if (out[i] == 1) continue;
    std::vector<bool> pattern;
    for (const Shape& s : operands) {
      const int j = i - (n - s.rank());
      pattern.push_back(j < 0 || s[j] == 1);
    }
    if (!merged_out.empty() && pattern == previous_pattern) {
      merged_out.back() *= out[i];
      for (std::size_t k = 0; k < operands.size(); ++k) merged[k].back() *= pattern[k] ? 1 : out[i];
    } else {
      merged_out.push_back(out[i]);
      for (std::size_t k = 0; k < operands.size(); ++k) merged[k].push_back(pattern[k] ? 1 : out[i]);
    }
    previous_pattern = pattern;
  }
  if (merged_out.size() > static_cast<std::size_t>(BroadcastPlan::rank)) {
    plan.kind = BroadcastPlan::Kind::expand;
    return plan;
  }
  plan.kind = BroadcastPlan::Kind::broadcast;
  const std::size_t pad = BroadcastPlan::rank - merged_out.size();
  plan.out_dims.fill(1);
  for (std::size_t i = 0; i < merged_out.size(); ++i) plan.out_dims[pad + i] = merged_out[i];
  for (std::size_t k = 0; k < operands.size(); ++k) {
    std::array<Eigen::Index, BroadcastPlan::rank> dims, factors;
    dims.fill(1);
    factors.fill(1);
    for (std::size_t i = 0; i < merged_out.size(); ++i) {
      dims[pad + i] = merged[k][i];
      factors[pad + i] = merged_out[i] / merged[k][i];
    }
    plan.operand_dims.push_back(dims);
    plan.operand_factors.push_back(factors);
  }
  return plan;
}

namespace {
// Strides of `from` seen from a broadcast output of `to`'s rank: zero on broadcast axes.
std::array<std::int64_t, Shape::max_rank> broadcast_strides(const Shape& from, const Shape& to) {
  std::array<std::int64_t, Shape::max_rank> s{};
  const auto own = from.strides();
  for (int i = 0; i < to.rank(); ++i) {
    const int j = i - (to.rank() - from.rank());
    s[static_cast<std::size_t>(i)] = (j < 0 || from[j] == 1) ? 0 : own[static_cast<std::size_t>(j)];
  }
  return s;
}

// Which axes of `to` broadcast `from` (NumPy rules: `from` right-aligned, its missing and size-1 axes broadcast).
std::vector<bool> broadcast_axes(const Shape& from, const Shape& to) {
  std::vector<bool> axes(static_cast<std::size_t>(to.rank()));
  for (int i = 0; i < to.rank(); ++i) {
    const int j = i - (to.rank() - from.rank());
    axes[static_cast<std::size_t>(i)] = j < 0 || from[j] == 1;
  }
  return axes;
}

// Calls visit(out_index, in_index) for each element of `to`, with in_index the element of `from` it reads.
template <class Visit> void for_each_broadcast(const Shape& from, const Shape& to, Visit visit) {
  const auto strides = broadcast_strides(from, to);
  std::array<std::int64_t, Shape::max_rank> idx{};
  std::int64_t in = 0;
  const std::int64_t n = to.numel();
  for (std::int64_t out = 0; out < n; ++out) {
    visit(out, in);
    for (int a = to.rank() - 1; a >= 0; --a) {  // odometer increment
      const auto u = static_cast<std::size_t>(a);
      in += strides[u];
      if (++idx[u] < to[a]) break;
      in -= strides[u] * to[a];
      idx[u] = 0;
    }
  }
}
}  // namespace

template <class T> Tensor<T> expand_to(const Tensor<T>& t, const Shape& shape) {
  check(broadcast_shapes(t.shape(), shape, "expand_to") == shape, "expand_to", "cannot expand shape ",
        t.shape(), " to ", shape);
  Tensor<T> out(shape, t.device());
  by_device(
      "expand_to", t.device(),
      [&] {
        const T* src = t.data();
        T* dst = out.data();
        for_each_broadcast(t.shape(), shape, [&](std::int64_t o, std::int64_t i) { dst[o] = src[i]; });
      },
      [&](auto gpu) {
        const auto from = broadcast_strides(t.shape(), shape), to = shape.strides();
        std::vector<cuda::CopyAxis> axes;
        for (std::size_t i = 0; i < static_cast<std::size_t>(shape.rank()); ++i) {
          axes.push_back({shape[static_cast<int>(i)], from[i], to[i]});
        }
        cuda::strided_copy(dtype_v<T>, t.data(), out.data(), axes, gpu.index);
      });
  return out;
}

template <class T> Tensor<T> sum_to(const Tensor<T>& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  check(broadcast_shapes(shape, g.shape(), "sum_to") == g.shape(), "sum_to", "cannot reduce shape ",
        g.shape(), " to ", shape);
  Tensor<T> out(shape, g.device());
  by_device(
      "sum_to", g.device(),
      [&] {
        using C = compute_t<T>;
        std::vector<C> acc(static_cast<std::size_t>(shape.numel()), C(0));
        const T* src = g.data();
        for_each_broadcast(shape, g.shape(), [&](std::int64_t o, std::int64_t i) {
          acc[static_cast<std::size_t>(i)] += static_cast<C>(src[o]);
        });
        for (std::int64_t i = 0; i < out.numel(); ++i) out.flat(i) = convert<T>(acc[static_cast<std::size_t>(i)]);
      },
      [&](auto gpu) {
        cuda::sum(dtype_v<T>, g.data(), {g.shape().to_vector(), broadcast_axes(shape, g.shape())}, 1.0, out.data(),
                  gpu.index);
      });
  return out;
}

#define TAPEGRAD_INSTANTIATE_BROADCAST(T)                                 \
  template Tensor<T> expand_to<T>(const Tensor<T>&, const Shape&);        \
  template Tensor<T> sum_to<T>(const Tensor<T>&, const Shape&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_BROADCAST)

}  // namespace tapegrad
