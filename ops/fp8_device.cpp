#include "tapegrad/ops/fp8_device.hpp"

#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/cuda/fp8_block_quantize.hpp"
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

DeviceFp8::DeviceFp8(std::string_view op, const Fp8Quantization& q, Device device)
    : op_(op), q_(q), device_(device) {
  if (tiled()) return;  // block scaling: each tile's scale lives beside its codes (Fp8Codes), none per role
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

float* DeviceFp8::slot(fp8::Role role, int field) const {
  return const_cast<float*>(scalars_.data()) + static_cast<std::int64_t>(role) * fields + field;
}

Fp8Codes DeviceFp8::codes_for(fp8::Role role, std::int64_t rows, std::int64_t cols, bool codes,
                              bool transposed) const {
  Fp8Codes out;
  out.format = dtype_of(fp8::format_of(formats_of(q_.recipe), role));
  out.rows = rows;
  out.cols = cols;
  out.code_rows = tiled() ? (rows + 3) / 4 * 4 : rows;
  out.transposed_ld = tiled() ? (rows + 127) / 128 * 128 : (rows + 15) / 16 * 16;
  if (codes) out.codes = bytes_on(device_, out.code_rows * cols);
  if (transposed) out.transposed = bytes_on(device_, cols * out.transposed_ld);
  if (!tiled()) {
    out.scale_inv = slot(role, scale_inv_field);
    out.scalars = scalars_;
    return out;
  }
  out.scaling = role == fp8::Role::kernel1 || role == fp8::Role::kernel2 ? cuda::Fp8Scaling::blocks_128x128
                                                                         : cuda::Fp8Scaling::tiles_1x128;
  const auto scales_of = [&](std::int64_t outer, std::int64_t K) {
    return bytes_on(device_, cuda::fp8_scale_shape(out.scaling, outer, K).count() * std::int64_t{sizeof(float)});
  };
  if (codes) out.scales = scales_of(out.code_rows, cols);
  if (transposed) out.transposed_scales = scales_of(cols, out.transposed_ld);
  return out;
}

void DeviceFp8::record_later(fp8::Role role) const {
  if (!host_scalars_ || host_scalars_->defined()) host_scalars_ = std::make_shared<Tensor<float>>();
  q_.state->record_later(role, [host = host_scalars_, scalars = scalars_, role] {
    if (!host->defined()) *host = scalars.to(Device::cpu());
    return host->flat(static_cast<std::int64_t>(role) * fields + amax_field);
  });
}

DeviceFp8::Target DeviceFp8::target(fp8::Role role, std::int64_t rows, std::int64_t cols, bool first,
                                        bool codes, bool transposed) const {
  check(scales_ahead() || (!first && !tiled()), op_, fp8::describe(q_.recipe), " has no scale for ",
        fp8::role_name(role), " before its tensor exists");
  const bool record = first && q_.state;
  if (record) record_later(role);
  return {codes_for(role, rows, cols, codes, transposed), slot(role, scale_field),
          record ? slot(role, amax_field) : nullptr};
}

Fp8Codes DeviceFp8::quantize(fp8::Role role, DType dtype, const void* x, std::int64_t rows, std::int64_t cols,
                             bool codes, bool transposed, bool first) const {
  const Fp8Codes out = codes_for(role, rows, cols, codes, transposed);
  if (tiled()) {
    cuda::fp8_block_quantize({.dtype = dtype,
                              .x = x,
                              .rows = rows,
                              .cols = cols,
                              .scaling = out.scaling,
                              .codes = codes ? out.codes->data() : nullptr,
                              .codes_rows = out.code_rows,
                              .scales = codes ? static_cast<float*>(out.scales->data()) : nullptr,
                              .transposed = transposed ? out.transposed->data() : nullptr,
                              .transposed_ld = out.transposed_ld,
                              .transposed_scales = transposed ? static_cast<float*>(out.transposed_scales->data())
                                                              : nullptr},
                             device_.index);
    return out;
  }
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

void DeviceFp8::product(const Fp8Codes& a, Fp8Layout a_layout, const Fp8Codes& b, Fp8Layout b_layout,
                        std::int64_t M, std::int64_t N, std::int64_t K, DType out_dtype, void* out,
                        const void* bias, double beta, bool forward) const {
  struct Operand {
    const void* data;
    std::int64_t ld;
    const float* scale_inv;
  };
  const auto operand = [](const Fp8Codes& x, Fp8Layout layout) {
    const auto scales = [&](const std::shared_ptr<Storage>& s) {
      return s ? static_cast<const float*>(s->data()) : x.scale_inv;
    };
    return layout == Fp8Layout::codes ? Operand{x.codes->data(), x.cols, scales(x.scales)}
                                      : Operand{x.transposed->data(), x.transposed_ld, scales(x.transposed_scales)};
  };
  const Operand A = operand(a, a_layout), B = operand(b, b_layout);
  // Block scaling: A's codes may carry zero rows past M (code_rows); the product then writes them too, to scratch.
  const std::int64_t rows = a_layout == Fp8Layout::codes ? a.code_rows : M;
  std::shared_ptr<Storage> scratch;
  void* c = out;
  if (rows != M) {
    scratch = bytes_on(device_, rows * N * static_cast<std::int64_t>(dtype_size(out_dtype)));
    c = scratch->data();
    if (beta != 0.0) cuda::strided_copy(out_dtype, out, c, {{M, N, N}, {N, 1, 1}}, device_.index);
  }
  // cuBLASLt's FP8 kernels add no f32 bias, nor any with block scaling (cuda/blaslt.hpp): the bias becomes C's
  // initial rows instead.
  if (bias && (out_dtype == DType::f32 || tiled()) && rows > 0) {
    cuda::strided_copy(out_dtype, bias, c, {{rows, 0, N}, {N, 1, 1}}, device_.index);
    bias = nullptr;
    beta = 1.0;
  }
  const cuda::GemmFp8 fp8{.a = a.format,
                          .b = b.format,
                          .a_scale_inv = A.scale_inv,
                          .b_scale_inv = B.scale_inv,
                          .fast_accumulation = forward && q_.fast_forward_accumulation && !tiled(),
                          .a_scaling = a.scaling,
                          .b_scaling = b.scaling};
  cuda::gemm({.dtype = out_dtype,
              .M = rows,
              .N = N,
              .K = K,
              .a = {A.data, A.ld, 0, false},
              .b = {B.data, B.ld, 0, true},
              .c = {c, N, 0},
              .beta = beta,
              .bias = bias,
              .fp8 = &fp8},
             device_.index);
  if (c != out) cuda::strided_copy(out_dtype, c, out, {{M, N, N}, {N, 1, 1}}, device_.index);
}

}  // namespace tapegrad::detail
