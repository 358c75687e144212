#include "tapegrad/ops/fp8/detail/dense_gpu.hpp"

namespace tapegrad::detail {

template <class T, class P>
Tensor<T> device_dense_forward(DeviceDense<T>& s, const Fp8Quantization& q, const std::optional<fp8::AmaxGroup>& group,
                               const Tensor<T>& x, const Tensor<P>& kernel, const Tensor<P>* bias) {
  const Device device = x.device();
  s.M = x.dim(0);
  s.K = x.dim(1);
  s.N = kernel.dim(1);
  // (delayed scaling: ends the state's previous step first; a product where fp8 would not pay runs unquantized, but
  // in an amax group, whose ranks must all quantize or none)
  const bool pays = group || quantizes_on_gpu(q, fp8::StepWork::dense(s.M, s.K, s.N));
  s.quantizer = pays ? DeviceQuantizer<T>("fp8_dense", q, device, group) : DeviceQuantizer<T>();
  s.padded_K = s.quantizer.padded(s.K);
  s.padded_N = s.quantizer.padded(s.N);
  const std::int64_t M = s.M, K = s.padded_K, N = s.padded_N;
  Resizes<T> pads;
  s.kernel = s.quantizer.weight(fp8::Role::kernel1, kernel, Shape{s.K, s.N}, Shape{K, N}, pads);
  const Tensor<T> xp = pads.add(x, Shape{M, K});
  const Tensor<T> b = bias ? pads.add(cast<T>(*bias), Shape{N}) : Tensor<T>();
  pads.run();
  const DeviceOperand<T> xq =
      s.quantizer.input(fp8::Role::input, {xp}, {.columns = true, .rows = true}, Pass::first);
  Tensor<T> y(Shape{M, N}, device);
  s.quantizer.product(xq, s.kernel, Transpose::no, M, N, K, y.data(), bias ? b.data() : nullptr, nullptr, true);
  s.kernel.give_up_transpose();
  s.x = xq.weight_gradient_layout();
  s.quantizer.end_pass();
  return resized(y, Shape{M, s.N});
}

template <class T, class P>
DeviceDenseGrads<T, P> device_dense_backward(const DeviceDense<T>& s, const Tensor<T>& dy, bool need_x,
                                             bool need_kernel, bool need_bias) {
  const Device device = dy.device();
  const std::int64_t M = s.M, K = s.padded_K, N = s.padded_N;
  DeviceDenseGrads<T, P> g;
  if (!need_x && !need_kernel) {
    if (need_bias) g.db = column_sums<P>(dy, s.N, Shape{s.N});
    return g;
  }
  // The bias gradient from dy's quantization where the recipe can (a read of dy spared), else a pass of its own.
  const Tensor<T> dy_padded = resized(dy, Shape{M, N});
  const Layouts layouts{.columns = need_x, .rows = need_kernel};
  std::optional<DeviceOperand<T>> summed;
  if (need_bias) {
    summed = s.quantizer.input_summing_columns(fp8::Role::grad_output, dy_padded, layouts, Pass::first, Shape{s.N},
                                               g.db);
    if (!summed) g.db = column_sums<P>(dy, s.N, Shape{s.N});
  }
  const DeviceOperand<T> dyq =
      summed ? std::move(*summed) : s.quantizer.input(fp8::Role::grad_output, {dy_padded}, layouts, Pass::first);
  Resizes<T> crops;  // dx and dkernel cropped in one launch
  if (need_x) {
    Tensor<T> dx(Shape{M, K}, device);
    s.quantizer.product(dyq, s.kernel, Transpose::yes, M, K, N, dx.data(), nullptr, nullptr, false);
    g.dx = crops.add(dx, Shape{M, s.K});
  }
  if (need_kernel) g.dkernel = s.quantizer.template weight_gradient<P>(s.x, dyq, Shape{s.K, s.N}, Shape{K, N}, &crops);
  s.quantizer.end_pass();
  crops.run();
  return g;
}

#define TAPEGRAD_INSTANTIATE_DEVICE_DENSE_PARAMS(T, P)                                                            \
  template Tensor<T> device_dense_forward<T, P>(DeviceDense<T>&, const Fp8Quantization&,                         \
                                                const std::optional<fp8::AmaxGroup>&, const Tensor<T>&,           \
                                                const Tensor<P>&, const Tensor<P>*);                              \
  template DeviceDenseGrads<T, P> device_dense_backward<T, P>(const DeviceDense<T>&, const Tensor<T>&, bool, bool, \
                                                              bool);
#define TAPEGRAD_INSTANTIATE_DEVICE_DENSE(T)                    \
  TAPEGRAD_INSTANTIATE_DEVICE_DENSE_PARAMS(T, float)            \
  TAPEGRAD_INSTANTIATE_DEVICE_DENSE_PARAMS(T, double)           \
  TAPEGRAD_INSTANTIATE_DEVICE_DENSE_PARAMS(T, ::tapegrad::bf16) \
  TAPEGRAD_INSTANTIATE_DEVICE_DENSE_PARAMS(T, ::tapegrad::f16)
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_DEVICE_DENSE)

}  // namespace tapegrad::detail
