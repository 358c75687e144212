// mse_loss and cross_entropy (interface: cuda/loss.hpp; the CPU's formulas: ops/loss.cpp).
//
// Every loss is a mean reduced in two fixed stages: per-block (mse) or per-row (cross_entropy) sums in C, then
// one block adds those in a fixed order (mean_kernel). Block sizes depend on the problem's shape only, so a loss is
// bitwise the same on every run and every GPU model.
//
// cross_entropy: a row group per row (cuda/rows.cuh), fused: the row's max and Σ exp(x - max) (as softmax),
// lse = max + log(sum), then the row's Σ_c q_c (lse - x_c); lse is saved per row, from which the backward recomputes
// softmax in C. Labels are checked on the device: a label outside [0, classes) matches no class (adding nothing)
// and its row index goes to first_bad_label through an integer atomicMin, so the smallest such index wins, as the
// CPU's first-found (ops/loss.cpp reads it back and throws the CPU's message).
#include "tapegrad/cuda/loss.hpp"

#include <algorithm>
#include <type_traits>

#include "tapegrad/cuda/elementwise.hpp"
#include "tapegrad/cuda/softmax_rows.cuh"

namespace tapegrad::cuda {

namespace {

using rows::Sum;

// ---- the mean ------------------------------------------------------------------------------------------------------

constexpr int mean_threads = 1024;

// *loss = Σ values[0, count) / divisor, rounded to S: thread t adds values t, t + 1024, ... in order, then the
// block's fixed tree.
template <class S>
__global__ void __launch_bounds__(mean_threads)
    mean_kernel(const compute_of<S>* values, std::int64_t count, compute_of<S> divisor, S* loss) {
  using C = compute_of<S>;
  C sum = 0;
  for (std::int64_t i = threadIdx.x; i < count; i += mean_threads) sum += values[i];
  sum = rows::RowGroup<mean_threads>::reduce(sum, Sum{});
  if (threadIdx.x == 0) *loss = from_compute<S>(sum / divisor);
}

template <class S>
void launch_mean(const Launch& launch, const compute_of<S>* values, std::int64_t count, compute_of<S> divisor,
                 S* loss) {
  mean_kernel<S><<<1, mean_threads, 0, launch.stream()>>>(values, count, divisor, loss);
  TAPEGRAD_CUDA_CHECK_LAUNCH();
}

// ---- mse_loss -----------------------------------------------------------------------------------------------------

constexpr int mse_threads = 256;

// Elements per partial: at least 16 per thread, and at most 1024 partials.
std::int64_t mse_chunk(std::int64_t n) { return std::max<std::int64_t>(mse_threads * 16, (n + 1023) / 1024); }

template <class S>
__global__ void __launch_bounds__(mse_threads) mse_partials_kernel(const S* pred, const S* target, std::int64_t n,
                                                                   std::int64_t chunk, compute_of<S>* partials) {
  using C = compute_of<S>;
  const std::int64_t begin = std::int64_t{blockIdx.x} * chunk;
  const std::int64_t end = begin + chunk < n ? begin + chunk : n;
  C sum = 0;
  for (std::int64_t i = begin + threadIdx.x; i < end; i += mse_threads) {
    const C d = to_compute<C>(pred[i]) - to_compute<C>(target[i]);
    sum += d * d;
  }
  sum = rows::RowGroup<mse_threads>::reduce(sum, Sum{});
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// ---- cross_entropy ------------------------------------------------------------------------------------------------

// Class indices: q is 1 at the row's label and 0 elsewhere; a label outside [0, classes) matches no class.
struct Labels {
  const std::int64_t* labels;

  template <int V, class C> __device__ void load(std::int64_t r, std::int64_t q, C (&out)[V]) const {
    const std::int64_t label = labels[r];
    for (int k = 0; k < V; ++k) out[k] = q * V + k == label ? C(1) : C(0);
  }
  // Reports row r's label when it is out of range.
  __device__ void check(std::int64_t r, std::int64_t classes, unsigned long long* first_bad) const {
    if (labels[r] < 0 || labels[r] >= classes) atomicMin(first_bad, static_cast<unsigned long long>(r));
  }
};

// Soft targets: q is row r of probs.
template <class S> struct Probs {
  const S* probs;
  std::int64_t classes;

  template <int V, class C> __device__ void load(std::int64_t r, std::int64_t q, C (&out)[V]) const {
    rows::load(probs + r * classes, q, out);
  }
  __device__ void check(std::int64_t, std::int64_t, unsigned long long*) const {}
};

template <class S> struct CrossEntropyParams {
  using C = compute_of<S>;
  const S* logits = nullptr;
  std::int64_t rows = 0, classes = 0;
  C* lse = nullptr;                         // written by the forward, read by the backward
  C* row_loss = nullptr;                    // forward only
  unsigned long long* first_bad = nullptr;  // forward with labels only
  const S* dloss = nullptr;                 // backward only
  S* dlogits = nullptr;                     // backward: each null when not wanted
  S* dtargets = nullptr;
};

// The params that forward and backward share.
template <class S>
CrossEntropyParams<S> cross_entropy_params(const CrossEntropyProblem& problem, const void* logits, const void* lse) {
  CrossEntropyParams<S> p;
  p.logits = static_cast<const S*>(logits);
  p.rows = problem.rows;
  p.classes = problem.classes;
  p.lse = static_cast<compute_of<S>*>(const_cast<void*>(lse));  // the backward's is const: it only reads it
  return p;
}

template <class S, class Config, class Targets>
__global__ void __launch_bounds__(Config::block_threads)
    cross_entropy_forward_kernel(CrossEntropyParams<S> p, Targets targets) {
  using C = compute_of<S>;
  constexpr int V = Config::V;
  Config::for_each_row(p.rows, [&](std::int64_t r) {
    const S* x = p.logits + r * p.classes;
    const auto stats = rows::softmax_stats<Config>(x, p.classes);
    const C lse = stats.max + rows::log_of(stats.sum);
    C loss = 0;
    Config::for_each_pack(p.classes, [&](std::int64_t q) {
      C xv[V], qv[V];
      rows::load(x, q, xv);
      targets.load(r, q, qv);
      // A class with no target mass adds nothing, even where its logit is -inf (0 · inf would be NaN).
      for (int k = 0; k < V; ++k) {
        if (qv[k] != C(0)) loss += qv[k] * (lse - xv[k]);
      }
    });
    loss = Config::reduce(loss, Sum{});
    if (Config::lane() == 0) {
      p.lse[r] = lse;
      p.row_loss[r] = loss;
      targets.check(r, p.classes, p.first_bad);
    }
  });
}

template <class S, class Config, class Targets>
__global__ void __launch_bounds__(Config::block_threads)
    cross_entropy_backward_kernel(CrossEntropyParams<S> p, Targets targets) {
  using C = compute_of<S>;
  constexpr int V = Config::V;
  const C scale = to_compute<C>(*p.dloss) / static_cast<C>(p.rows);
  Config::for_each_row(p.rows, [&](std::int64_t r) {
    const C lse = p.lse[r];
    C mass = 0;  // Σ_c q_c
    if (p.dlogits) {
      Config::for_each_pack(p.classes, [&](std::int64_t q) {
        C qv[V];
        targets.load(r, q, qv);
        for (int k = 0; k < V; ++k) mass += qv[k];
      });
      mass = Config::reduce(mass, Sum{});
    }
    Config::for_each_pack(p.classes, [&](std::int64_t q) {
      C xv[V], qv[V], out[V];
      rows::load(p.logits + r * p.classes, q, xv);
      if (p.dlogits) {
        targets.load(r, q, qv);
        for (int k = 0; k < V; ++k) out[k] = (rows::exp_of(xv[k] - lse) * mass - qv[k]) * scale;
        rows::store(p.dlogits + r * p.classes, q, out);
      }
      if (p.dtargets) {
        for (int k = 0; k < V; ++k) out[k] = (lse - xv[k]) * scale;
        rows::store(p.dtargets + r * p.classes, q, out);
      }
    });
  });
}

// Calls run(targets) with the kernels' view of `targets`.
template <class S, class Run>
void with_targets(const CrossEntropyTargets& targets, std::int64_t classes, Run&& run) {
  if (targets.labels) {
    run(Labels{targets.labels});
  } else {
    run(Probs<S>{static_cast<const S*>(targets.probs), classes});
  }
}

// Launches the forward or backward kernel over the rows of p.
template <bool Backward, class S>
void launch_cross_entropy(const Launch& launch, const CrossEntropyParams<S>& p, const CrossEntropyTargets& targets) {
  if (p.rows == 0) return;
  const bool wide = rows::packs_fit<S>(p.classes, {p.logits, targets.probs, p.dlogits, p.dtargets});
  with_targets<S>(targets, p.classes, [&](auto view) {
    using Targets = decltype(view);
    rows::dispatch_rows<S>(p.classes, wide, [&](auto config) {
      using Config = decltype(config);
      const auto kernel = Backward ? cross_entropy_backward_kernel<S, Config, Targets>
                                   : cross_entropy_forward_kernel<S, Config, Targets>;
      kernel<<<rows::row_blocks<Config>(launch, p.rows), Config::block_threads, 0, launch.stream()>>>(p, view);
      TAPEGRAD_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace

std::int64_t mse_loss_partials(std::int64_t n) { return (n + mse_chunk(n) - 1) / mse_chunk(n); }

void mse_loss_forward(DType dtype, std::int64_t n, const void* pred, const void* target, void* partials, void* loss,
                      int device) {
  Launch launch(device);
  dispatch_float(dtype, "mse_loss", [&](auto tag) {
    using S = decltype(tag);
    using C = compute_of<S>;
    const std::int64_t blocks = mse_loss_partials(n);
    if (blocks > 0) {
      mse_partials_kernel<S><<<static_cast<int>(blocks), mse_threads, 0, launch.stream()>>>(
          static_cast<const S*>(pred), static_cast<const S*>(target), n, mse_chunk(n), static_cast<C*>(partials));
      TAPEGRAD_CUDA_CHECK_LAUNCH();
    }
    launch_mean<S>(launch, static_cast<const C*>(partials), blocks, static_cast<C>(n), static_cast<S*>(loss));
  });
}

void mse_loss_backward(DType dtype, std::int64_t n, const void* pred, const void* target, const void* dloss,
                       void* dpred, void* dtarget, int device) {
  if (!dpred && !dtarget) return;
  // An elementwise program, in the CPU's order: d = pred - target and scale = 2 · dloss / n, then d · scale and
  // d · -scale. dloss is input 2, read at every element through stride 0.
  enum : std::uint8_t { d, scale, x };                   // registers
  enum : std::uint8_t { in_pred, in_target, in_dloss };  // inputs
  ElementProgram program;
  auto emit = [&](ElementOp op, std::uint8_t dst, std::uint8_t a, std::uint8_t b = 0, double scalar = 0) {
    program.code[program.size++] = {op, dst, a, b, scalar};
  };
  emit(ElementOp::input, d, in_pred);
  emit(ElementOp::input, x, in_target);
  emit(ElementOp::sub, d, d, x);
  emit(ElementOp::input, scale, in_dloss);
  emit(ElementOp::constant, x, 0, 0, 2.0);
  emit(ElementOp::mul, scale, x, scale);
  emit(ElementOp::constant, x, 0, 0, static_cast<double>(n));
  emit(ElementOp::div, scale, scale, x);
  ElementBuffers buffers;
  if (dpred) {
    emit(ElementOp::mul, x, d, scale);
    emit(ElementOp::store, 0, x);
    buffers.outputs[0] = dpred;
  }
  if (dtarget) {
    emit(ElementOp::neg, scale, scale);
    emit(ElementOp::mul, x, d, scale);
    emit(ElementOp::store, 1, x);
    buffers.outputs[1] = dtarget;
  }
  buffers.inputs[in_pred] = pred;
  buffers.inputs[in_target] = target;
  buffers.inputs[in_dloss] = dloss;
  // One axis of n elements: pred and target step by 1, dloss by 0.
  const ElementLayout layout{.rank = 1, .dims = {n}, .strides = {{1}, {1}, {0}}, .flat = false};
  run_element_program(dtype, device, program, layout, buffers, n);
}

void cross_entropy_forward(const CrossEntropyProblem& problem, const void* logits, const CrossEntropyTargets& targets,
                           void* lse, void* row_loss, void* loss, std::int64_t* first_bad_label, int device) {
  Launch launch(device);
  if (first_bad_label) {  // all bits set: -1, and the largest value for the unsigned atomicMin (also with no rows)
    TAPEGRAD_CUDA_CHECK(cudaMemsetAsync(first_bad_label, 0xff, sizeof(std::int64_t), launch.stream()));
  }
  dispatch_float(problem.dtype, "cross_entropy", [&](auto tag) {
    using S = decltype(tag);
    using C = compute_of<S>;
    CrossEntropyParams<S> p = cross_entropy_params<S>(problem, logits, lse);
    p.row_loss = static_cast<C*>(row_loss);
    p.first_bad = reinterpret_cast<unsigned long long*>(first_bad_label);
    launch_cross_entropy<false>(launch, p, targets);
    launch_mean<S>(launch, p.row_loss, problem.rows, static_cast<C>(problem.rows), static_cast<S*>(loss));
  });
}

void cross_entropy_backward(const CrossEntropyProblem& problem, const void* logits, const CrossEntropyTargets& targets,
                            const void* lse, const void* dloss, void* dlogits, void* dtargets, int device) {
  if (!dlogits && !dtargets) return;
  Launch launch(device);
  dispatch_float(problem.dtype, "cross_entropy", [&](auto tag) {
    using S = decltype(tag);
    CrossEntropyParams<S> p = cross_entropy_params<S>(problem, logits, lse);
    p.dloss = static_cast<const S*>(dloss);
    p.dlogits = static_cast<S*>(dlogits);
    p.dtargets = static_cast<S*>(dtargets);
    launch_cross_entropy<true>(launch, p, targets);
  });
}

}  // namespace tapegrad::cuda
