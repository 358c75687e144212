// layernorm_mlp on the GPU: the steps of ops/layernorm_mlp.cpp (its mlp_forward and mlp_backward) on the launchers
// of cuda/, in the same order and with the same roundings; ops/layernorm_mlp_gpu.hpp says where they differ.
//
//   forward                                  backward (dy [M, H])
//   h  = norm(x)          cuda::norm_forward   db2 = Σ_rows dy                       cuda::sum in C
//   z  = h · W1 + b1      cuda::gemm + bias    a = act(z); dW2 = aᵀ·dy               mlp_activation, cuda::gemm
//   a  = act(z)           mlp_activation       da  = dy · W2ᵀ                        cuda::gemm
//   y  = a · W2 + b2      cuda::gemm + bias    dz = da · ∂a/∂z and db1 = Σ_rows dz   mlp_activation_backward
//                                            dW1 = hᵀ·dz; dh = dz · W1ᵀ (+ the returned h's gradient)
//                                            dx, dγ, dβ = cuda::norm_backward of dh
// (the weight gradients accumulate in f32 on the tensor cores)
//
// Every parameter gradient is summed in C = compute_t<T> and rounded once to its dtype P (ParamGrad).
// A recomputed h comes from the same norm kernel on the same x and γ (its statistics are recomputed bitwise, and
// not stored again), a recomputed z from the same product: every recompute policy gives the same gradients.
#include "ops/layernorm_mlp_gpu.hpp"

#include <optional>

#include "cuda/activation_math.hpp"  // quick_gelu_alpha
#include "cuda/blaslt.hpp"
#include "cuda/mlp_activation.hpp"
#include "cuda/reduce.hpp"

namespace tapegrad::detail {

namespace {

cuda::MlpActivation device_activation(const LayerNormMLPOptions& options) {
  using cuda::MlpFunction;
  using cuda::MlpGate;
  const double limit = options.clamped_swiglu.limit, quick = activation::quick_gelu_alpha;
  switch (options.activation) {
    case Activation::relu: return {MlpFunction::relu, MlpGate::none};
    case Activation::gelu: return {MlpFunction::gelu_tanh, MlpGate::none};
    case Activation::silu: return {MlpFunction::swish, MlpGate::none, 1.0};
    case Activation::quick_gelu: return {MlpFunction::swish, MlpGate::none, quick};
    case Activation::squared_relu: return {MlpFunction::squared_relu, MlpGate::none};
    case Activation::reglu: return {MlpFunction::relu, MlpGate::linear};
    case Activation::geglu: return {MlpFunction::gelu_tanh, MlpGate::linear};
    case Activation::swiglu: return {MlpFunction::swish, MlpGate::linear, 1.0};
    case Activation::glu: return {MlpFunction::sigmoid, MlpGate::linear};
    case Activation::qgeglu: return {MlpFunction::swish, MlpGate::linear, quick};
    case Activation::sreglu: return {MlpFunction::squared_relu, MlpGate::linear};
    case Activation::clamped_swiglu:
      return {MlpFunction::clamped_swish, MlpGate::clamped_linear, options.clamped_swiglu.alpha, limit};
  }
  throw Error("layernorm_mlp: unknown activation");
}

// out [M, N] = op(A) · op(B) + beta·out (+ bias on every row unless null), row-major: A stored [M, K], or [K, M]
// when transposed; B stored [K, N], or [N, K] when transposed. out and the bias in T, or, wide, in T's compute type
// (the f32 accumulation of 16-bit products rounded once to f32).
template <class T>
void product(const Tensor<T>& a, bool transpose_a, const Tensor<T>& b, bool transpose_b, std::int64_t M,
             std::int64_t N, std::int64_t K, const void* bias, double beta, void* out, bool wide = false) {
  cuda::gemm({.dtype = dtype_v<T>,
              .M = M,
              .N = N,
              .K = K,
              .a = {a.data(), transpose_a ? M : K, 0, transpose_a},
              .b = {b.data(), transpose_b ? K : N, 0, transpose_b},
              .c = {out, N, 0},
              .beta = beta,
              .bias = bias,
              .wide_output = wide},
             a.device().index);
}

template <class T> const void* data_or_null(const Tensor<T>& t) { return t.defined() ? t.data() : nullptr; }

// A parameter gradient summed in C = compute_t<T> and rounded once to P. Launchers write it straight into P where
// P is T (their output in T) or C (their wide output); any other P gets it in C, then a cast.
template <class P, class T> class ParamGrad {
  using C = compute_t<T>;
  static constexpr bool direct = std::is_same_v<P, T> || std::is_same_v<P, C>;

 public:
  static constexpr bool wide = !std::is_same_v<P, T>;  // what the launcher is asked for
  ParamGrad(const Shape& shape, Device device) {
    if constexpr (direct) out_ = Tensor<P>(shape, device);
    else staged_ = Tensor<C>(shape, device);
  }
  void* data() {
    if constexpr (direct) return out_.data();
    else return staged_.data();
  }
  Tensor<P> result() const {
    if constexpr (direct) return out_;
    else return cast<P>(staged_);
  }

 private:
  Tensor<P> out_;
  Tensor<C> staged_;
};

// z = h · W1 + b1, rounded to T once.
template <class T> Tensor<T> first_product(const DeviceMlp<T>& s, const Tensor<T>& h) {
  const auto [M, H, F, n] = s.dims;
  Tensor<T> z(Shape{M, n * F}, h.device());
  product(h, false, s.w1, false, M, n * F, H, data_or_null(s.b1), 0.0, z.data());
  return z;
}

// h [M, H] from x and the saved γ, β: bitwise the forward's, whose statistics it leaves as they are.
template <class T> Tensor<T> norm_output(const DeviceMlp<T>& s, compute_t<T>* mean, compute_t<T>* rstd) {
  Tensor<T> h(Shape{s.dims.rows, s.dims.hidden}, s.x.device());
  cuda::norm_forward(s.norm,
                     {.x = s.x.data(),
                      .gamma = s.gamma.data(),
                      .beta = s.beta.defined() ? s.beta.data() : nullptr,
                      .y = h.data(),
                      .mean = mean,
                      .rstd = rstd,
                      .epsilon = s.options.epsilon},
                     s.x.device().index);
  return h;
}

// Σ_rows of t [M, width] (summed in T's accumulation type) as P [shape].
template <class P, class T> Tensor<P> column_sums(const Tensor<T>& t, std::int64_t width, const Shape& shape) {
  ParamGrad<P, T> sums(shape, t.device());
  cuda::sum(dtype_v<T>, t.data(), {{t.numel() / width, width}, {true, false}}, 1.0, sums.data(), t.device().index,
            ParamGrad<P, T>::wide);
  return sums.result();
}

// Aᵀ · B over M rows (T's products accumulated in C by the tensor cores) as P [shape]: A [M, K1], B [M, K2] →
// [K1, K2].
template <class P, class T>
Tensor<P> weight_gradient(const Tensor<T>& a, const Tensor<T>& b, std::int64_t M, std::int64_t k1, std::int64_t k2,
                          const Shape& shape) {
  ParamGrad<P, T> out(shape, a.device());
  product(a, true, b, false, k1, k2, M, nullptr, 0.0, out.data(), ParamGrad<P, T>::wide);
  return out.result();
}

template <class T> bool is_layernorm(const DeviceMlp<T>& s) { return s.norm.centered; }

}  // namespace

template <class T, class P>
DeviceMlpOutput<T> device_mlp_forward(DeviceMlp<T>& s, const MlpDims& dims, const LayerNormMLPOptions& options,
                                      const Tensor<T>& x, const MlpParams<P>& params) {
  using C = compute_t<T>;
  const auto [M, H, F, n] = dims;
  const Device device = x.device();
  s.options = options;
  s.dims = dims;
  s.norm = {.dtype = dtype_v<T>,
            .rows = M,
            .hidden = H,
            .centered = options.norm == NormType::layernorm,
            .zero_centered_gamma = options.zero_centered_gamma};
  s.x = x;
  s.gamma = cast<T>(params.gamma);
  if (params.beta) s.beta = cast<T>(*params.beta);
  s.w1 = cast<T>(params.w1);
  s.w2 = cast<T>(params.w2);
  if (params.b1) s.b1 = cast<T>(*params.b1);
  if (params.b2) s.b2 = cast<T>(*params.b2);
  s.mean = Tensor<C>(Shape{is_layernorm(s) ? M : 0}, device);
  s.rstd = Tensor<C>(Shape{M}, device);

  Tensor<T> h = norm_output(s, is_layernorm(s) ? s.mean.data() : nullptr, s.rstd.data());
  Tensor<T> z = first_product(s, h);
  Tensor<T> a(Shape{M, F}, device), y(Shape{M, H}, device);
  cuda::mlp_activation_forward(dtype_v<T>, device.index, device_activation(options), z.data(), a.data(), M, F);
  product(a, false, s.w2, false, M, H, F, data_or_null(s.b2), 0.0, y.data());
  if (options.recompute == Recompute::save_all) s.h = h;
  if (options.recompute != Recompute::recompute_all) s.z = z;
  return {y, h};
}

template <class T, class P>
DeviceMlpGrads<T, P> device_mlp_backward(DeviceMlp<T>& s, const Tensor<T>& dy_in, const Tensor<T>* dh_out,
                                         const MlpNeeds& need) {
  using C = compute_t<T>;
  const auto [M, H, F, n] = s.dims;
  const Device device = dy_in.device();
  const Tensor<T> dy = dy_in.reshape(Shape{M, H});
  DeviceMlpGrads<T, P> g;
  if (need.b2) g.db2 = column_sums<P>(dy, H, Shape{H});
  const bool need_dh = need.x || need.gamma || need.beta;
  const bool need_dz = need_dh || need.w1 || need.b1;
  if (!need_dz && !need.w2) return g;

  // Peak memory: every temporary is released once its last reader is queued (the pool reuses it in stream order),
  // and the saved h and z go with them. dW2 comes first, from a recomputed a that then goes; dz is written over z
  // (each element read, then written, by the same thread), so the activation's backward adds only da.
  Tensor<T> h = s.h.defined() ? s.h : norm_output(s, nullptr, nullptr);
  Tensor<T> z = s.z.defined() ? s.z : first_product(s, h);
  s.z = Tensor<T>();  // z's memory becomes dz below
  const cuda::MlpActivation act = device_activation(s.options);
  if (need.w2) {
    Tensor<T> a(Shape{M, F}, device);
    cuda::mlp_activation_forward(dtype_v<T>, device.index, act, z.data(), a.data(), M, F);
    g.dw2 = weight_gradient<P>(a, dy, M, F, H, Shape{F, H});
  }
  if (!need_dz) return g;
  {
    Tensor<T> da(Shape{M, F}, device);
    product(dy, false, s.w2, true, M, F, H, nullptr, 0.0, da.data());
    std::optional<ParamGrad<P, T>> db1;
    Tensor<C> partials;
    if (need.b1) {
      db1.emplace(Shape{n, F}, device);
      partials = Tensor<C>(Shape{cuda::mlp_activation_partials(M, F, static_cast<int>(n))}, device);
    }
    cuda::mlp_activation_backward(dtype_v<T>, device.index, act, z.data(), da.data(),
                                  {.dz = z.data(),
                                   .dbias = db1 ? db1->data() : nullptr,
                                   .partials = db1 ? partials.data() : nullptr,
                                   .wide_dbias = ParamGrad<P, T>::wide},
                                  M, F);
    if (db1) g.db1 = db1->result();
  }
  Tensor<T> dz = std::move(z);  // [M, nF]
  if (need.w1) g.dw1 = weight_gradient<P>(h, dz, M, H, n * F, Shape{H, n, F});
  h = Tensor<T>();
  s.h = Tensor<T>();
  if (!need_dh) return g;

  Tensor<T> dh = dh_out ? dh_out->reshape(Shape{M, H}).clone() : Tensor<T>(Shape{M, H}, device);
  product(dz, false, s.w1, true, M, H, n * F, nullptr, dh_out ? 1.0 : 0.0, dh.data());
  dz = Tensor<T>();
  // dx rounds to T once; dγ and dβ are summed in C and rounded once to P.
  if (need.x) g.dx = Tensor<T>(Shape{M, H}, device);
  std::optional<ParamGrad<P, T>> dgamma, dbeta;
  if (need.gamma) dgamma.emplace(Shape{H}, device);
  if (need.beta) dbeta.emplace(Shape{H}, device);
  Tensor<C> partials(Shape{cuda::norm_backward_partials(s.norm, need.gamma, need.beta)}, device);
  cuda::norm_backward(s.norm,
                      {.x = s.x.data(),
                       .gamma = s.gamma.data(),
                       .dy = dh.data(),
                       .mean = is_layernorm(s) ? s.mean.data() : nullptr,
                       .rstd = s.rstd.data(),
                       .dx = need.x ? g.dx.data() : nullptr,
                       .dgamma = dgamma ? dgamma->data() : nullptr,
                       .dbeta = dbeta ? dbeta->data() : nullptr,
                       .partials = partials.data(),
                       .wide_parameter_grads = ParamGrad<P, T>::wide},
                      device.index);
  if (dgamma) g.dgamma = dgamma->result();
  if (dbeta) g.dbeta = dbeta->result();
  return g;
}

#define TAPEGRAD_INSTANTIATE_DEVICE_MLP_PARAMS(T, P)                                                              \
  template DeviceMlpOutput<T> device_mlp_forward<T, P>(DeviceMlp<T>&, const MlpDims&, const LayerNormMLPOptions&,  \
                                                       const Tensor<T>&, const MlpParams<P>&);                     \
  template DeviceMlpGrads<T, P> device_mlp_backward<T, P>(DeviceMlp<T>&, const Tensor<T>&, const Tensor<T>*,       \
                                                          const MlpNeeds&);
#define TAPEGRAD_INSTANTIATE_DEVICE_MLP(T)                        \
  TAPEGRAD_INSTANTIATE_DEVICE_MLP_PARAMS(T, float)                \
  TAPEGRAD_INSTANTIATE_DEVICE_MLP_PARAMS(T, double)               \
  TAPEGRAD_INSTANTIATE_DEVICE_MLP_PARAMS(T, ::tapegrad::bf16)     \
  TAPEGRAD_INSTANTIATE_DEVICE_MLP_PARAMS(T, ::tapegrad::f16)
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_DEVICE_MLP)

}  // namespace tapegrad::detail
