// fp8_dense's node (ops/fp8/dense.hpp): on the CPU the quantization of ops/fp8/detail/operand.hpp and the products of
// ops/fp8/detail/products.hpp, as layernorm_mlp's fp8 path uses them (saved: x, the input's own storage, the quantized
// kernel and the step's scales); on a GPU ops/fp8/detail/dense_gpu.hpp.
#include "tapegrad/ops/fp8/dense.hpp"

#include <optional>
#include <string_view>
#include <tuple>

#include "tapegrad/autodiff/custom_op.hpp"
#include "tapegrad/ops/fp8/detail/dense_gpu.hpp"
#include "tapegrad/ops/fp8/detail/operand.hpp"
#include "tapegrad/ops/layernorm_mlp/detail/check.hpp"
#include "tapegrad/ops/fp8/detail/products.hpp"
#include "tapegrad/ops/detail/row_sum.hpp"
#include "tapegrad/tensor/core/detail/device_checks.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"

namespace tapegrad {

namespace {

constexpr const char* op_name = "fp8_dense";

// The roles' tensors as this op calls them.
std::string_view tensor_name(fp8::Role role) {
  switch (role) {
    case fp8::Role::input: return "x";
    case fp8::Role::kernel1: return "kernel";
    case fp8::Role::grad_output: return "dy";
    default: return fp8::role_name(role);
  }
}

template <class T> struct DenseContext {
  detail::Quantizer<T> quantizer;
  detail::Operand<T> x, kernel;  // x [M, K] as dkernel reads it; the kernel [K, N]
  std::int64_t M = 0, K = 0, N = 0;
  detail::DeviceDense<T> device;  // all of the above, for x on a GPU
};

// y [M, N] = q(x) · q(kernel) + bias on the CPU, for x [M, K]; fills c.
template <class T, class P>
Tensor<T> dense_forward(DenseContext<T>& c, const Fp8Quantization& q, const std::optional<fp8::AmaxGroup>& group,
                        const Tensor<T>& x, const Tensor<P>& kernel, const Tensor<P>* bias) {
  using detail::Pass;
  c.M = x.dim(0);
  c.K = x.dim(1);
  c.N = kernel.dim(1);
  c.quantizer = detail::Quantizer<T>(op_name, q, tensor_name, group);  // (delayed: ends the state's previous step)
  c.kernel = c.quantizer.weight(fp8::Role::kernel1, kernel, c.K, c.N);
  const Tensor<T> b = bias ? cast<T>(*bias) : Tensor<T>();
  const detail::Operand<T> xq =
      c.quantizer.input(fp8::Role::input, {x}, c.M, c.K, {.columns = true, .rows = true}, Pass::first);
  c.x = xq.weight_gradient_layout();
  Tensor<T> y = detail::product(xq, c.kernel, Transpose::no, c.M, c.N, c.K, detail::bias_rows(b));
  c.quantizer.end_pass();
  return y;
}

// dx [M, K], dkernel and dbias from dy [M, N] on the CPU, each where needed.
template <class T, class P>
std::tuple<Tensor<T>, Tensor<P>, Tensor<P>> dense_backward(const DenseContext<T>& c, const Tensor<T>& dy,
                                                           bool need_x, bool need_kernel, bool need_bias) {
  Tensor<T> dx;
  Tensor<P> dw, db;
  const detail::Operand<T> dyq = c.quantizer.input(fp8::Role::grad_output, {dy}, c.M, c.N,
                                                   {.columns = need_x, .rows = need_kernel}, detail::Pass::first);
  if (need_x) dx = detail::product(dyq, c.kernel, Transpose::yes, c.M, c.K, c.N);
  if (need_kernel) {
    dw = detail::rounded_tensor<P>(detail::weight_gradient(c.x, dyq, c.M, c.K, c.N).data(), Shape{c.K, c.N});
  }
  if (need_bias) db = detail::rounded_tensor<P>(detail::column_sums(dy, c.M, c.N).data(), Shape{c.N});
  c.quantizer.end_pass();
  return {dx, dw, db};
}

}  // namespace

template <class T, class P>
Var<T> fp8_dense(const Var<T>& x, const Var<P>& kernel, const Var<P>& bias, const Fp8Quantization& q,
                 const std::optional<fp8::AmaxGroup>& amax_group) {
  check(x.defined() && kernel.defined(), op_name, x.defined() ? "kernel" : "x",
        " is undefined (a default-constructed Var); x and kernel must be defined (only the bias may be left out)");
  detail::check_fp8_quantization(op_name, q);
  const Shape x_shape = x.shape();
  check(x_shape.rank() >= 1 && kernel.shape().rank() == 2 && kernel.shape()[0] == x_shape.dim(-1), op_name,
        "kernel has shape ", kernel.shape(), " but x has shape ", x_shape, " (a kernel is [K, N] for x [..., K])");
  const std::int64_t K = x_shape.dim(-1), N = kernel.shape()[1];
  const bool has_bias = bias.defined();
  check_device_matches(op_name, x.device(), 1, kernel.device());
  if (has_bias) {
    check(bias.shape() == Shape{N}, op_name, "bias has shape ", bias.shape(), " but the kernel ", kernel.shape(),
          " needs [", N, "]");
    check_device_matches(op_name, x.device(), 2, bias.device());
  }
  detail::check_fp8_on_device(op_name, dtype_v<T>, x.device());
  std::vector<std::int64_t> out_dims(x_shape.dims().begin(), x_shape.dims().end());
  out_dims.back() = N;
  const Shape out_shape(out_dims);
  const Var<P> bias_or_absent = has_bias ? bias : constant(Tensor<P>(Shape{0}, x.device()));
  std::int64_t M = 1;  // x's rows (of K elements, which may be none)
  for (int axis = 0; axis + 1 < x_shape.rank(); ++axis) M *= x_shape.dim(axis);

  return custom_op<DenseContext<T>>(
      op_name,
      [&](DenseContext<T>& c, const Tensor<T>& xv, const Tensor<P>& wv, const Tensor<P>& bv) {
        const Tensor<T> x_rows = xv.reshape(Shape{M, K});
        const Tensor<P>* b = has_bias ? &bv : nullptr;
        const Tensor<T> y = by_device(
            op_name, xv.device(), [&] { return dense_forward(c, q, amax_group, x_rows, wv, b); },
            [&](auto) { return detail::device_dense_forward(c.device, q, amax_group, x_rows, wv, b); });
        return y.reshape(out_shape);
      },
      [=](const DenseContext<T>& c, const NeedsGrad& needs, const Tensor<T>& dy_in) {
        const Tensor<T> dy = dy_in.reshape(Shape{M, N});
        const bool need_bias = has_bias && needs[2];
        auto [dx, dw, db] = by_device(
            op_name, dy.device(), [&] { return dense_backward<T, P>(c, dy, needs[0], needs[1], need_bias); },
            [&](auto) {
              const auto g = detail::device_dense_backward<T, P>(c.device, dy, needs[0], needs[1], need_bias);
              return std::tuple{g.dx, g.dkernel, g.db};
            });
        return std::tuple{needs[0] ? dx.reshape(x_shape) : Tensor<T>(), dw, db};
      },
      x, kernel, bias_or_absent);
}

#define TAPEGRAD_INSTANTIATE_FP8_DENSE_PARAMS(T, P) \
  template Var<T> fp8_dense<T, P>(const Var<T>&, const Var<P>&, const Var<P>&, const Fp8Quantization&, \
                                  const std::optional<fp8::AmaxGroup>&);
#define TAPEGRAD_INSTANTIATE_FP8_DENSE(T)                   \
  TAPEGRAD_INSTANTIATE_FP8_DENSE_PARAMS(T, float)           \
  TAPEGRAD_INSTANTIATE_FP8_DENSE_PARAMS(T, double)          \
  TAPEGRAD_INSTANTIATE_FP8_DENSE_PARAMS(T, ::tapegrad::bf16) \
  TAPEGRAD_INSTANTIATE_FP8_DENSE_PARAMS(T, ::tapegrad::f16)
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_FP8_DENSE)

}  // namespace tapegrad
