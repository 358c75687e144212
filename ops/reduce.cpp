// Reductions. x is seen as [outer, n, inner] and reduced over its middle axis n:
//   - when the reduced axes are contiguous (size-1 axes aside) that is a view of x: nothing is copied;
//   - otherwise x is first permuted so that the kept axes come first and the reduced ones last: [kept, n, 1].
// Forward: plain loops on the pool (parallel_for), not Eigen Tensor reductions, which measured here 6x slower over
// the innermost axis and 30x slower over a middle one (the column sums of a matrix). Every loop reads contiguous
// rows and vectorizes; the work is cut into fixed pieces, so results do not depend on the thread count.
// Accumulation: sums in double for f32 and f64 (free: the loops are memory bound), in f32 for bf16/f16; max is exact.
// Backward, in the same [outer, n, inner] layout and permuted back when the forward permuted: sum and mean spread
// dy over n; max sends dy to the first element of each group equal to the maximum (the forward propagates NaN, so
// a NaN maximum goes to the first NaN).
// On a GPU x is reduced where it lies, without a permute (cuda/reduce.hpp), with the same accumulation types; max
// also records the flat index of each maximum, and its backward scatters dy there. Sum and mean spread dy back with
// expand_to, after dividing it by the count for mean.
#include "tapegrad/ops/reduce.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <type_traits>

#include "tapegrad/autodiff/custom_op.hpp"
#include "tapegrad/cuda/reduce.hpp"
#include "tapegrad/ops/detail/axes.hpp"
#include "tapegrad/ops/detail/broadcast.hpp"
#include "tapegrad/ops/detail/unfused.hpp"
#include "tapegrad/ops/layout.hpp"
#include "tapegrad/tensor/eigen.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"

namespace tapegrad {

namespace {

struct ReduceLayout {
  Shape x_shape;
  Shape layout_shape;     // x's shape after `perm`
  Shape y_shape;          // the result's shape
  std::vector<int> perm;  // empty when the reduced axes are contiguous; else the kept axes, then the reduced ones
  std::int64_t outer = 1, n = 1, inner = 1;
  std::vector<bool> reduced;  // for each axis of x
};

ReduceLayout plan_reduce(const Shape& x, const std::vector<int>& axes, bool keepdim, const char* op) {
  const int rank = x.rank();
  std::vector<bool> reduced(static_cast<std::size_t>(rank), axes.empty());
  for (int a : normalize_axes(x, axes, op)) reduced[static_cast<std::size_t>(a)] = true;
  auto is_reduced = [&](int i) { return reduced[static_cast<std::size_t>(i)]; };

  ReduceLayout l;
  l.reduced = reduced;
  l.x_shape = l.layout_shape = x;
  std::vector<std::int64_t> y_dims;
  for (int i = 0; i < rank; ++i) {
    if (!is_reduced(i)) y_dims.push_back(x[i]);
    else if (keepdim) y_dims.push_back(1);
  }
  l.y_shape = Shape(y_dims);

  // The reduced axes of size other than 1 span [first, last]; they are contiguous unless a kept one lies between.
  int first = rank, last = -1;
  for (int i = 0; i < rank; ++i) {
    if (is_reduced(i) && x[i] != 1) {
      first = std::min(first, i);
      last = i;
    }
  }
  bool contiguous = true;
  for (int i = first; i <= last; ++i) contiguous = contiguous && (is_reduced(i) || x[i] == 1);
  if (contiguous) {
    if (last < 0) {  // only size-1 axes are reduced
      l.outer = x.numel();
    } else {
      l.outer = numel_between(x, 0, first);
      l.n = numel_between(x, first, last + 1);
      l.inner = numel_between(x, last + 1, rank);
    }
    return l;
  }
  for (bool take_reduced : {false, true}) {
    for (int i = 0; i < rank; ++i) {
      if (is_reduced(i) == take_reduced) l.perm.push_back(i);
    }
  }
  std::vector<std::int64_t> dims;
  for (int a : l.perm) {
    dims.push_back(x[a]);
    (is_reduced(a) ? l.n : l.outer) *= x[a];
  }
  l.layout_shape = Shape(dims);
  return l;
}

template <class T> Tensor<T> to_layout(const Tensor<T>& x, const ReduceLayout& l, const char* op) {
  return l.perm.empty() ? x : permute(x, l.perm, op);
}
template <class T> Tensor<T> from_layout(const Tensor<T>& g, const ReduceLayout& l, const char* op) {
  return l.perm.empty() ? g.reshape(l.x_shape) : permute(g, inverse_permutation(l.perm), op);
}

// ---- kernels ---------------------------------------------------------------------------------------------------

// Sums accumulate in double for f32 (it costs nothing measurable: the loops are memory bound) and f64, in f32 for
// bf16/f16. max compares in compute_t<T>, which is exact.
template <class T> using sum_acc_t = std::conditional_t<is_half_precision_v<T>, float, double>;

struct Add {
  template <class A> static A identity() { return A(0); }
  template <class A> static A combine(A a, A v) { return a + v; }
};
struct Max {  // NaN wins, so that a NaN anywhere in a group is its maximum
  template <class A> static A identity() { return -std::numeric_limits<A>::infinity(); }
  template <class A> static A combine(A a, A v) { return (a != a || v < a) ? a : v; }
};

// acc[i] = combine(acc[i], x[j * stride + i]) for j < rows and i < width: rows of a row-major block, folded into
// `width` accumulators (the loop over i vectorizes).
template <class Op, class A, class T>
void fold_rows(A* acc, const T* x, std::int64_t rows, std::int64_t stride, std::int64_t width) {
  for (std::int64_t j = 0; j < rows; ++j) {
    const T* row = x + j * stride;
    for (std::int64_t i = 0; i < width; ++i) acc[i] = Op::combine(acc[i], static_cast<A>(row[i]));
  }
}

// The fold of m contiguous elements, through `lanes` accumulators so that the loop vectorizes.
constexpr std::int64_t lanes = 16;
template <class Op, class A, class T> A fold_contiguous(const T* x, std::int64_t m) {
  std::array<A, lanes> acc;
  acc.fill(Op::template identity<A>());
  const std::int64_t rows = m / lanes;
  fold_rows<Op>(acc.data(), x, rows, lanes, lanes);
  fold_rows<Op>(acc.data(), x + rows * lanes, 1, 0, m - rows * lanes);
  A total = acc[0];
  for (std::int64_t k = 1; k < lanes; ++k) total = Op::combine(total, acc[static_cast<std::size_t>(k)]);
  return total;
}

// y[o, i] = fold over j of xs[o, j, i], divided by `divisor`, with xs in the layout's order.
// The work is cut into fixed pieces, (o, a chunk of j, a block of i), each folded into its own partial result; the
// partials of each (o, i) are then folded in order. The result therefore does not depend on the thread count, and
// long sums add in two levels, which keeps their rounding error small.
constexpr std::int64_t row_chunk = 1 << 14;  // elements of j per piece when inner == 1
constexpr std::int64_t col_chunk = 1 << 10;  // rows of j per piece when inner > 1
constexpr std::int64_t col_block = 1 << 9;   // elements of i per piece
template <class Op, class A, class T>
Tensor<T> reduce_middle(const Tensor<T>& xs, const ReduceLayout& l, double divisor) {
  const std::int64_t outer = l.outer, n = l.n, inner = l.inner;
  const bool rows = inner == 1;
  const std::int64_t chunk = rows ? row_chunk : col_chunk, block = rows ? 1 : col_block;
  const std::int64_t chunks = std::max<std::int64_t>(1, (n + chunk - 1) / chunk), blocks = (inner + block - 1) / block;
  Tensor<T> y(l.y_shape);  // first: a result too large to address is refused before its partials are sized
  std::vector<A> partial(static_cast<std::size_t>(outer * chunks * inner));
  const T* x = xs.data();
  parallel_for(outer * chunks * blocks, std::min(chunk, n) * block, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) {
      const std::int64_t b = t % blocks, c = t / blocks % chunks, o = t / blocks / chunks;
      const std::int64_t j0 = c * chunk, j1 = std::min(n, j0 + chunk), i0 = b * block, i1 = std::min(inner, i0 + block);
      A* out = partial.data() + (o * chunks + c) * inner + i0;
      const T* in = x + (o * n + j0) * inner + i0;
      if (rows) {
        *out = fold_contiguous<Op, A>(in, j1 - j0);
      } else {
        std::fill(out, out + (i1 - i0), Op::template identity<A>());
        fold_rows<Op>(out, in, j1 - j0, inner, i1 - i0);
      }
    }
  });
  T* out = y.data();
  const A d = static_cast<A>(divisor);
  parallel_for(outer * inner, chunks, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) {
      const A* p = partial.data() + (t / inner * chunks) * inner + t % inner;
      A total = p[0];
      for (std::int64_t c = 1; c < chunks; ++c) total = Op::combine(total, p[c * inner]);
      out[t] = convert<T>(total / d);
    }
  });
  return y;
}

// dx[o, j, i] = dy[o, i] / divisor, in the layout's order (the division is done once per element of dy).
template <class T> Tensor<T> spread_middle(const Tensor<T>& dy, const ReduceLayout& l, double divisor) {
  using C = compute_t<T>;
  Tensor<T> g = dy;
  if (divisor != 1.0) {
    g = Tensor<T>(dy.shape());
    parallel_for(g.numel(), 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) g.flat(i) = convert<T>(static_cast<C>(dy.flat(i)) / C(divisor));
    });
  }
  Tensor<T> dx(l.layout_shape);
  const std::int64_t n = l.n, inner = l.inner;
  const T* from = g.data();
  T* to = dx.data();
  parallel_for(l.outer * n, inner, [&](std::int64_t begin, std::int64_t end) {
    std::int64_t o = begin / n, j = begin % n;
    for (std::int64_t r = begin; r < end; ++r) {
      std::copy_n(from + o * inner, inner, to + r * inner);
      if (++j == n) {
        j = 0;
        ++o;
      }
    }
  });
  return dx;
}

// ---- the GPU path ----------------------------------------------------------------------------------------------

cuda::Reduction reduction_of(const ReduceLayout& l) { return {l.x_shape.to_vector(), l.reduced}; }

template <class T> Tensor<T> sum_on_device(const Tensor<T>& x, const ReduceLayout& l, double divisor) {
  Tensor<T> y(l.y_shape, x.device());
  cuda::sum(dtype_v<T>, x.data(), reduction_of(l), divisor, y.data(), x.device().index);
  return y;
}

// x's shape with the reduced axes kept as 1.
Shape kept_shape(const ReduceLayout& l) {
  std::vector<std::int64_t> kept = l.x_shape.to_vector();
  for (std::size_t a = 0; a < kept.size(); ++a) {
    if (l.reduced[a]) kept[a] = 1;
  }
  return Shape(kept);
}

// dx = dy / divisor, broadcast over the reduced axes.
template <class T> Tensor<T> spread_on_device(const Tensor<T>& dy, const ReduceLayout& l, double divisor) {
  Tensor<T> g = dy;
  if (divisor != 1.0) {
    g = Tensor<T>(dy.shape(), dy.device());
    cuda::divide(dtype_v<T>, dy.data(), divisor, g.data(), dy.numel(), dy.device().index);
  }
  return expand_to(g.reshape(kept_shape(l)), l.x_shape);
}

// The recorded backward of a reduction (create_graph): dy spread over the reduced axes.
template <class T> Var<T> spread(const Var<T>& dy, const ReduceLayout& l) {
  return broadcast_to(reshape(dy, kept_shape(l).to_vector()), l.x_shape);
}

// sum (divisor 1) and mean (divisor n) share everything but the divisor.
template <class T>
Var<T> sum_over(const Var<T>& x, const std::vector<int>& axes, bool keepdim, const char* op, bool average) {
  struct Saved {
    ReduceLayout layout;
    double divisor = 1;
  };
  return custom_op<Saved>(
      op,
      [&](Saved& s, const Tensor<T>& x) {
        s.layout = plan_reduce(x.shape(), axes, keepdim, op);
        s.divisor = average ? static_cast<double>(s.layout.n) : 1.0;
        return by_device(
            op, x.device(),
            [&] { return reduce_middle<Add, sum_acc_t<T>>(to_layout(x, s.layout, op), s.layout, s.divisor); },
            [&](auto) { return sum_on_device(x, s.layout, s.divisor); });
      },
      [op](const Saved& s, const NeedsGrad&, const Tensor<T>& dy) {
        return by_device(
            op, dy.device(), [&] { return from_layout(spread_middle(dy, s.layout, s.divisor), s.layout, op); },
            [&](auto) { return spread_on_device(dy, s.layout, s.divisor); });
      },
      graph_backward([](const Saved& s, const NeedsGrad&, const std::tuple<Var<T>>&, const Var<T>& dy) {
        const Var<T> spread_dy = spread(dy, s.layout);
        return s.divisor == 1.0 ? spread_dy : (detail::Unfused<T>{spread_dy} * (1.0 / s.divisor)).v;
      }),
      x);
}

constexpr std::int64_t argmax_block = 256;

// dx in the layout's order: dy[o, i] at the first j where xs[o, j, i] equals y[o, i] (NaN equal to NaN), zero
// elsewhere. Works through blocks of `inner` so that each pass over j reads contiguous rows.
template <class T>
Tensor<T> route_to_argmax(const Tensor<T>& xs, const Tensor<T>& y, const Tensor<T>& dy, const ReduceLayout& l) {
  using C = compute_t<T>;
  Tensor<T> dx = zeros<T>(l.layout_shape);
  const std::int64_t blocks = (l.inner + argmax_block - 1) / argmax_block;
  const T* x = xs.data();
  const T* top = y.data();
  const T* g = dy.data();
  T* out = dx.data();
  parallel_for(l.outer * blocks, l.n * std::min(l.inner, argmax_block), [&](std::int64_t begin, std::int64_t end) {
    std::vector<char> found(static_cast<std::size_t>(argmax_block));
    for (std::int64_t t = begin; t < end; ++t) {
      const std::int64_t o = t / blocks, i0 = (t % blocks) * argmax_block, i1 = std::min(i0 + argmax_block, l.inner);
      std::fill(found.begin(), found.end(), 0);
      std::int64_t missing = i1 - i0;
      for (std::int64_t j = 0; j < l.n && missing > 0; ++j) {
        const std::int64_t row = (o * l.n + j) * l.inner;
        for (std::int64_t i = i0; i < i1; ++i) {
          const C v = static_cast<C>(x[row + i]), m = static_cast<C>(top[o * l.inner + i]);
          char& done = found[static_cast<std::size_t>(i - i0)];
          if (!done && (v == m || (v != v && m != m))) {
            out[row + i] = g[o * l.inner + i];
            done = 1;
            --missing;
          }
        }
      }
    }
  });
  return dx;
}

template <class T> struct MaxSaved {
  ReduceLayout layout;
  Tensor<T> xs;  // on the cpu: x in the layout's order, and
  Tensor<T> y;   // the maxima: together they locate each group's first maximum
  Tensor<std::int64_t> argmax;  // on a GPU: the flat index into x of each group's first maximum
};

// dy sent to each group's first maximum, zero elsewhere.
template <class T> Tensor<T> to_argmax(const MaxSaved<T>& s, const Tensor<T>& dy) {
  return by_device(
      "max", dy.device(), [&] { return from_layout(route_to_argmax(s.xs, s.y, dy, s.layout), s.layout, "max"); },
      [&](auto gpu) {
        Tensor<T> dx = zeros<T>(s.layout.x_shape, gpu);
        cuda::scatter_to_argmax(dtype_v<T>, dy.data(), s.argmax.data(), dy.numel(), dx.data(), gpu.index);
        return dx;
      });
}

}  // namespace

template <class T> Var<T> sum(const Var<T>& x, std::vector<int> axes, bool keepdim) {
  return sum_over(x, axes, keepdim, "sum", false);
}

template <class T> Var<T> mean(const Var<T>& x, std::vector<int> axes, bool keepdim) {
  return sum_over(x, axes, keepdim, "mean", true);
}

template <class T> Var<T> broadcast_to(const Var<T>& x, const Shape& shape) {
  const OpScope scope("broadcast_to");
  check_defined_inputs("broadcast_to", x);
  check(broadcast_shapes(x.shape(), shape, "broadcast_to") == shape, "broadcast_to", "cannot broadcast shape ",
        x.shape(), " to ", shape);
  if (x.shape() == shape) return x;
  return custom_op<Shape>(
      "broadcast_to",
      [&](Shape& from, const Tensor<T>& xv) {
        from = xv.shape();
        return expand_to(xv, shape);
      },
      [](const Shape& from, const NeedsGrad&, const Tensor<T>& dy) { return sum_to(dy, from); },
      graph_backward([](const Shape& from, const NeedsGrad&, const std::tuple<Var<T>>&, const Var<T>& dy) {
        return sum_to(dy, from);
      }),
      x);
}

template <class T> Var<T> sum_to(const Var<T>& x, const Shape& shape) {
  const OpScope scope("sum_to");
  check_defined_inputs("sum_to", x);
  check(broadcast_shapes(shape, x.shape(), "sum_to") == x.shape(), "sum_to", "cannot sum shape ", x.shape(),
        " down to ", shape, " (it does not broadcast to it)");
  if (x.shape() == shape) return x;
  return custom_op<Shape>(
      "sum_to",
      [&](Shape& from, const Tensor<T>& xv) {
        from = xv.shape();
        return sum_to(xv, shape);
      },
      [](const Shape& from, const NeedsGrad&, const Tensor<T>& dy) { return expand_to(dy, from); },
      graph_backward([](const Shape& from, const NeedsGrad&, const std::tuple<Var<T>>&, const Var<T>& dy) {
        return broadcast_to(dy, from);
      }),
      x);
}

template <class T> Var<T> max(const Var<T>& x, std::vector<int> axes, bool keepdim) {
  using Saved = MaxSaved<T>;
  return custom_op<Saved>(
      "max",
      [&](Saved& s, const Tensor<T>& x) {
        s.layout = plan_reduce(x.shape(), axes, keepdim, "max");
        if (s.layout.n == 0) {  // (the axes' text is built only then)
          check(false, "max", "cannot take the maximum over zero elements: shape ", x.shape(), " reduced over axes ",
                axes.empty() ? std::string("(all)") : list_str(axes));
        }
        return by_device(
            "max", x.device(),
            [&] {
              s.xs = to_layout(x, s.layout, "max");
              s.y = reduce_middle<Max, compute_t<T>>(s.xs, s.layout, 1.0);
              return s.y;
            },
            [&](auto gpu) {
              Tensor<T> y(s.layout.y_shape, gpu);
              s.argmax = Tensor<std::int64_t>(s.layout.y_shape, gpu);
              cuda::max(dtype_v<T>, x.data(), reduction_of(s.layout), y.data(), s.argmax.data(), gpu.index);
              return y;
            });
      },
      [](const Saved& s, const NeedsGrad&, const Tensor<T>& dy) { return to_argmax(s, dy); },
      // dy spread over the reduced axes, kept at each group's maximum (a constant mask: zero second derivative)
      graph_backward([](const Saved& s, const NeedsGrad&, const std::tuple<Var<T>>&, const Var<T>& dy) {
        const Tensor<T> mask = to_argmax(s, ones<T>(dy.shape(), dy.device()));
        using V = detail::Unfused<T>;
        return (V{spread(dy, s.layout)} * V{constant(mask)}).v;
      }),
      x);
}

#define TAPEGRAD_INSTANTIATE_REDUCE(T)                               \
  template Var<T> sum<T>(const Var<T>&, std::vector<int>, bool);     \
  template Var<T> mean<T>(const Var<T>&, std::vector<int>, bool);    \
  template Var<T> max<T>(const Var<T>&, std::vector<int>, bool);     \
  template Var<T> broadcast_to<T>(const Var<T>&, const Shape&);      \
  template Var<T> sum_to<T>(const Var<T>&, const Shape&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_REDUCE)

}  // namespace tapegrad
