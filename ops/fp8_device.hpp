// FP8 quantization on the GPU (layernorm_mlp's, fp8_dense's): the CPU's recipes (ops/fp8_operands.hpp) with the
// quantized tensors kept as fp8 codes on the device and multiplied by cuBLASLt's FP8 kernels. Internal: included by
// ops/*_gpu.cpp only.
//
// A step's scales live on the device, per role: delayed scaling's come from its state when the step starts; current
// scaling makes each from the tensor's amax there (no wait for the device). Delayed scaling's amaxes are taken by the
// quantization's own pass and reach the state when the step ends (ScalingState::record_later). Hopper's FP8 kernels
// read both operands along the inner dimension, so a tensor that one product sums over its columns and another over
// its rows is written twice by one pass: its codes and their transpose (TransformerEngine's cast + transpose).
// Block scaling's tiles follow each product's inner dimension, so the two layouts have scales of their own, made by
// the same pass (cuda/fp8_block_quantize.hpp), and the products read them in cuBLASLt's block-scaled modes.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <type_traits>
#include <variant>

#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/ops/device_tensors.hpp"
#include "tapegrad/ops/fp8.hpp"
#include "tapegrad/tensor/storage.hpp"
#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad::detail {

// The fp8 codes of one [rows, cols] row-major matrix on the device, its transpose [cols, transposed_ld] (zero past
// `rows`, which it rounds up to 16, with block scaling to whole tiles of 128), or both, and the dequantization scale
// its role has in the step; with block scaling, each layout's tiles' scales instead (laid out as cuda/blaslt.hpp's
// `scaling` says), and the codes' rows `code_rows` (zero past `rows`): cuBLASLt's block-scaled products read an
// operand's 1×128 scales in rows of exactly its row count, which must keep them 16-byte aligned, a multiple of 4.
struct Fp8Codes {
  DType format = DType::f8e4m3;
  std::shared_ptr<Storage> codes, transposed;
  std::int64_t rows = 0, cols = 0, code_rows = 0, transposed_ld = 0;
  const float* scale_inv = nullptr;
  Tensor<float> scalars;  // what scale_inv points into, kept with the codes (a weight cache keeps them past the step)
  cuda::Fp8Scaling scaling = cuda::Fp8Scaling::tensor;
  std::shared_ptr<Storage> scales, transposed_scales;
};

// Which of an input's two layouts a product reads.
enum class Fp8Layout : bool { codes, transposed };

class DeviceFp8 {
 public:
  // Starts op's step on `device` (delayed scaling first ends the state's previous one), for a recipe and x's dtype
  // that check_fp8_on_device (ops/layernorm_mlp_check.hpp) has let through. `op` names it in errors.
  DeviceFp8(std::string_view op, const Fp8Quantization& q, Device device);
  const Fp8Quantization& quantization() const { return q_; }

  // x [rows, cols] (f32, bf16 or f16 on the device) quantized for `role`, in the layouts asked for. The step's first
  // quantization of a tensor (`first`) makes the role's scale from its amax (current scaling) or records its amax
  // (delayed scaling); a later one (the backward's, a recompute's) uses the scale the step has. Block scaling makes
  // every tile's scale from the tile itself.
  Fp8Codes quantize(fp8::Role role, DType dtype, const void* x, std::int64_t rows, std::int64_t cols, bool codes,
                    bool transposed, bool first) const;

  // Delayed scaling knows each role's scale before its tensor exists: the kernel that makes a tensor can then write
  // its codes itself (target), in place of the tensor and a quantization pass.
  bool scales_ahead() const { return q_.state != nullptr; }
  // For such a kernel: the codes [rows, cols] of `role` in the layouts asked for, the scale to quantize by, and where
  // `first` (as for quantize) the amax to merge |x| into, recorded as quantize records it (else null). A later
  // quantization of a role (not `first`) has the step's scale under every recipe.
  struct Target {
    Fp8Codes codes;
    const float* scale = nullptr;
    float* amax = nullptr;
  };
  Target target(fp8::Role role, std::int64_t rows, std::int64_t cols, bool first, bool codes = true,
                bool transposed = false) const;

  // out [M, N] (`out_dtype`: f32, bf16 or f16) = beta · out + A · Bᵀ (+ bias on every row, in out_dtype, unless
  // null) where A [M, K] and B [N, K] are the given layouts of a and b, accumulated in f32 (a forward product with
  // fewer bits between partial sums where the quantization's fast_forward_accumulation asks for it, with one scale
  // per tensor).
  void product(const Fp8Codes& a, Fp8Layout a_layout, const Fp8Codes& b, Fp8Layout b_layout, std::int64_t M,
               std::int64_t N, std::int64_t K, DType out_dtype, void* out, const void* bias, double beta,
               bool forward) const;

 private:
  bool tiled() const { return std::holds_alternative<fp8::BlockScaling>(q_.recipe); }
  float* slot(fp8::Role role, int field) const;
  Fp8Codes codes_for(fp8::Role role, std::int64_t rows, std::int64_t cols, bool codes, bool transposed) const;
  // Delayed scaling: the state reads role's amax from the device when its step ends.
  void record_later(fp8::Role role) const;

  std::string_view op_;
  Fp8Quantization q_;
  Device device_;
  // [role_count, 4]: scale_inv (16-byte aligned, as cuBLASLt reads it), scale, amax, unused; none with block scaling
  Tensor<float> scalars_;
  // Delayed scaling: the host's copy of scalars_ that the amaxes recorded since the last copy share: the state's
  // step end reads the device once, not once per amax.
  mutable std::shared_ptr<Tensor<float>> host_scalars_;
};

// n rounded up to the size FP8 products need of an operand's rows and inner dimension: 16 codes (16-byte rows),
// with block scaling whole tiles of 128.
inline std::int64_t fp8_padded(const fp8::Recipe& recipe, std::int64_t n) {
  const std::int64_t v = std::holds_alternative<fp8::BlockScaling>(recipe) ? 128 : 16;
  return (n + v - 1) / v * v;
}

// A weight [shape] (in P) padded to `padded` and quantized in both layouts, from P itself where the kernels read it
// (as the CPU quantizes it), f64 by way of f32 (which is what the CPU's quantization reads of it); with a weight
// cache, the copy it holds of w.
template <class P>
Fp8Codes quantized_weight(const DeviceFp8& q, fp8::Role role, const Tensor<P>& w, const Shape& shape,
                          const Shape& padded) {
  const auto quantize = [&] {
    using Q = std::conditional_t<std::is_same_v<P, double>, float, P>;
    const Tensor<Q> wp = resized(cast<Q>(w).reshape(shape), padded);
    const std::int64_t rows = padded.dim(0), cols = padded.numel() / rows;
    return q.quantize(role, dtype_v<Q>, wp.data(), rows, cols, true, true, true);
  };
  const auto& cache = q.quantization().weight_cache;
  return cache ? cache->copy<Fp8Codes>(role, w, padded, quantize) : quantize();
}

// A weight's gradient Aᵀ · B as P [shape] from the transposed codes of A [M, K1] and B [M, K2] (whose inner size is M
// padded with zeros): summed in f32 into [K1, K2] (of `padded_shape`), then cropped (onto `crops` where given).
template <class P, class T>
Tensor<P> fp8_weight_gradient(const DeviceFp8& q, const Fp8Codes& a, const Fp8Codes& b, const Shape& shape,
                              const Shape& padded_shape, Device device, Resizes<T>* crops = nullptr) {
  ParamGrad<P, T> out(shape, padded_shape, device);
  q.product(a, Fp8Layout::transposed, b, Fp8Layout::transposed, a.cols, b.cols, a.transposed_ld,
            ParamGrad<P, T>::wide ? dtype_v<compute_t<T>> : dtype_v<T>, out.data(), nullptr, 0.0, false);
  return out.result(crops);
}

}  // namespace tapegrad::detail
