#include "tapegrad/ops/layernorm_mlp_gpu_fp8.hpp"

#include <utility>

#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/cuda/fp8_quantize.hpp"
#include "tapegrad/cuda/strided_copy.hpp"
#include "tapegrad/ops/fp8_operands.hpp"
#include "tapegrad/tensor/factories.hpp"
#include "tapegrad/tensor/gpu/fill.hpp"

namespace tapegrad::detail {

namespace {

constexpr int scale_inv_field = 0, scale_field = 1, amax_field = 2, fields = 4;

DType dtype_of(fp8::Format format) { return format == fp8::Format::e4m3 ? DType::f8e4m3 : DType::f8e5m2; }

std::shared_ptr<Storage> bytes_on(Device device, std::int64_t bytes) {
  return Storage::allocate(static_cast<std::size_t>(bytes), device);
}

}  // namespace

DeviceMlpFp8::DeviceMlpFp8(const Fp8Quantization& q, Device device) : q_(q), device_(device) {
  if (!q_.state) {  // current scaling: each quantization makes its own (nothing to upload, so a graph can capture it)
    scalars_ = Tensor<float>(Shape{fp8::role_count, fields}, device);
    return;
  }
  // Delayed scaling: the step's scales from the state (which first ends the previous step); zero amaxes.
  if (q_.state->pending()) q_.state->update();
  Tensor<float> host = zeros<float>({fp8::role_count, fields});
  for (fp8::Role role : fp8::roles) {
    const float scale = q_.state->scale(role);
    host.flat(static_cast<std::int64_t>(role) * fields + scale_inv_field) = 1.0f / scale;
    host.flat(static_cast<std::int64_t>(role) * fields + scale_field) = scale;
  }
  scalars_ = host.to(device);
}

float* DeviceMlpFp8::slot(fp8::Role role, int field) const {
  return const_cast<float*>(scalars_.data()) + static_cast<std::int64_t>(role) * fields + field;
}

Fp8Codes DeviceMlpFp8::codes_for(fp8::Role role, std::int64_t rows, std::int64_t cols, bool codes,
                                 bool transposed) const {
  Fp8Codes out{.format = dtype_of(fp8::format_of(formats_of(q_.recipe), role)),
               .codes = nullptr,
               .transposed = nullptr,
               .rows = rows,
               .cols = cols,
               .transposed_ld = (rows + 15) / 16 * 16,
               .scale_inv = slot(role, scale_inv_field)};
  if (codes) out.codes = bytes_on(device_, rows * cols);
  if (transposed) out.transposed = bytes_on(device_, cols * out.transposed_ld);
  return out;
}

void DeviceMlpFp8::record_later(fp8::Role role) const {
  if (!host_scalars_ || host_scalars_->defined()) host_scalars_ = std::make_shared<Tensor<float>>();
  q_.state->record_later(role, [host = host_scalars_, scalars = scalars_, role] {
    if (!host->defined()) *host = scalars.to(Device::cpu());
    return host->flat(static_cast<std::int64_t>(role) * fields + amax_field);
  });
}

DeviceMlpFp8::Target DeviceMlpFp8::target(fp8::Role role, std::int64_t rows, std::int64_t cols, bool first,
                                           bool codes, bool transposed) const {
  check(scales_ahead() || !first, "layernorm_mlp", "current scaling has no scale for ", fp8::role_name(role),
        " before its tensor exists");
  const bool record = first && q_.state;
  if (record) record_later(role);
  return {codes_for(role, rows, cols, codes, transposed), slot(role, scale_field),
          record ? slot(role, amax_field) : nullptr};
}

Fp8Codes DeviceMlpFp8::quantize(fp8::Role role, DType dtype, const void* x, std::int64_t rows, std::int64_t cols,
                                bool codes, bool transposed, bool first) const {
  const Fp8Codes out = codes_for(role, rows, cols, codes, transposed);
  float* amax = slot(role, amax_field);
  const bool record = first && q_.state;
  if (first && !q_.state) {  // current scaling: the role's scale from x's own amax
    cuda::fill(DType::f32, amax, 1, 0.0, device_.index);
    cuda::fp8_amax(dtype, x, rows * cols, amax, device_.index);
    cuda::fp8_current_scale(amax, out.format, slot(role, scale_field), slot(role, scale_inv_field), device_.index);
  }
  cuda::fp8_quantize({.dtype = dtype,
                      .x = x,
                      .rows = rows,
                      .cols = cols,
                      .format = out.format,
                      .scale = slot(role, scale_field),
                      .codes = codes ? out.codes->data() : nullptr,
                      .transposed = transposed ? out.transposed->data() : nullptr,
                      .transposed_ld = out.transposed_ld,
                      .amax = record ? amax : nullptr},
                     device_.index);
  if (record) record_later(role);  // read when the state's step ends: the step does not wait for the device
  return out;
}

void DeviceMlpFp8::product(const Fp8Codes& a, Fp8Layout a_layout, const Fp8Codes& b, Fp8Layout b_layout,
                           std::int64_t M, std::int64_t N, std::int64_t K, DType out_dtype, void* out,
                           const void* bias, double beta, bool forward) const {
  const auto operand = [](const Fp8Codes& x, Fp8Layout layout) {
    return layout == Fp8Layout::codes ? std::pair{x.codes->data(), x.cols}
                                      : std::pair{x.transposed->data(), x.transposed_ld};
  };
  const auto [a_data, a_ld] = operand(a, a_layout);
  const auto [b_data, b_ld] = operand(b, b_layout);
  // cuBLASLt's FP8 kernels add no f32 bias (cuda/blaslt.hpp): the bias becomes C's initial rows instead.
  if (bias && out_dtype == DType::f32 && M > 0) {
    cuda::strided_copy(DType::f32, bias, out, {{M, 0, N}, {N, 1, 1}}, device_.index);
    bias = nullptr;
    beta = 1.0;
  }
  const cuda::GemmFp8 fp8{.a = a.format,
                          .b = b.format,
                          .a_scale_inv = a.scale_inv,
                          .b_scale_inv = b.scale_inv,
                          .fast_accumulation = forward && q_.fast_forward_accumulation};
  cuda::gemm({.dtype = out_dtype,
              .M = M,
              .N = N,
              .K = K,
              .a = {a_data, a_ld, 0, false},
              .b = {b_data, b_ld, 0, true},
              .c = {out, N, 0},
              .beta = beta,
              .bias = bias,
              .fp8 = &fp8},
             device_.index);
}

}  // namespace tapegrad::detail
