// Issue 26's comparison on the CPU: two losses as research code writes them with tapegrad's primitive ops, as one
// fused node (the LN-MLP loss only), and as a hand-written Eigen adjoint (this file's own code: the forward and every
// gradient by hand, Eigen's products, buffers allocated once), each a forward + backward timed round-robin.
//   LN-MLP: L = Σ (y + b2) ⊙ R with y = gelu_tanh(layernorm(x; γ, β) · W1 + b1) · W2, at (M, H, F) = (64, 64, 256)
//     and (256, 256, 1024); gradients of x, γ, β, W1, b1, W2, b2.
//   chain: L = Σ (A · B) · C for N × N matrices, N = 64 and 256; gradients of A, B, C (the adjoint multiplies by the
//     matrix of ones as autodiff does: two products forward, four backward).
// In f64 and f32; "over_adjoint" is the median over the adjoint's. Run with --threads 1 for the figures, with
// the environment's OpenBLAS kernels and again with OPENBLAS_CORETYPE set to the best for the CPU.
#include <Eigen/Core>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench.hpp"
#include "tapegrad/tapegrad.hpp"

namespace bench {

namespace {

using namespace tapegrad;

template <class T> using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T> using Row = Eigen::Matrix<T, 1, Eigen::Dynamic>;
template <class T> using Col = Eigen::Matrix<T, Eigen::Dynamic, 1>;

template <class T> Mat<T> matrix_of(const Tensor<T>& t, Eigen::Index rows, Eigen::Index cols) {
  return Eigen::Map<const Mat<T>>(t.data(), rows, cols);
}

// The LN-MLP loss's inputs, its gradients and the forward's intermediates, by hand.
template <class T> struct MLPAdjoint {
  Mat<T> x, w1, w2, r;
  Row<T> gamma, beta, b1, b2;
  // forward
  Col<T> rstd;
  Mat<T> xhat, h, z, t, a, y;
  T loss = 0;
  // backward
  Mat<T> dw1, dw2, da, dz, dh, dxhat, dx;
  Row<T> dgamma, dbeta, db1, db2;

  void forward_backward() {
    constexpr T eps = T(1e-5), k0 = T(0.7978845608028654), k1 = T(0.044715);
    const auto H = static_cast<T>(x.cols());
    // h = LN(x) = x̂ ⊙ γ + β, x̂ = (x - mean) · rstd per row
    xhat = x.colwise() - x.rowwise().mean();
    rstd = ((xhat.array().square().rowwise().sum() / H) + eps).rsqrt().matrix();
    xhat.array().colwise() *= rstd.array();
    h = (xhat.array().rowwise() * gamma.array()).rowwise() + beta.array();
    // z = h · W1 + b1, a = gelu_tanh(z) = z (1 + t) / 2 with t = tanh(k0 (z + k1 z³))
    z.noalias() = h * w1;
    z.rowwise() += b1;
    t = (k0 * (z.array() + k1 * z.array().cube())).tanh().matrix();
    a = (T(0.5) * z.array() * (T(1) + t.array())).matrix();
    // y = a · W2; L = Σ (y + b2) ⊙ R
    y.noalias() = a * w2;
    loss = ((y.rowwise() + b2).array() * r.array()).sum();
    // backward: dy = R
    db2 = r.colwise().sum();
    dw2.noalias() = a.transpose() * r;
    da.noalias() = r * w2.transpose();
    // a' = (1 + t) / 2 + z (1 - t²) k0 (1 + 3 k1 z²) / 2
    dz = (da.array() * (T(0.5) * (T(1) + t.array()) + T(0.5) * z.array() * (T(1) - t.array().square()) * k0 *
                                                          (T(1) + T(3) * k1 * z.array().square())))
             .matrix();
    db1 = dz.colwise().sum();
    dw1.noalias() = h.transpose() * dz;
    dh.noalias() = dz * w1.transpose();
    dgamma = (dh.array() * xhat.array()).colwise().sum().matrix();
    dbeta = dh.colwise().sum();
    // dx = rstd (dx̂ - mean(dx̂) - x̂ mean(dx̂ ⊙ x̂)) per row
    dxhat = (dh.array().rowwise() * gamma.array()).matrix();
    const Col<T> mean_dxhat = dxhat.rowwise().mean();
    const Col<T> mean_dxhat_xhat = (dxhat.array() * xhat.array()).rowwise().sum().matrix() / H;
    dx = ((dxhat.colwise() - mean_dxhat).array() - xhat.array().colwise() * mean_dxhat_xhat.array()).matrix();
    dx.array().colwise() *= rstd.array();
  }
};

template <class T> struct ChainAdjoint {
  Mat<T> a, b, c, ones, p, q, dp, da, db, dc;
  T loss = 0;
  void forward_backward() {
    p.noalias() = a * b;
    q.noalias() = p * c;
    loss = q.sum();
    dp.noalias() = ones * c.transpose();
    dc.noalias() = p.transpose() * ones;
    da.noalias() = dp * b.transpose();
    db.noalias() = a.transpose() * dp;
  }
};

struct Form {
  const char* name;
  Body body;
};

template <class T> void report(const char* loss, const std::vector<Form>& forms, const Shape& shape, const char* key) {
  std::vector<Body> bodies;
  for (const Form& f : forms) bodies.push_back(f.body);
  const std::vector<Timing> t = measure(bodies);
  for (std::size_t k = 0; k < forms.size(); ++k) {
    JsonLine("adjoint")
        .str("loss", loss)
        .str("form", forms[k].name)
        .shape(shape, key)
        .str("dtype", std::string(dtype_name(dtype_v<T>)))
        .timing(t[k])
        .num("over_adjoint", t[k].median_ns / t[0].median_ns);
  }
}

// A forward + backward of `loss` on a fresh tape, the leaves' gradients cleared afterwards (untimed).
template <class T> Body recorded(std::function<Var<T>()> loss, std::vector<Var<T>> leaves) {
  auto tape = std::make_shared<std::unique_ptr<Tape>>();
  return {[tape, loss] {
            *tape = std::make_unique<Tape>();
            TapeScope scope(**tape);
            backward(loss());
          },
          [tape, leaves] {
            tape->reset();
            for (Var<T> v : leaves) v.zero_grad();
          }};
}

template <class T> void ln_mlp(std::int64_t M, std::int64_t H, std::int64_t F) {
  const Tensor<T> x = randn<T>({M, H}, 1), gamma = randn<T>({H}, 2, 1.0, 0.1), beta = randn<T>({H}, 3, 0.0, 0.1);
  const Tensor<T> w1 = randn<T>({H, F}, 4, 0.0, 1.0 / std::sqrt(double(H)));
  const Tensor<T> w2 = randn<T>({F, H}, 5, 0.0, 1.0 / std::sqrt(double(F)));
  const Tensor<T> b1 = randn<T>({F}, 6, 0.0, 0.1), b2 = randn<T>({H}, 7, 0.0, 0.1), r = randn<T>({M, H}, 8);

  auto by_hand = std::make_shared<MLPAdjoint<T>>();
  by_hand->x = matrix_of(x, M, H);
  by_hand->w1 = matrix_of(w1, H, F);
  by_hand->w2 = matrix_of(w2, F, H);
  by_hand->r = matrix_of(r, M, H);
  by_hand->gamma = matrix_of(gamma, 1, H);
  by_hand->beta = matrix_of(beta, 1, H);
  by_hand->b1 = matrix_of(b1, 1, F);
  by_hand->b2 = matrix_of(b2, 1, H);

  const Var<T> xv = param(x), gv = param(gamma), bv = param(beta), w1v = param(w1), w2v = param(w2);
  const Var<T> b1v = param(b1), b2v = param(b2), rv = constant(r);
  const Var<T> w1_node = param(w1.reshape(Shape{H, 1, F}));
  const std::vector<Var<T>> leaves{xv, gv, bv, w1v, w2v, b1v, b2v, w1_node};
  const auto primitive = [=] {
    const Var<T> h = layernorm(xv, gv, bv);
    const Var<T> a = gelu_tanh(matmul(h, w1v) + b1v);
    return sum((matmul(a, w2v) + b2v) * rv);
  };
  const auto node = [=] {
    const Var<T> y = layernorm_mlp(xv, gv, bv, {w1_node, w2v}, {reshape(b1v, {1, F}), b2v},
                                   {.activation = Activation::gelu})
                         .y;
    return sum(y * rv);
  };
  report<T>("ln_mlp",
            {{"adjoint", {[by_hand] { by_hand->forward_backward(); }}},
             {"primitive", recorded<T>(primitive, leaves)},
             {"node", recorded<T>(node, leaves)}},
            Shape{M, H, F}, "mhf");
}

template <class T> void chain(std::int64_t N) {
  const Tensor<T> a = randn<T>({N, N}, 11), b = randn<T>({N, N}, 12), c = randn<T>({N, N}, 13);
  auto by_hand = std::make_shared<ChainAdjoint<T>>();
  by_hand->a = matrix_of(a, N, N);
  by_hand->b = matrix_of(b, N, N);
  by_hand->c = matrix_of(c, N, N);
  by_hand->ones = Mat<T>::Ones(N, N);
  const Var<T> av = param(a), bv = param(b), cv = param(c);
  report<T>("chain",
            {{"adjoint", {[by_hand] { by_hand->forward_backward(); }}},
             {"tapegrad", recorded<T>([=] { return sum(matmul(matmul(av, bv), cv)); }, {av, bv, cv})}},
            Shape{N}, "n");
}

}  // namespace

void adjoint() {
  for (const auto [M, H, F] : {std::array<std::int64_t, 3>{64, 64, 256}, {256, 256, 1024}}) {
    ln_mlp<double>(M, H, F);
    ln_mlp<float>(M, H, F);
  }
  for (std::int64_t N : {64, 256}) {
    chain<double>(N);
    chain<float>(N);
  }
}

}  // namespace bench
