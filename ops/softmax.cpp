// softmax and log_softmax along any axis, with x seen as lines [outer, n, inner] (ops/detail/lines.hpp), in
// C = compute_t<T>, rounded to T once.
//
//   p = exp(x - max) / Σ exp(x - max)        (max and the sum per line: ops/detail/softmax_stats.hpp)
//   softmax:      y = p                      backward: dx = p · (dy - Σ dy·p)
//   log_softmax:  y = x - max - log Σ ...    backward: dx = dy - p · Σ dy
//
// Saved: x (it shares the input's storage) and each line's max and sum in C. Backward recomputes p from them in
// full precision instead of reading back the rounded output: exp of a bf16 log-softmax output would be off by up
// to |y|·2⁻⁹ relative. On a GPU the same, with the statistics in device tensors (kernels: cuda/softmax.cu).
#include "tapegrad/ops/softmax.hpp"

#include <cmath>
#include <vector>

#include "tapegrad/autodiff/custom_op.hpp"
#include "tapegrad/autodiff/grad.hpp"
#include "tapegrad/cuda/softmax.hpp"
#include "tapegrad/ops/detail/softmax_stats.hpp"
#include "tapegrad/ops/detail/unfused.hpp"
#include "tapegrad/ops/reduce.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"

namespace tapegrad {

namespace {

using detail::AxisLayout;

template <class T> struct SoftmaxSaved {
  using C = compute_t<T>;
  Tensor<T> x;
  AxisLayout layout;
  detail::SoftmaxStats<C> stats;  // the cpu path's
  Tensor<C> line_max, line_sum;   // the GPU path's: the same statistics, on the device

  cuda::SoftmaxLines device_lines() const { return {layout.outer, layout.n, layout.inner}; }

  C x_at(std::int64_t e) const { return static_cast<C>(x.flat(e)); }
  // The softmax probability of element e, which lies on line k.
  C p_at(std::int64_t e, std::size_t k) const { return std::exp(x_at(e) - stats.max[k]) / stats.sum[k]; }
};

// A tensor of x's shape with element e = value(e, k), k being e's line.
template <class T, class Value> Tensor<T> map_lines(const SoftmaxSaved<T>& s, std::int64_t cost, Value value) {
  Tensor<T> out(s.x.shape());
  detail::for_each_line_run(s.layout, cost * s.layout.n, [&](std::int64_t at, std::int64_t line, std::int64_t width) {
    detail::for_each_in_run(s.layout, at, width, [&](std::int64_t e, std::int64_t i) {
      out.flat(e) = convert<T>(value(e, static_cast<std::size_t>(line + i)));
    });
  });
  return out;
}

// Both backward passes: per line, r = Σ reduce(dy, p); then dx = map(dy, p, r) elementwise.
template <class T, class Reduce, class Map>
Tensor<T> line_backward(const SoftmaxSaved<T>& s, const Tensor<T>& dy, Reduce reduce, Map map) {
  using C = compute_t<T>;
  const AxisLayout& l = s.layout;
  Tensor<T> dx(dy.shape());
  std::vector<C> r(static_cast<std::size_t>(l.lines()), C(0));
  detail::for_each_line_run(l, 6 * l.n, [&](std::int64_t at, std::int64_t line, std::int64_t width) {
    const auto k = [&](std::int64_t i) { return static_cast<std::size_t>(line + i); };
    detail::for_each_in_run(l, at, width, [&](std::int64_t e, std::int64_t i) {
      r[k(i)] += reduce(static_cast<C>(dy.flat(e)), s.p_at(e, k(i)));
    });
    detail::for_each_in_run(l, at, width, [&](std::int64_t e, std::int64_t i) {
      dx.flat(e) = convert<T>(map(static_cast<C>(dy.flat(e)), s.p_at(e, k(i)), r[k(i)]));
    });
  });
  return dx;
}

template <class T> Tensor<T> device_softmax_forward(SoftmaxSaved<T>& s, bool log) {
  const Device device = s.x.device();
  s.line_max = Tensor<compute_t<T>>({s.layout.lines()}, device);
  s.line_sum = Tensor<compute_t<T>>({s.layout.lines()}, device);
  Tensor<T> y(s.x.shape(), device);
  cuda::softmax_forward(dtype_v<T>, log, s.device_lines(), s.x.data(), y.data(), s.line_max.data(),
                        s.line_sum.data(), device.index);
  return y;
}

template <class T> Tensor<T> device_softmax_backward(const SoftmaxSaved<T>& s, bool log, const Tensor<T>& dy) {
  Tensor<T> dx(dy.shape(), dy.device());
  cuda::softmax_backward(dtype_v<T>, log, s.device_lines(), s.x.data(), s.line_max.data(), s.line_sum.data(),
                         dy.data(), dx.data(), dy.device().index);
  return dx;
}

// softmax (log_softmax) of primitive ops, for the recorded backward (create_graph): shifted by the line's maximum
// as a constant, which softmax does not depend on.
template <class T> Var<T> composite_softmax(const Var<T>& x, int axis, bool take_log) {
  using V = detail::Unfused<T>;
  const V shifted = V{x} - V{constant(max(x.detach(), {axis}, true).value())};
  const V e = exp(shifted);
  const V total{sum(e.v, {axis}, true)};
  return take_log ? (shifted - log(total)).v : (e / total).v;
}

// Records the node; forward and backward are the cpu path's, `log` picks the GPU path's kernels.
template <class T, class Forward, class Backward>
Var<T> record_softmax(const char* op, bool log, const Var<T>& x, int axis, Forward forward, Backward backward) {
  const OpScope scope = enter_op(op, x);
  const AxisLayout layout = detail::axis_layout(x.shape(), axis, op);
  return custom_op<SoftmaxSaved<T>>(
      op,
      [&](SoftmaxSaved<T>& s, const Tensor<T>& xv) {
        s.x = xv;
        s.layout = layout;
        return by_device(
            op, xv.device(),
            [&] {
              s.stats = detail::softmax_stats(xv, layout);
              return forward(s);
            },
            [&](auto) { return device_softmax_forward(s, log); });
      },
      [backward, log, op](const SoftmaxSaved<T>& s, const NeedsGrad&, const Tensor<T>& dy) {
        return by_device(
            op, dy.device(), [&] { return backward(s, dy); },
            [&](auto) { return device_softmax_backward(s, log, dy); });
      },
      graph_backward([log, axis](const SoftmaxSaved<T>&, const NeedsGrad&, const std::tuple<Var<T>>& in,
                                 const Var<T>& dy) {
        return composite_vjp<T>([&](const std::vector<Var<T>>& v) { return composite_softmax(v[0], axis, log); },
                                {std::get<0>(in)}, dy)[0];
      }),
      x);
}

}  // namespace

template <class T> Var<T> softmax(const Var<T>& x, int axis) {
  using C = compute_t<T>;
  return record_softmax(
      "softmax", false, x, axis,
      [](const SoftmaxSaved<T>& s) {
        return map_lines(s, 2, [&](std::int64_t e, std::size_t k) { return s.p_at(e, k); });
      },
      [](const SoftmaxSaved<T>& s, const Tensor<T>& dy) {
        return line_backward(
            s, dy, [](C dy, C p) { return dy * p; }, [](C dy, C p, C dot) { return p * (dy - dot); });
      });
}

template <class T> Var<T> log_softmax(const Var<T>& x, int axis) {
  using C = compute_t<T>;
  return record_softmax(
      "log_softmax", true, x, axis,
      [](const SoftmaxSaved<T>& s) {
        const std::vector<C> lse = detail::log_sum_exp(s.stats);
        return map_lines(s, 1, [&](std::int64_t e, std::size_t k) { return s.x_at(e) - lse[k]; });
      },
      [](const SoftmaxSaved<T>& s, const Tensor<T>& dy) {
        return line_backward(
            s, dy, [](C dy, C) { return dy; }, [](C dy, C p, C sum) { return dy - p * sum; });
      });
}

#define TAPEGRAD_INSTANTIATE_SOFTMAX(T)           \
  template Var<T> softmax<T>(const Var<T>&, int); \
  template Var<T> log_softmax<T>(const Var<T>&, int);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_SOFTMAX)

}  // namespace tapegrad
