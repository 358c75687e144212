// layernorm_mlp on the GPU: the steps of ops/layernorm_mlp.cpp (its mlp_forward and mlp_backward) on the launchers
// of cuda/, in the same order and with the same roundings; ops/layernorm_mlp_gpu.hpp says where they differ.
//
//   forward                                  backward (dy [M, H])
//   h  = norm(x)          cuda::norm_forward   da  = dy · W2ᵀ                        cuda::gemm
//   z  = h · W1 + b1      cuda::gemm + bias    dz = da · ∂a/∂z, db1 = Σ_rows dz and  mlp_activation_backward
//   a  = act(z)           mlp_activation (*)     a = act(z) again (bitwise, but (*))
//   y  = a · W2 + b2      cuda::gemm + bias    dW2 = aᵀ·dy                           cuda::gemm
//                                            dW1 = hᵀ·dz; dh = dz · W1ᵀ (+ the returned h's gradient)
//                                            dx, dγ, dβ = cuda::norm_backward of dh, and db2 = Σ_rows dy in the
//                                              same pass (its `other` rows: dy has dh's shape), summed in C
//                                              (without a norm backward, db2 alone: cuda::sum in C)
// (the weight gradients accumulate in f32 on the tensor cores; (*) GELU with a bias: GEMM1's epilogue, see the .hpp)
//
// Every parameter gradient is summed in C = compute_t<T> and rounded once to its dtype P (ParamGrad).
// A recomputed h comes from the same norm kernel on the same x and γ (its statistics are recomputed bitwise, and
// not stored again), a recomputed z from the same product: every recompute policy gives the same gradients.
#include "tapegrad/ops/layernorm_mlp_gpu.hpp"

#include <optional>
#include <type_traits>
#include <vector>

#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/cuda/mlp_activation.hpp"
#include "tapegrad/ops/activation_table.hpp"
#include "tapegrad/ops/layernorm_mlp_sharding.hpp"
#include "tapegrad/tensor/accumulate.hpp"
#include "tapegrad/tensor/gpu/side_stream.hpp"
#include "tapegrad/tensor/factories.hpp"

namespace tapegrad::detail {

namespace {

// out [M, N] = op(A) · op(B) + beta·out (+ bias on every row unless null), row-major: A stored [M, K], or [K, M]
// when transposed; B stored [K, N], or [N, K] when transposed. out and the bias in T, or, wide, in T's compute type
// (the f32 accumulation of 16-bit products rounded once to f32). With gelu_input, out = GELU of the sum and the sum
// goes to gelu_input (cuBLASLt's GELU_AUX_BIAS epilogue).
template <class T>
void product(const Tensor<T>& a, bool transpose_a, const Tensor<T>& b, bool transpose_b, std::int64_t M,
             std::int64_t N, std::int64_t K, const void* bias, double beta, void* out, bool wide = false,
             void* gelu_input = nullptr) {
  cuda::gemm({.dtype = dtype_v<T>,
              .M = M,
              .N = N,
              .K = K,
              .a = {a.data(), transpose_a ? M : K, 0, transpose_a},
              .b = {b.data(), transpose_b ? K : N, 0, transpose_b},
              .c = {out, N, 0},
              .beta = beta,
              .bias = bias,
              .gelu_input = gelu_input,
              .wide_output = wide},
             a.device().index);
}

template <class T> const void* data_or_null(const Tensor<T>& t) { return t.defined() ? t.data() : nullptr; }

// Hidden and ffn sizes rounded up to 16 bytes of T (ops/layernorm_mlp_gpu.hpp says why), with fp8 to 16 bytes of
// fp8 codes, with block scaling to whole tiles of 128: its products read whole tiles along their inner dimension,
// and a gated block's n parts of F each start a tile (ops/fp8_operands.hpp).
template <class T> MlpDims padded_dims(const MlpDims& d, const std::optional<Fp8Quantization>& fp8) {
  constexpr std::int64_t v = 16 / sizeof(T);
  const auto up = [&](std::int64_t n) { return fp8 ? fp8_padded(fp8->recipe, n) : (n + v - 1) / v * v; };
  return {d.rows, up(d.hidden), up(d.ffn), d.width};
}

// Whether GEMM1 applies the activation in cuBLASLt's epilogue (GELU_AUX_BIAS): GELU with a bias, in a type it has
// the epilogue for, on rows the epilogue can write (ffn a multiple of 8 elements).
template <class T> bool gelu_epilogue(const DeviceMlp<T>& s) {
  return s.options.activation == Activation::gelu && s.b1.defined() && !std::is_same_v<T, double> &&
         s.padded.ffn % 8 == 0 && !s.fp8;
}

// GEMM1's results: z = h · W1 + b1 (padded), rounded to T once, and, with the GELU epilogue, a = gelu(z) computed
// from the unrounded sum (undefined otherwise: the activation kernel makes it).
template <class T> struct FirstProduct {
  Tensor<T> z, a;
};
// z (padded, [M, nF]) = h · W1 + b1 from h's codes (fp8).
template <class T> void quantized_first_product(const DeviceMlp<T>& s, const Fp8Codes& hq, Tensor<T>& z) {
  const auto [M, H, F, n] = s.padded;
  s.fp8->product(hq, Fp8Layout::codes, s.w1q, Fp8Layout::transposed, M, n * F, H, dtype_v<T>, z.data(),
                 data_or_null(s.b1), 0.0, true);
}

template <class T> FirstProduct<T> first_product(const DeviceMlp<T>& s, const Tensor<T>& h) {
  const auto [M, H, F, n] = s.padded;
  FirstProduct<T> out{Tensor<T>(Shape{M, n * F}, h.device()), {}};
  if (s.fp8) {  // a recompute's: h quantized with the step's scale
    quantized_first_product(s, s.fp8->quantize(fp8::Role::input, dtype_v<T>, h.data(), M, H, true, false, false),
                            out.z);
    return out;
  }
  if (!gelu_epilogue(s)) {
    product(h, false, s.w1, false, M, n * F, H, data_or_null(s.b1), 0.0, out.z.data());
    return out;
  }
  out.a = Tensor<T>(Shape{M, F}, h.device());
  product(h, false, s.w1, false, M, F, H, s.b1.data(), 0.0, out.a.data(), false, out.z.data());
  return out;
}

// h (padded) from x and the saved γ, β: bitwise the forward's, whose statistics it leaves as they are.
template <class T> Tensor<T> norm_output(const DeviceMlp<T>& s, compute_t<T>* mean, compute_t<T>* rstd) {
  Tensor<T> h(Shape{s.norm.rows, s.padded.hidden}, s.x.device());
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

// Aᵀ · B over M rows (T's products accumulated in C by the tensor cores) as P [shape]: A [M, K1], B [M, K2] →
// [K1, K2] (of `padded_shape`), cropped to `shape`.
template <class P, class T>
Tensor<P> weight_gradient(const Tensor<T>& a, const Tensor<T>& b, std::int64_t M, std::int64_t k1, std::int64_t k2,
                          const Shape& shape, const Shape& padded_shape, Resizes<T>* crops = nullptr) {
  ParamGrad<P, T> out(shape, padded_shape, a.device());
  product(a, true, b, false, k1, k2, M, nullptr, 0.0, out.data(), ParamGrad<P, T>::wide);
  return out.result(crops);
}
template <class T> bool is_layernorm(const DeviceMlp<T>& s) { return s.norm.centered; }

// dW2 = aᵀ · dy from a and dy (padded; with fp8 dy's codes dyq), as P.
template <class P, class T>
Tensor<P> second_weight_gradient(const DeviceMlp<T>& s, const Tensor<T>& a, const Tensor<T>& dy, const Fp8Codes& dyq,
                                 Resizes<T>* crops = nullptr) {
  const auto [M, H, F, n] = s.dims;
  const std::int64_t Hp = s.padded.hidden, Fp = s.padded.ffn;
  if (!s.fp8) return weight_gradient<P>(a, dy, M, Fp, Hp, Shape{F, H}, Shape{Fp, Hp}, crops);
  const Fp8Codes aq = s.fp8->quantize(fp8::Role::activation, dtype_v<T>, a.data(), M, Fp, false, true, false);
  return fp8_weight_gradient<P, T>(*s.fp8, aq, dyq, Shape{F, H}, Shape{Fp, Hp}, s.x.device(), crops);
}

// What the activation's backward leaves for dW1 and dh: dz (in z's memory), or with delayed scaling dz's codes.
template <class T> struct HiddenGradient {
  Tensor<T> dz;
  Fp8Codes dzq;
};

// From z and dy (padded; with fp8 dy's codes dyq): da = dy · W2ᵀ, then the activation kernel writes dz over z and
// a = act(z) over da (for dW2), and sums db1 from its partial rows; db1 and dW2 go into g (their crops onto
// `crops`). With delayed scaling the kernel writes dz's codes (for dh where need_dh, transposed for dW1) and a's
// transposed codes (for dW2) instead, z and da are released, and dz's codes are returned.
template <class P, class T>
HiddenGradient<T> activation_backward(const DeviceMlp<T>& s, Tensor<T> z, const Tensor<T>& dy, const Fp8Codes& dyq,
                                      const MlpNeeds& need, bool need_dh, DeviceMlpGrads<T, P>& g,
                                      Resizes<T>& crops) {
  using C = compute_t<T>;
  const auto [M, H, F, n] = s.dims;
  const std::int64_t Hp = s.padded.hidden, Fp = s.padded.ffn;
  const Device device = z.device();
  const bool fused = s.fp8 && s.fp8->scales_ahead();
  Tensor<T> da(Shape{M, Fp}, device);  // then a, unless fused
  if (s.fp8) {
    s.fp8->product(dyq, Fp8Layout::codes, s.w2q, Fp8Layout::codes, M, Fp, Hp, dtype_v<T>, da.data(), nullptr, 0.0,
                   false);
  } else {
    product(dy, false, s.w2, true, M, Fp, Hp, nullptr, 0.0, da.data());
  }
  std::optional<ParamGrad<P, T>> db1;
  Tensor<C> partials;
  if (need.b1) {
    db1.emplace(Shape{n, F}, Shape{n, Fp}, device);
    partials = Tensor<C>(Shape{fused ? cuda::mlp_activation_codes_partials(M, Fp, static_cast<int>(n))
                                     : cuda::mlp_activation_partials(M, Fp, static_cast<int>(n))},
                         device);
  }
  HiddenGradient<T> out;
  DeviceFp8::Target a_codes;
  if (fused) {
    const DeviceFp8::Target dz_codes = s.fp8->target(fp8::Role::grad_hidden, M, n * Fp, true, need_dh, need.w1);
    a_codes = s.fp8->target(fp8::Role::activation, M, Fp, false, false, need.w2);
    const auto bytes = [](const std::shared_ptr<Storage>& codes) { return codes ? codes->data() : nullptr; };
    cuda::mlp_activation_backward_codes(dtype_v<T>, device.index, activation_form(s.options), z.data(), da.data(),
                                        {.dz_format = dz_codes.codes.format,
                                         .dz_scale = dz_codes.scale,
                                         .dz_codes = bytes(dz_codes.codes.codes),
                                         .dz_transposed = bytes(dz_codes.codes.transposed),
                                         .dz_amax = dz_codes.amax,
                                         .a_scale = a_codes.scale,
                                         .a_transposed = bytes(a_codes.codes.transposed),
                                         .transposed_ld = dz_codes.codes.transposed_ld,
                                         .dbias = db1 ? db1->data() : nullptr,
                                         .partials = db1 ? partials.data() : nullptr,
                                         .wide_dbias = ParamGrad<P, T>::wide},
                                        M, Fp);
    out.dzq = dz_codes.codes;
    z = Tensor<T>();
    da = Tensor<T>();
  } else {
    cuda::mlp_activation_backward(dtype_v<T>, device.index, activation_form(s.options), z.data(), da.data(),
                                  {.dz = z.data(),
                                   .a = need.w2 ? da.data() : nullptr,
                                   .dbias = db1 ? db1->data() : nullptr,
                                   .partials = db1 ? partials.data() : nullptr,
                                   .wide_dbias = ParamGrad<P, T>::wide},
                                  M, Fp);
    out.dz = std::move(z);
  }
  if (db1) g.db1 = db1->result(&crops);
  partials = Tensor<C>();  // summed into db1; released before dW2 (it can be M / 4 rows of nF in C)
  if (need.w2) {
    g.dw2 = fused ? fp8_weight_gradient<P, T>(*s.fp8, a_codes.codes, dyq, Shape{F, H}, Shape{Fp, Hp}, device, &crops)
                  : second_weight_gradient<P>(s, da, dy, dyq, &crops);  // da holds a
  }
  return out;
}

}  // namespace

template <class T, class P>
DeviceMlpOutput<T> device_mlp_forward(DeviceMlp<T>& s, const MlpDims& dims, const LayerNormMLPOptions& options,
                                      const Tensor<T>& x, const MlpParams<P>& params) {
  using C = compute_t<T>;
  const auto [M, H, F, n] = dims;
  s.padded = padded_dims<T>(dims, options.fp8);
  const std::int64_t Hp = s.padded.hidden, Fp = s.padded.ffn;
  const Device device = x.device();
  const MlpSharding sharding(options.tensor_parallel);
  const std::int64_t rows = M / sharding.row_factor();  // this rank's rows of x (M: the products')
  s.options = options;
  s.dims = dims;
  s.norm = {.dtype = dtype_v<T>,
            .rows = rows,
            .hidden = H,
            .ld = Hp,
            .centered = options.norm == NormType::layernorm,
            .zero_centered_gamma = options.zero_centered_gamma};
  Resizes<T> pads;
  s.x = pads.add(x.reshape(Shape{rows, H}), Shape{rows, Hp});
  s.gamma = cast<T>(params.gamma);
  if (params.beta) s.beta = cast<T>(*params.beta);
  if (options.fp8) {
    s.fp8.emplace("layernorm_mlp", *options.fp8, device);  // (delayed scaling: ends the state's previous step first)
    s.w1q = quantized_weight(*s.fp8, fp8::Role::kernel1, params.w1, Shape{H, n, F}, Shape{Hp, n, Fp});
    s.w2q = quantized_weight(*s.fp8, fp8::Role::kernel2, params.w2, Shape{F, H}, Shape{Fp, Hp});
  } else {
    s.w1 = pads.add(cast<T>(params.w1).reshape(Shape{H, n, F}), Shape{Hp, n, Fp});
    s.w2 = pads.add(cast<T>(params.w2), Shape{Fp, Hp});
  }
  if (params.b1) s.b1 = pads.add(cast<T>(*params.b1).reshape(Shape{n, F}), Shape{n, Fp});
  if (params.b2) s.b2 = pads.add(cast<T>(*params.b2), Shape{Hp});
  pads.run();
  s.mean = Tensor<C>(Shape{is_layernorm(s) ? rows : 0}, device);
  s.rstd = Tensor<C>(Shape{rows}, device);

  const Tensor<T> h_rows = norm_output(s, is_layernorm(s) ? s.mean.data() : nullptr, s.rstd.data());
  const Tensor<T> hp = sharding.gathered_rows(h_rows);
  const bool save_h = options.recompute == Recompute::save_all;
  Tensor<T> z, a, y(Shape{M, Hp}, device);
  if (s.fp8) {  // h's transposed codes made in the same pass where they are kept for dW1
    const Fp8Codes hq = s.fp8->quantize(fp8::Role::input, dtype_v<T>, hp.data(), M, Hp, true, save_h, true);
    z = Tensor<T>(Shape{M, n * Fp}, device);
    quantized_first_product(s, hq, z);
    if (save_h) {  // its transpose alone
      s.hq = hq;
      s.hq.codes.reset();
    }
  } else {
    FirstProduct<T> first = first_product(s, hp);
    z = first.z;
    a = first.a;
    if (save_h) s.h = hp;
  }
  Fp8Codes aq;
  if (s.fp8 && s.fp8->scales_ahead()) {  // the activation kernel writes a's codes
    const DeviceFp8::Target t = s.fp8->target(fp8::Role::activation, M, Fp, true);
    const cuda::MlpActivationCodes codes{t.codes.codes->data(), t.scale, t.amax};
    cuda::mlp_activation_forward(dtype_v<T>, device.index, activation_form(options), z.data(), nullptr, M, Fp, &codes);
    aq = t.codes;
  } else if (!a.defined()) {
    a = Tensor<T>(Shape{M, Fp}, device);
    cuda::mlp_activation_forward(dtype_v<T>, device.index, activation_form(options), z.data(), a.data(), M, Fp);
  }
  if (s.fp8) {
    if (!aq.codes) aq = s.fp8->quantize(fp8::Role::activation, dtype_v<T>, a.data(), M, Fp, true, false, true);
    s.fp8->product(aq, Fp8Layout::codes, s.w2q, Fp8Layout::transposed, M, Hp, Fp, dtype_v<T>, y.data(),
                   data_or_null(s.b2), 0.0, true);
    // The backward reads W2's and W1's codes, and W1's transpose only where it makes z again.
    s.w2q.transposed.reset();
    if (options.recompute != Recompute::recompute_all) s.w1q.transposed.reset();
  } else {
    product(a, false, s.w2, false, M, Hp, Fp, sharding.adds_replicated_terms() ? data_or_null(s.b2) : nullptr, 0.0,
            y.data());
  }
  if (options.recompute != Recompute::recompute_all) s.z = z;
  return {resized(sharding.summed(y), Shape{rows, H}),
          options.return_layernorm_output ? resized(h_rows, Shape{rows, H}) : Tensor<T>()};
}

template <class T, class P>
DeviceMlpGrads<T, P> device_mlp_backward(DeviceMlp<T>& s, const Tensor<T>& dy_in, const Tensor<T>* dh_out,
                                         const MlpNeeds& need) {
  using C = compute_t<T>;
  const auto [M, H, F, n] = s.dims;
  const std::int64_t Hp = s.padded.hidden, Fp = s.padded.ffn;
  const Device device = dy_in.device();
  const MlpSharding sharding(s.options.tensor_parallel);
  const std::int64_t rows = s.norm.rows;
  const Tensor<T> dy = sharding.gathered_rows(dy_in.reshape(Shape{rows, H}));
  DeviceMlpGrads<T, P> g;
  const bool need_dh = need.x || need.gamma || need.beta;
  // db2 in the norm's backward pass, which reads dy beside dh: unless the node is sharded (dh then has this rank's
  // rows, or is summed over the ranks after dy was read).
  const bool db2_in_norm = need_dh && !sharding.sharded();
  if (need.b2 && !db2_in_norm) g.db2 = column_sums<P>(dy, H, Shape{H});
  const bool need_dz = need_dh || need.w1 || need.b1;
  if (!need_dz && !need.w2) return g;

  // Peak memory: every temporary is released once its last reader is queued (the pool reuses it in stream order),
  // and the saved h and z go with them. The activation's backward writes dz over z and a (recomputed, for dW2) over
  // da (each element read, then written, by the same thread), so it adds only da's memory.
  // h (with fp8: its transposed codes, for dW1) and z, recomputed where the policy did not keep them.
  Tensor<T> h = s.h, z = s.z;
  Fp8Codes hq = s.hq;
  const bool recompute_hq = s.fp8 && !hq.transposed && need.w1;
  if (!z.defined() || recompute_hq || (!s.fp8 && !h.defined())) {
    const Tensor<T> hp = sharding.gathered_rows(norm_output(s, nullptr, nullptr));
    if (!s.fp8) h = hp;
    if (recompute_hq) hq = s.fp8->quantize(fp8::Role::input, dtype_v<T>, hp.data(), M, Hp, false, true, false);
    if (!z.defined()) z = first_product(s, hp).z;
  }
  s.z = Tensor<T>();  // z's memory becomes dz below
  const Tensor<T> dyp = resized(dy, Shape{M, Hp});
  Fp8Codes dyq;  // fp8: dy as da's product reads it and as dW2's does
  if (s.fp8) dyq = s.fp8->quantize(fp8::Role::grad_output, dtype_v<T>, dyp.data(), M, Hp, need_dz, need.w2, true);
  if (!need_dz) {  // dW2 alone
    Tensor<T> a(Shape{M, Fp}, device);
    cuda::mlp_activation_forward(dtype_v<T>, device.index, activation_form(s.options), z.data(), a.data(), M, Fp);
    g.dw2 = second_weight_gradient<P>(s, a, dyp, dyq);
    return g;
  }
  // The gradients that come out padded (db1, dW2, dW1, dx) are cropped together at the end, in one launch.
  Resizes<T> crops;
  // fp8: dzq holds dz as dh's product reads it and as dW1's does.
  auto [dz, dzq] = activation_backward<P>(s, std::move(z), dyp, dyq, need, need_dh, g, crops);
  dyq = {};
  if (s.fp8 && dz.defined()) {  // (current scaling: dz's scale from its amax)
    dzq = s.fp8->quantize(fp8::Role::grad_hidden, dtype_v<T>, dz.data(), M, n * Fp, need_dh, need.w1, true);
    dz = Tensor<T>();
  }
  const auto weight1_gradient = [&] {
    if (need.w1) {
      const Shape shape{H, n, F}, padded_shape{Hp, n, Fp};
      g.dw1 = s.fp8 ? fp8_weight_gradient<P, T>(*s.fp8, hq, dzq, shape, padded_shape, device, &crops)
                    : weight_gradient<P>(h, dz, M, Hp, n * Fp, shape, padded_shape, &crops);
    }
    h = Tensor<T>();
    s.h = Tensor<T>();
    hq = {};
    s.hq = {};
  };
  // dh, padded, into a fresh tensor: the product adds it to the returned h's gradient where there is one (a sharded
  // node adds that to the ranks' sum instead).
  const Tensor<T>* dh_addend = sharding.sharded() ? nullptr : dh_out;
  const auto input_gradient = [&] {
    Tensor<T> dh;
    if (!dh_addend) dh = Tensor<T>(Shape{M, Hp}, device);
    else if (Hp == H) dh = dh_addend->reshape(Shape{M, H}).clone();
    else dh = resized(dh_addend->reshape(Shape{M, H}), Shape{M, Hp});
    if (s.fp8) {
      s.fp8->product(dzq, Fp8Layout::codes, s.w1q, Fp8Layout::codes, M, Hp, n * Fp, dtype_v<T>, dh.data(), nullptr,
                     dh_addend ? 1.0 : 0.0, false);
    } else {
      product(dz, false, s.w1, true, M, Hp, n * Fp, nullptr, dh_addend ? 1.0 : 0.0, dh.data());
    }
    return dh;
  };
  Tensor<T> dh;
  if (!need_dh) {
    weight1_gradient();
    crops.run();
    return g;
  }
  if (sharding.sharded()) {
    // The ranks' dh summed on a side stream while dW1's product runs on this one (then this stream waits for it).
    const Tensor<T> dh_partial = input_gradient();
    const cuda::SideStream side(device.index);
    side.wait_for_current();
    {
      const cuda::StreamGuard on_side(side.stream(), device.index);
      dh = sharding.summed(dh_partial);
    }
    weight1_gradient();
    side.current_waits();
    if (dh_out) add_to(dh, resized(dh_out->reshape(Shape{rows, H}), Shape{rows, Hp}));
  } else {
    weight1_gradient();
    dh = input_gradient();
  }
  dz = Tensor<T>();
  dzq = {};
  // dx rounds to T once (padded like x, then cropped); dγ, dβ and db2 are summed in C and rounded once to P.
  Tensor<T> dx;
  if (need.x) dx = Tensor<T>(Shape{rows, Hp}, device);
  std::optional<ParamGrad<P, T>> dgamma, dbeta, db2;
  if (need.gamma) dgamma.emplace(Shape{H}, Shape{H}, device);
  if (need.beta) dbeta.emplace(Shape{H}, Shape{H}, device);
  if (need.b2 && db2_in_norm) db2.emplace(Shape{H}, Shape{H}, device);
  cuda::NormBackwardArgs args{.x = s.x.data(),
                              .gamma = s.gamma.data(),
                              .dy = dh.data(),
                              .mean = is_layernorm(s) ? s.mean.data() : nullptr,
                              .rstd = s.rstd.data(),
                              .dx = need.x ? dx.data() : nullptr,
                              .dgamma = dgamma ? dgamma->data() : nullptr,
                              .dbeta = dbeta ? dbeta->data() : nullptr,
                              .other = db2 ? dyp.data() : nullptr,
                              .other_sums = db2 ? db2->data() : nullptr,
                              .wide_parameter_grads = ParamGrad<P, T>::wide};
  Tensor<C> partials(Shape{cuda::norm_backward_partials(s.norm, args)}, device);
  args.partials = partials.data();
  cuda::norm_backward(s.norm, args, device.index);
  if (need.x) g.dx = crops.add(dx, Shape{rows, H});
  crops.run();
  if (dgamma) g.dgamma = sharding.row_sums_over_ranks(dgamma->result());
  if (dbeta) g.dbeta = sharding.row_sums_over_ranks(dbeta->result());
  if (db2) g.db2 = db2->result();
  if (sharding.sharded()) cuda::SideStream(device.index).wait_for_current();  // (dh was made on the side stream)
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
