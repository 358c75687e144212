// Losses on the GPU, forward and backward: mse_loss and cross_entropy (class indices or soft targets). Host
// launchers in plain C++ (see tensor/gpu/backend.hpp for how ops call them); the maths is the CPU's (ops/loss.cpp), in the
// compute type C of the dtype (f32 for f32/bf16/f16, f64 for f64). Each loss is a mean, summed in C in a fixed
// order (the same bits on every run) and rounded to the dtype once. Every pointer is device memory of `device`,
// contiguous, of the dtype unless said otherwise; work is queued on the device's current stream.
#pragma once

#include <cstdint>

#include "tapegrad/tensor/core/dtype_tag.hpp"

namespace tapegrad::cuda {

// ---- mse_loss -----------------------------------------------------------------------------------------------------

// The scratch mse_loss_forward needs, in elements of C: a partial sum per block of elements (a function of n only).
std::int64_t mse_loss_partials(std::int64_t n);
// loss (one element) = Σ (pred - target)² / n over n elements.
void mse_loss_forward(DType dtype, std::int64_t n, const void* pred, const void* target, void* partials, void* loss,
                      int device);
// dpred = 2 (pred - target) / n · dloss and dtarget = -dpred, each unless null; dloss is one element.
void mse_loss_backward(DType dtype, std::int64_t n, const void* pred, const void* target, const void* dloss,
                       void* dpred, void* dtarget, int device);

// ---- cross_entropy ------------------------------------------------------------------------------------------------

// Logits [rows, classes] of `dtype`.
struct CrossEntropyProblem {
  DType dtype = DType::f32;
  std::int64_t rows = 0, classes = 0;
};

// The target distribution q of each row: exactly one of
struct CrossEntropyTargets {
  const std::int64_t* labels = nullptr;  // class indices [rows] (q is one-hot), or
  const void* probs = nullptr;           // soft targets [rows, classes] of the logits' dtype
};

// loss (one element) = Σ_rows Σ_c q_c (lse - x_c) / rows, fused with lse = log Σ_c exp(x_c) per row (C[rows], kept
// for the backward). row_loss: scratch of C[rows]. With labels, first_bad_label (one element) receives the index
// of the first label outside [0, classes), or -1 when there is none: read it back before trusting the loss.
void cross_entropy_forward(const CrossEntropyProblem& problem, const void* logits, const CrossEntropyTargets& targets,
                           void* lse, void* row_loss, void* loss, std::int64_t* first_bad_label, int device);
// dlogits = (softmax(x) · Σ_c q_c - q) / rows · dloss, and with soft targets dtargets = (lse - x) / rows · dloss;
// each unless null. dloss is one element.
void cross_entropy_backward(const CrossEntropyProblem& problem, const void* logits, const CrossEntropyTargets& targets,
                            const void* lse, const void* dloss, void* dlogits, void* dtargets, int device);

}  // namespace tapegrad::cuda
