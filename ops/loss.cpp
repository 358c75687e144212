// Losses in C = compute_t<T>, each a rank-0 mean rounded to T once. Totals are summed over fixed blocks
// (ops/row_sum.hpp), so they do not depend on the thread count.
//
//   mse_loss:       L = Σ (p - t)² / n                 dp = 2 (p - t) / n · dL,   dt = -dp
//   cross_entropy:  logits x seen as [N, C]; q the target distribution of each row (one-hot of the label, or the
//                   soft target); lse = log Σ_c exp(x_c) per row (ops/softmax_stats.hpp), softmax = exp(x - lse)
//                   L  = Σ_rows Σ_c q_c (lse - x_c) / N
//                   dx = (softmax · Σ_c q_c - q) / N · dL        (labels: (softmax - onehot) / N · dL)
//                   dq = (lse - x) / N · dL                      (soft targets only)
//
// Saved: the inputs (they share storage with them) and, for cross_entropy, lse per row in C, from which backward
// recomputes softmax in full precision.
#include "ops/loss.hpp"

#include <string>
#include <tuple>
#include <vector>

#include "autodiff/custom_op.hpp"
#include "ops/row_sum.hpp"
#include "ops/softmax_stats.hpp"

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
  std::vector<compute_t<T>> lse;  // per row
};

template <class T, class Targets>
Tensor<T> cross_entropy_forward(CrossEntropySaved<T, Targets>& s, const Tensor<T>& logits, const Targets& targets) {
  using C = compute_t<T>;
  const detail::AxisLayout rows = detail::axis_layout(logits.shape(), -1, "cross_entropy");
  s.logits = logits;
  s.targets = targets;
  s.rows = rows.outer;
  s.classes = rows.n;
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

void check_labels(const Shape& logits, const Tensor<std::int64_t>& labels) {
  check_logits(logits);
  const Shape leading(logits.dims().first(static_cast<std::size_t>(logits.rank() - 1)));
  check(labels.shape() == leading, "cross_entropy", "labels have shape ", labels.shape().str(), " but logits of shape ",
        logits.str(), " need labels of shape ", leading.str());
  const std::int64_t classes = logits.dim(-1);
  for (std::int64_t i = 0; i < labels.numel(); ++i) {
    const std::int64_t label = labels.flat(i);
    if (label < 0 || label >= classes) {  // message built only on failure: this runs once per label
      check(false, "cross_entropy", "label ", label, " at position ", position(leading, i), " is out of range for ",
            classes, " classes (logits of shape ", logits.str(), ")");
    }
  }
}

}  // namespace

template <class T> Var<T> mse_loss(const Var<T>& pred, const Var<T>& target) {
  using C = compute_t<T>;
  check(pred.shape() == target.shape(), "mse_loss", "pred has shape ", pred.shape().str(), " but target has shape ",
        target.shape().str(), "; they must match exactly");
  check_cpu_inputs("mse_loss", pred, target);  // no GPU path yet
  return custom_op<MseSaved<T>>(
      "mse_loss",
      [](MseSaved<T>& s, const Tensor<T>& p, const Tensor<T>& t) {
        s.pred = p;
        s.target = t;
        const auto total =
            detail::blocked_row_sum<C>(p.numel(), 1, 3, [&](std::int64_t begin, std::int64_t end, C* partial) {
              for (std::int64_t i = begin; i < end; ++i) {
                const C d = static_cast<C>(p.flat(i)) - static_cast<C>(t.flat(i));
                partial[0] += d * d;
              }
            });
        return mean_of<T>(total[0], p.numel());
      },
      [](const MseSaved<T>& s, const NeedsGrad& needs, const Tensor<T>& dy) {
        const C scale = C(2) * static_cast<C>(dy.flat(0)) / static_cast<C>(s.pred.numel());
        Tensor<T> dpred, dtarget;
        if (needs[0]) dpred = scaled_difference(s, scale);
        if (needs[1]) dtarget = scaled_difference(s, -scale);
        return std::tuple{dpred, dtarget};
      },
      pred, target);
}

template <class T> Var<T> cross_entropy(const Var<T>& logits, const Tensor<std::int64_t>& labels) {
  using Saved = CrossEntropySaved<T, Tensor<std::int64_t>>;
  check_same_device("cross_entropy", logits, labels);
  check_on_cpu("cross_entropy", 0, logits.device());  // no GPU path yet
  check_labels(logits.shape(), labels);
  return custom_op<Saved>(
      "cross_entropy", [&](Saved& s, const Tensor<T>& x) { return cross_entropy_forward(s, x, labels); },
      [](const Saved& s, const NeedsGrad&, const Tensor<T>& dy) {
        return cross_entropy_dlogits(s, static_cast<compute_t<T>>(dy.flat(0)) / static_cast<compute_t<T>>(s.rows));
      },
      logits);
}

template <class T> Var<T> cross_entropy(const Var<T>& logits, const Var<T>& target_probs) {
  using Saved = CrossEntropySaved<T, Tensor<T>>;
  check_logits(logits.shape());
  check(target_probs.shape() == logits.shape(), "cross_entropy", "target_probs has shape ", target_probs.shape().str(),
        " but logits have shape ", logits.shape().str(), "; soft targets must match logits exactly");
  check_cpu_inputs("cross_entropy", logits, target_probs);  // no GPU path yet
  return custom_op<Saved>(
      "cross_entropy", [](Saved& s, const Tensor<T>& x, const Tensor<T>& q) { return cross_entropy_forward(s, x, q); },
      [](const Saved& s, const NeedsGrad& needs, const Tensor<T>& dy) {
        const auto scale = static_cast<compute_t<T>>(dy.flat(0)) / static_cast<compute_t<T>>(s.rows);
        Tensor<T> dlogits, dtargets;
        if (needs[0]) dlogits = cross_entropy_dlogits(s, scale);
        if (needs[1]) dtargets = cross_entropy_dtargets(s, scale);
        return std::tuple{dlogits, dtargets};
      },
      logits, target_probs);
}

#define TAPEGRAD_INSTANTIATE_LOSS(T)                                            \
  template Var<T> mse_loss<T>(const Var<T>&, const Var<T>&);                    \
  template Var<T> cross_entropy<T>(const Var<T>&, const Tensor<std::int64_t>&); \
  template Var<T> cross_entropy<T>(const Var<T>&, const Var<T>&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_LOSS)

}  // namespace tapegrad
