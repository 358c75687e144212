// Losses in C = compute_t<T>, each a rank-0 mean rounded to T once. Totals are summed over fixed blocks
// (ops/detail/row_sum.hpp), so they do not depend on the thread count.
//
//   mse_loss:       L = Σ (p - t)² / n                 dp = 2 (p - t) / n · dL,   dt = -dp
//   cross_entropy:  logits x seen as [N, C]; q the target distribution of each row (one-hot of the label, or the
//                   soft target); lse = log Σ_c exp(x_c) per row (ops/detail/softmax_stats.hpp), softmax = exp(x - lse)
//                   L  = Σ_rows Σ_c q_c (lse - x_c) / N
//                   dx = (softmax · Σ_c q_c - q) / N · dL        (labels: (softmax - onehot) / N · dL)
//                   dq = (lse - x) / N · dL                      (soft targets only)
//
// Saved: the inputs (they share storage with them) and, for cross_entropy, lse per row in C, from which backward
// recomputes softmax in full precision. On a GPU the same, with lse in a device tensor (kernels: cuda/loss.cu);
// labels on a GPU are checked by the forward kernel, which flags the first one out of range.
#include "tapegrad/ops/loss.hpp"

#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "tapegrad/autodiff/custom_op.hpp"
#include "tapegrad/autodiff/grad.hpp"
#include "tapegrad/cuda/loss.hpp"
#include "tapegrad/ops/detail/row_sum.hpp"
#include "tapegrad/ops/detail/softmax_stats.hpp"
#include "tapegrad/ops/detail/unfused.hpp"
#include "tapegrad/ops/reduce.hpp"
#include "tapegrad/ops/softmax.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"
#include "tapegrad/tensor/gpu/memory.hpp"

namespace tapegrad {

namespace {

template <class T> Tensor<T> mean_of(compute_t<T> total, std::int64_t count) {
  const compute_t<T> mean = total / static_cast<compute_t<T>>(count);
  return detail::rounded_tensor<T>(&mean, Shape{});
}

// ---- mse_loss ---------------------------------------------------------------------------------------------------

template <class T> struct MseSaved { Tensor<T> pred, target; };

// (pred - target) · scale, elementwise, rounded to T.
template <class T> Tensor<T> scaled_difference(const MseSaved<T>& s, compute_t<T> scale) {
  using C = compute_t<T>;
  Tensor<T> out(s.pred.shape());
  parallel_for(out.numel(), 4, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      out.flat(i) = convert<T>((static_cast<C>(s.pred.flat(i)) - static_cast<C>(s.target.flat(i))) * scale);
    }
  });
  return out;
}

// ---- cross_entropy ----------------------------------------------------------------------------------------------

// q(r, c), the target probability of class c in row r: from class indices, or from soft targets.
template <class C> C target_prob(const Tensor<std::int64_t>& labels, std::int64_t r, std::int64_t c, std::int64_t) {
  return labels.flat(r) == c ? C(1) : C(0);
}
template <class C, class T>
C target_prob(const Tensor<T>& probs, std::int64_t r, std::int64_t c, std::int64_t classes) {
  return static_cast<C>(probs.flat(r * classes + c));
}

// Targets is Tensor<std::int64_t> (labels) or Tensor<T> (soft targets).
template <class T, class Targets> struct CrossEntropySaved {
  Tensor<T> logits;
  Targets targets;
  std::int64_t rows = 0, classes = 0;
  std::vector<compute_t<T>> lse;  // per row (the cpu path's)
  Tensor<compute_t<T>> device_lse;  // per row (the GPU path's)
};

// Keeps the inputs, seen as [rows, classes].
template <class T, class Targets>
detail::AxisLayout keep_inputs(CrossEntropySaved<T, Targets>& s, const Tensor<T>& logits, const Targets& targets) {
  const detail::AxisLayout rows = detail::axis_layout(logits.shape(), -1, "cross_entropy");
  s.logits = logits;
  s.targets = targets;
  s.rows = rows.outer;
  s.classes = rows.n;
  return rows;
}

template <class T, class Targets>
Tensor<T> cross_entropy_forward(CrossEntropySaved<T, Targets>& s, const Tensor<T>& logits, const Targets& targets) {
  using C = compute_t<T>;
  const detail::AxisLayout rows = keep_inputs(s, logits, targets);
  s.lse = detail::log_sum_exp(detail::softmax_stats(logits, rows));
  const auto total =
      detail::blocked_row_sum<C>(s.rows, 1, 3 * s.classes, [&](std::int64_t begin, std::int64_t end, C* partial) {
        for (std::int64_t r = begin; r < end; ++r) {
          for (std::int64_t c = 0; c < s.classes; ++c) {
            const C q = target_prob<C>(s.targets, r, c, s.classes);
            // A class with no target mass adds nothing, even where its logit is -inf (0 · inf would be NaN).
            if (q != C(0)) partial[0] += q * (s.lse[r] - static_cast<C>(logits.flat(r * s.classes + c)));
          }
        }
      });
  return mean_of<T>(total[0], s.rows);
}

template <class T, class Targets>
Tensor<T> cross_entropy_dlogits(const CrossEntropySaved<T, Targets>& s, compute_t<T> scale) {
  using C = compute_t<T>;
  Tensor<T> dx(s.logits.shape());
  parallel_for(s.rows, 6 * s.classes, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin; r < end; ++r) {
      C mass = 0;
      for (std::int64_t c = 0; c < s.classes; ++c) mass += target_prob<C>(s.targets, r, c, s.classes);
      for (std::int64_t c = 0; c < s.classes; ++c) {
        const std::int64_t e = r * s.classes + c;
        const C p = std::exp(static_cast<C>(s.logits.flat(e)) - s.lse[r]);
        dx.flat(e) = convert<T>((p * mass - target_prob<C>(s.targets, r, c, s.classes)) * scale);
      }
    }
  });
  return dx;
}

template <class T> Tensor<T> cross_entropy_dtargets(const CrossEntropySaved<T, Tensor<T>>& s, compute_t<T> scale) {
  using C = compute_t<T>;
  Tensor<T> dq(s.logits.shape());
  parallel_for(s.rows, 2 * s.classes, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t e = begin * s.classes; e < end * s.classes; ++e) {
      dq.flat(e) = convert<T>((s.lse[e / s.classes] - static_cast<C>(s.logits.flat(e))) * scale);
    }
  });
  return dq;
}

void check_logits(const Shape& logits) {
  check(logits.rank() >= 1, "cross_entropy", "logits must have at least one axis (the classes), got shape ",
        logits.str());
}

// "[i, j, ...]": the multi-index of flat element `flat` of `shape`.
std::string position(const Shape& shape, std::int64_t flat) {
  std::vector<std::int64_t> index(static_cast<std::size_t>(shape.rank()));
  for (int a = shape.rank() - 1; a >= 0; --a) {
    index[static_cast<std::size_t>(a)] = flat % shape[a];
    flat /= shape[a];
  }
  return Shape(index).str();
}

// The shape of the labels of `logits`: its leading axes.
Shape label_shape(const Shape& logits) {
  return Shape(logits.dims().first(static_cast<std::size_t>(logits.rank() - 1)));
}

void check_label_shape(const Shape& logits, const Tensor<std::int64_t>& labels) {
  check_logits(logits);
  const Shape leading = label_shape(logits);
  check(labels.shape() == leading, "cross_entropy", "labels have shape ", labels.shape(), " but logits of shape ",
        logits, " need labels of shape ", leading);
}

[[noreturn]] void throw_label_out_of_range(const Shape& logits, std::int64_t flat, std::int64_t label) {
  throw Error(detail::concat("cross_entropy: label ", label, " at position ", position(label_shape(logits), flat),
                             " is out of range for ", logits.dim(-1), " classes (logits of shape ", logits.str(), ")"));
}

// Labels on the cpu, each in [0, classes) (on a GPU the forward kernel checks them).
void check_label_values(const Shape& logits, const Tensor<std::int64_t>& labels) {
  const std::int64_t classes = logits.dim(-1);
  for (std::int64_t i = 0; i < labels.numel(); ++i) {
    const std::int64_t label = labels.flat(i);
    if (label < 0 || label >= classes) throw_label_out_of_range(logits, i, label);
  }
}

// ---- the GPU path -----------------------------------------------------------------------------------------------

template <class T> Tensor<T> device_mse_loss(const Tensor<T>& pred, const Tensor<T>& target) {
  const Device device = pred.device();
  const std::int64_t n = pred.numel();
  Tensor<compute_t<T>> partials({cuda::mse_loss_partials(n)}, device);
  Tensor<T> loss(Shape{}, device);
  cuda::mse_loss_forward(dtype_v<T>, n, pred.data(), target.data(), partials.data(), loss.data(), device.index);
  return loss;
}

template <class T>
std::tuple<Tensor<T>, Tensor<T>> device_mse_grads(const MseSaved<T>& s, const Tensor<T>& dy, const NeedsGrad& needs) {
  const Device device = dy.device();
  Tensor<T> dpred = needs[0] ? Tensor<T>(s.pred.shape(), device) : Tensor<T>();
  Tensor<T> dtarget = needs[1] ? Tensor<T>(s.pred.shape(), device) : Tensor<T>();
  cuda::mse_loss_backward(dtype_v<T>, s.pred.numel(), s.pred.data(), s.target.data(), dy.data(), dpred.data(),
                          dtarget.data(), device.index);
  return {dpred, dtarget};
}

// The kernels' view of the targets: class indices, or soft targets.
template <class Q> cuda::CrossEntropyTargets device_targets(const Tensor<Q>& targets) {
  if constexpr (std::is_same_v<Q, std::int64_t>) {
    return {.labels = targets.data()};
  } else {
    return {.probs = targets.data()};
  }
}

template <class T, class Targets>
Tensor<T> device_cross_entropy_forward(CrossEntropySaved<T, Targets>& s, const Tensor<T>& logits,
                                       const Targets& targets) {
  constexpr bool labels = std::is_same_v<Targets, Tensor<std::int64_t>>;
  const Device device = logits.device();
  keep_inputs(s, logits, targets);
  s.device_lse = Tensor<compute_t<T>>({s.rows}, device);
  Tensor<compute_t<T>> row_loss({s.rows}, device);
  Tensor<std::int64_t> first_bad_label = labels ? Tensor<std::int64_t>({1}, device) : Tensor<std::int64_t>();
  Tensor<T> loss(Shape{}, device);
  cuda::cross_entropy_forward({dtype_v<T>, s.rows, s.classes}, logits.data(), device_targets(targets),
                              s.device_lse.data(), row_loss.data(), loss.data(), first_bad_label.data(), device.index);
  if constexpr (labels) {
    const std::int64_t bad = first_bad_label.to(Device::cpu()).item();  // waits for the forward: the one read-back
    if (bad >= 0) {
      std::int64_t label = 0;
      cuda::copy_device_to_host(&label, targets.data() + bad, sizeof label, device.index);
      throw_label_out_of_range(logits.shape(), bad, label);
    }
  }
  return loss;
}

template <class T, class Targets>
std::tuple<Tensor<T>, Tensor<T>> device_cross_entropy_grads(const CrossEntropySaved<T, Targets>& s,
                                                            const Tensor<T>& dy, bool need_dlogits,
                                                            bool need_dtargets) {
  const Device device = dy.device();
  Tensor<T> dlogits = need_dlogits ? Tensor<T>(s.logits.shape(), device) : Tensor<T>();
  Tensor<T> dtargets = need_dtargets ? Tensor<T>(s.logits.shape(), device) : Tensor<T>();
  cuda::cross_entropy_backward({dtype_v<T>, s.rows, s.classes}, s.logits.data(), device_targets(s.targets),
                               s.device_lse.data(), dy.data(), dlogits.data(), dtargets.data(), device.index);
  return {dlogits, dtargets};
}

}  // namespace

namespace {

// The losses of primitive ops, for the recorded backward (create_graph).
template <class T> Var<T> soft_cross_entropy(const Var<T>& logits, const Var<T>& targets) {
  using V = detail::Unfused<T>;
  const double rows = static_cast<double>(logits.numel() / logits.shape().dim(-1));
  return (V{sum((V{log_softmax(logits)} * V{targets}).v)} * (-1.0 / rows)).v;
}

// labels [...] of classes as rows of a [..., C] matrix of 0 and 1 (on the cpu).
template <class T> Tensor<T> one_hot(const Tensor<std::int64_t>& labels, const Shape& shape) {
  const Tensor<std::int64_t> host = labels.to(Device::cpu());
  Tensor<T> out = zeros<T>(shape);
  const std::int64_t classes = shape.dim(-1);
  for (std::int64_t r = 0; r < host.numel(); ++r) {
    const std::int64_t label = host.flat(r);
    check(label >= 0 && label < classes, "cross_entropy", "label ", label, " at position ", r, " is not a class in [0, ",
          classes, ")");
    out.flat(r * classes + label) = T(1);
  }
  return out;
}

}  // namespace

template <class T> Var<T> mse_loss(const Var<T>& pred, const Var<T>& target) {
  using C = compute_t<T>;
  const OpScope scope = enter_op("mse_loss", pred, target);
  check(pred.shape() == target.shape(), "mse_loss", "pred has shape ", pred.shape(), " but target has shape ",
        target.shape(), "; they must match exactly");
  check_same_device("mse_loss", pred, target);
  return custom_op<MseSaved<T>>(
      "mse_loss",
      [](MseSaved<T>& s, const Tensor<T>& p, const Tensor<T>& t) {
        s.pred = p;
        s.target = t;
        return by_device(
            "mse_loss", p.device(),
            [&] {
              const auto total =
                  detail::blocked_row_sum<C>(p.numel(), 1, 3, [&](std::int64_t begin, std::int64_t end, C* partial) {
                    for (std::int64_t i = begin; i < end; ++i) {
                      const C d = static_cast<C>(p.flat(i)) - static_cast<C>(t.flat(i));
                      partial[0] += d * d;
                    }
                  });
              return mean_of<T>(total[0], p.numel());
            },
            [&](auto) { return device_mse_loss(p, t); });
      },
      [](const MseSaved<T>& s, const NeedsGrad& needs, const Tensor<T>& dy) {
        return by_device(
            "mse_loss", dy.device(),
            [&] {
              const C scale = C(2) * static_cast<C>(dy.flat(0)) / static_cast<C>(s.pred.numel());
              Tensor<T> dpred, dtarget;
              if (needs[0]) dpred = scaled_difference(s, scale);
              if (needs[1]) dtarget = scaled_difference(s, -scale);
              return std::tuple{dpred, dtarget};
            },
            [&](auto) { return device_mse_grads(s, dy, needs); });
      },
      graph_backward([](const MseSaved<T>&, const NeedsGrad&, const std::tuple<Var<T>, Var<T>>& in,
                        const Var<T>& dy) {
        const std::vector<Var<T>> g = composite_vjp<T>(
            [](const std::vector<Var<T>>& v) {
              using V = detail::Unfused<T>;
              return mean(square(V{v[0]} - V{v[1]}).v);
            },
            {std::get<0>(in), std::get<1>(in)}, dy);
        return std::tuple{g[0], g[1]};
      }),
      pred, target);
}

template <class T> Var<T> cross_entropy(const Var<T>& logits, const Tensor<std::int64_t>& labels) {
  using Saved = CrossEntropySaved<T, Tensor<std::int64_t>>;
  const OpScope scope = enter_op("cross_entropy", logits);
  check_defined(labels, "cross_entropy", "labels");
  check_same_device("cross_entropy", logits, labels);
  check_label_shape(logits.shape(), labels);
  if (labels.device().is_cpu()) check_label_values(logits.shape(), labels);
  return custom_op<Saved>(
      "cross_entropy",
      [&](Saved& s, const Tensor<T>& x) {
        return by_device(
            "cross_entropy", x.device(), [&] { return cross_entropy_forward(s, x, labels); },
            [&](auto) { return device_cross_entropy_forward(s, x, labels); });
      },
      [](const Saved& s, const NeedsGrad&, const Tensor<T>& dy) {
        return by_device(
            "cross_entropy", dy.device(),
            [&] {
              return cross_entropy_dlogits(s, static_cast<compute_t<T>>(dy.flat(0)) /
                                                  static_cast<compute_t<T>>(s.rows));
            },
            [&](auto) { return std::get<0>(device_cross_entropy_grads(s, dy, true, false)); });
      },
      graph_backward([labels](const Saved&, const NeedsGrad&, const std::tuple<Var<T>>& in, const Var<T>& dy) {
        const Var<T>& x = std::get<0>(in);
        const Var<T> targets = constant(one_hot<T>(labels, x.shape()).to(x.device()));
        return composite_vjp<T>([&](const std::vector<Var<T>>& v) { return soft_cross_entropy(v[0], targets); },
                                {x}, dy)[0];
      }),
      logits);
}

template <class T> Var<T> cross_entropy(const Var<T>& logits, const Var<T>& target_probs) {
  using Saved = CrossEntropySaved<T, Tensor<T>>;
  const OpScope scope = enter_op("cross_entropy", logits, target_probs);
  check_logits(logits.shape());
  check(target_probs.shape() == logits.shape(), "cross_entropy", "target_probs has shape ", target_probs.shape(),
        " but logits have shape ", logits.shape(), "; soft targets must match logits exactly");
  check_same_device("cross_entropy", logits, target_probs);
  return custom_op<Saved>(
      "cross_entropy",
      [](Saved& s, const Tensor<T>& x, const Tensor<T>& q) {
        return by_device(
            "cross_entropy", x.device(), [&] { return cross_entropy_forward(s, x, q); },
            [&](auto) { return device_cross_entropy_forward(s, x, q); });
      },
      [](const Saved& s, const NeedsGrad& needs, const Tensor<T>& dy) {
        return by_device(
            "cross_entropy", dy.device(),
            [&] {
              const auto scale = static_cast<compute_t<T>>(dy.flat(0)) / static_cast<compute_t<T>>(s.rows);
              Tensor<T> dlogits, dtargets;
              if (needs[0]) dlogits = cross_entropy_dlogits(s, scale);
              if (needs[1]) dtargets = cross_entropy_dtargets(s, scale);
              return std::tuple{dlogits, dtargets};
            },
            [&](auto) { return device_cross_entropy_grads(s, dy, needs[0], needs[1]); });
      },
      graph_backward([](const Saved&, const NeedsGrad&, const std::tuple<Var<T>, Var<T>>& in, const Var<T>& dy) {
        const std::vector<Var<T>> g = composite_vjp<T>(
            [](const std::vector<Var<T>>& v) { return soft_cross_entropy(v[0], v[1]); },
            {std::get<0>(in), std::get<1>(in)}, dy);
        return std::tuple{g[0], g[1]};
      }),
      logits, target_probs);
}

#define TAPEGRAD_INSTANTIATE_LOSS(T)                                            \
  template Var<T> mse_loss<T>(const Var<T>&, const Var<T>&);                    \
  template Var<T> cross_entropy<T>(const Var<T>&, const Tensor<std::int64_t>&); \
  template Var<T> cross_entropy<T>(const Var<T>&, const Var<T>&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_LOSS)

}  // namespace tapegrad
