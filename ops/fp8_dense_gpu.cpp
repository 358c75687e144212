#include "tapegrad/ops/fp8_dense_gpu.hpp"

namespace tapegrad::detail {

template <class T, class P>
Tensor<T> device_dense_forward(DeviceDense<T>& s, const Fp8Quantization& q, const Tensor<T>& x,
                               const Tensor<P>& kernel, const Tensor<P>* bias) {
  const Device device = x.device();
  s.M = x.dim(0);
  s.K = x.dim(1);
  s.N = kernel.dim(1);
  s.padded_K = fp8_padded(q.recipe, s.K);
  s.padded_N = fp8_padded(q.recipe, s.N);
  const std::int64_t M = s.M, K = s.padded_K, N = s.padded_N;
  s.fp8.emplace("fp8_dense", q, device);  // (delayed scaling: ends the state's previous step first)
  s.kernel = quantized_weight(*s.fp8, fp8::Role::kernel1, kernel, Shape{s.K, s.N}, Shape{K, N});
  Resizes<T> pads;
  const Tensor<T> xp = pads.add(x, Shape{M, K});
  const Tensor<T> b = bias ? pads.add(cast<T>(*bias), Shape{N}) : Tensor<T>();
  pads.run();
  const Fp8Codes xq = s.fp8->quantize(fp8::Role::input, dtype_v<T>, xp.data(), M, K, true, true, true);
  Tensor<T> y(Shape{M, N}, device);
  s.fp8->product(xq, Fp8Layout::codes, s.kernel, Fp8Layout::transposed, M, N, K, dtype_v<T>, y.data(),
                 bias ? b.data() : nullptr, 0.0, true);
  s.x_transposed = xq;  // its transpose alone
  s.x_transposed.codes.reset();
  s.x_transposed.scales.reset();
  return resized(y, Shape{M, s.N});
}

template <class T, class P>
DeviceDenseGrads<T, P> device_dense_backward(const DeviceDense<T>& s, const Tensor<T>& dy, bool need_x,
                                             bool need_kernel, bool need_bias) {
  const Device device = dy.device();
  const std::int64_t M = s.M, K = s.padded_K, N = s.padded_N;
  DeviceDenseGrads<T, P> g;
  if (need_bias) g.db = column_sums<P>(dy, s.N, Shape{s.N});
  if (!need_x && !need_kernel) return g;
  const Tensor<T> dyp = resized(dy, Shape{M, N});
  const Fp8Codes dyq =
      s.fp8->quantize(fp8::Role::grad_output, dtype_v<T>, dyp.data(), M, N, need_x, need_kernel, true);
  Resizes<T> crops;  // dx and dkernel cropped in one launch
  if (need_x) {
    Tensor<T> dx(Shape{M, K}, device);
    s.fp8->product(dyq, Fp8Layout::codes, s.kernel, Fp8Layout::codes, M, K, N, dtype_v<T>, dx.data(), nullptr, 0.0,
                   false);
    g.dx = crops.add(dx, Shape{M, s.K});
  }
  if (need_kernel) {
    g.dkernel = fp8_weight_gradient<P, T>(*s.fp8, s.x_transposed, dyq, Shape{s.K, s.N}, Shape{K, N}, device, &crops);
  }
  crops.run();
  return g;
}

#define TAPEGRAD_INSTANTIATE_DEVICE_DENSE_PARAMS(T, P)                                                            \
  template Tensor<T> device_dense_forward<T, P>(DeviceDense<T>&, const Fp8Quantization&, const Tensor<T>&,        \
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
