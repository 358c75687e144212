// matmul as batched GEMMs.
//
// Each operand is a stack of matrices, [batch..., M, K] and [batch..., K, N]; a vector is a [1, K] or [K, 1] matrix
// whose unit axis the result drops. The batch axes broadcast, so output matrix i reads matrix a(i) of A and b(i)
// of B, and forward and backward are three batched GEMMs over the same plan, the transposes passed as flags:
//   C_i = A_a(i) · B_b(i),    dA_a(i) += dC_i · B_b(i)ᵀ,    dB_b(i) += A_a(i)ᵀ · dC_i.
// The sums over i that share a(i) (or b(i)) are the reduction over broadcast batch axes. When B is one matrix and
// A a whole stack (x · W in a linear layer), the stack is a single tall GEMM in all three.
// Saved: both input values (shared, not copied). bf16/f16 are widened to f32 once per tensor, and every result is
// rounded once.
#include "ops/matmul.hpp"

#include <numeric>

#include "autodiff/custom_op.hpp"
#include "ops/broadcast.hpp"
#include "ops/gemm.hpp"

namespace tapegrad {

namespace {

struct MatmulPlan {
  Shape out;  // the result's shape, without the axes of vector operands
  std::int64_t M = 0, K = 0, N = 0;
  std::int64_t a_matrices = 0, b_matrices = 0, c_matrices = 0;  // stack sizes
  std::vector<std::int64_t> a_index, b_index, c_index;  // the matrix of A, B and C that each output matrix uses
};

Shape batch_of(const Shape& s) {
  const auto dims = s.dims();
  return s.rank() > 2 ? Shape(dims.first(dims.size() - 2)) : Shape{};
}

// For each matrix of a stack broadcast from `batch` to `out_batch`, the operand matrix it reads.
std::vector<std::int64_t> matrix_index(const Shape& batch, const Shape& out_batch) {
  std::vector<std::int64_t> index(static_cast<std::size_t>(out_batch.numel()), 0);
  if (batch.numel() == static_cast<std::int64_t>(index.size())) {
    std::iota(index.begin(), index.end(), 0);  // no broadcast (a single matrix included)
  } else if (batch.numel() > 1) {
    // The operand's matrix numbers, broadcast like the operand.
    const Tensor<double> numbers = expand_to(arange<double>(batch.numel()).reshape(batch), out_batch);
    std::copy(numbers.span().begin(), numbers.span().end(), index.begin());
  }
  return index;
}

MatmulPlan plan_matmul(const Shape& a, const Shape& b) {
  check(a.rank() >= 1 && b.rank() >= 1, "matmul", "both operands need at least one dimension, got shapes ", a,
        " and ", b);
  MatmulPlan p;
  p.K = a.dim(-1);
  const std::int64_t kb = b.dim(b.rank() >= 2 ? -2 : -1);
  check(p.K == kb, "matmul", "shapes ", a, " and ", b, " do not align: ", p.K, " != ", kb);
  p.M = a.rank() >= 2 ? a.dim(-2) : 1;
  p.N = b.rank() >= 2 ? b.dim(-1) : 1;
  const Shape a_batch = batch_of(a), b_batch = batch_of(b);
  Shape batch;
  try {
    batch = broadcast_shapes(a_batch, b_batch, "matmul");
  } catch (const Error&) {
    throw Error(detail::concat("matmul: batch dimensions ", a_batch, " and ", b_batch, " of shapes ", a, " and ", b,
                               " cannot be broadcast together"));
  }
  std::vector<std::int64_t> out = batch.to_vector();
  if (a.rank() >= 2) out.push_back(p.M);
  if (b.rank() >= 2) out.push_back(p.N);
  p.out = Shape(out);
  p.a_matrices = a_batch.numel();
  p.b_matrices = b_batch.numel();
  p.c_matrices = batch.numel();
  p.a_index = matrix_index(a_batch, batch);
  p.b_index = matrix_index(b_batch, batch);
  p.c_index = matrix_index(batch, batch);
  return p;
}

bool is_identity(const std::vector<std::int64_t>& index) {
  for (std::size_t i = 0; i < index.size(); ++i) {
    if (index[i] != static_cast<std::int64_t>(i)) return false;
  }
  return true;
}

// A stack of `matrices` matrices, each stored rows × cols, of which output matrix i reads matrix index[i].
template <class Ptr> struct Stack {
  Ptr data;
  std::int64_t matrices, rows, cols;
  const std::vector<std::int64_t>& index;
  Transpose transpose = Transpose::no;
  std::int64_t size() const { return rows * cols; }
  Ptr at(std::size_t i) const { return data + index[i] * size(); }
};

// Z_z(i) = Σ op(X_x(i)) · op(Y_y(i)) over the output matrices i that write Z matrix z(i); a Z matrix that none
// writes is zero.
template <class C> void batched_gemm(const Stack<const C*>& x, const Stack<const C*>& y, const Stack<C*>& z) {
  const std::int64_t m = z.rows, n = z.cols, k = x.transpose == Transpose::yes ? x.rows : x.cols;
  const std::int64_t count = static_cast<std::int64_t>(z.index.size());
  // Consecutive untransposed X matrices form one tall matrix, and so do Z's: with Y shared, one GEMM.
  if (y.matrices == 1 && x.transpose == Transpose::no && is_identity(x.index) && is_identity(z.index)) {
    gemm<C>(Transpose::no, y.transpose, m * count, n, k, C(1), x.data, x.cols, y.data, y.cols, C(0), z.data, n);
    return;
  }
  // With Z shared, X stored transposed and Y untransposed, both whole stacks: the sum over i is a longer k.
  if (z.matrices == 1 && x.transpose == Transpose::yes && y.transpose == Transpose::no && is_identity(x.index) &&
      is_identity(y.index)) {
    gemm<C>(Transpose::yes, Transpose::no, m, n, k * count, C(1), x.data, x.cols, y.data, y.cols, C(0), z.data, n);
    return;
  }
  std::vector<bool> written(static_cast<std::size_t>(z.matrices), false);
  for (std::size_t i = 0; i < z.index.size(); ++i) {
    const auto zi = static_cast<std::size_t>(z.index[i]);
    gemm<C>(x.transpose, y.transpose, m, n, k, C(1), x.at(i), x.cols, y.at(i), y.cols, written[zi] ? C(1) : C(0),
            z.at(i), n);
    written[zi] = true;
  }
  for (std::size_t zi = 0; zi < written.size(); ++zi) {
    if (!written[zi]) std::fill_n(z.data + static_cast<std::int64_t>(zi) * z.size(), z.size(), C(0));
  }
}

template <class T> struct MatmulSaved {
  MatmulPlan plan;
  Tensor<T> a, b;
};

template <class T> Tensor<T> matmul_forward(MatmulSaved<T>& s, const Tensor<T>& a, const Tensor<T>& b) {
  using C = compute_t<T>;
  const MatmulPlan& p = s.plan;
  const Tensor<C> a_c = cast<C>(a), b_c = cast<C>(b);  // no copy for f32/f64
  Tensor<C> c(p.out);
  batched_gemm<C>({a_c.data(), p.a_matrices, p.M, p.K, p.a_index},  //
                  {b_c.data(), p.b_matrices, p.K, p.N, p.b_index},  //
                  {c.data(), p.c_matrices, p.M, p.N, p.c_index});
  s.a = a;
  s.b = b;
  return cast<T>(c);
}

template <class T>
std::tuple<Tensor<T>, Tensor<T>> matmul_backward(const MatmulSaved<T>& s, const NeedsGrad& needs,
                                                 const Tensor<T>& dc) {
  using C = compute_t<T>;
  const MatmulPlan& p = s.plan;
  const Tensor<C> dc_c = cast<C>(dc);
  const Stack<const C*> dc_stack{dc_c.data(), p.c_matrices, p.M, p.N, p.c_index};
  Tensor<T> da, db;
  if (needs[0]) {  // dA = dC · Bᵀ
    const Tensor<C> b_c = cast<C>(s.b);
    Tensor<C> da_c(s.a.shape());
    batched_gemm<C>(dc_stack, {b_c.data(), p.b_matrices, p.K, p.N, p.b_index, Transpose::yes},
                    {da_c.data(), p.a_matrices, p.M, p.K, p.a_index});
    da = cast<T>(da_c);
  }
  if (needs[1]) {  // dB = Aᵀ · dC
    const Tensor<C> a_c = cast<C>(s.a);
    Tensor<C> db_c(s.b.shape());
    batched_gemm<C>({a_c.data(), p.a_matrices, p.M, p.K, p.a_index, Transpose::yes}, dc_stack,
                    {db_c.data(), p.b_matrices, p.K, p.N, p.b_index});
    db = cast<T>(db_c);
  }
  return {da, db};
}

}  // namespace

template <class T> Var<T> matmul(const Var<T>& a, const Var<T>& b) {
  check_cpu_inputs("matmul", a, b);  // no GPU path yet
  MatmulPlan plan = plan_matmul(a.shape(), b.shape());
  return custom_op<MatmulSaved<T>>(
      "matmul",
      [&](MatmulSaved<T>& s, const Tensor<T>& x, const Tensor<T>& y) {
        s.plan = std::move(plan);
        return matmul_forward(s, x, y);
      },
      matmul_backward<T>, a, b);
}

#define TAPEGRAD_INSTANTIATE_MATMUL(T) template Var<T> matmul<T>(const Var<T>&, const Var<T>&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_MATMUL)

}  // namespace tapegrad
