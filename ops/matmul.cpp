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
//
// On the GPU the same products are cuBLASLt batched GEMMs (cuda/blaslt.hpp), bf16/f16 read as they are. A stack of
// one matrix is shared by every product (batch stride 0) and never copied; a stack broadcast along only some batch
// axes is expanded first. The gradient of a stack that several products share is computed per product and summed
// down with sum_to, except for the shared B of x · W: Aᵀ · dC over all products is one GEMM over the stacked rows.
// (Such a per-product bf16/f16 gradient is rounded before the sum, as in PyTorch; every other result once.)
#include "tapegrad/ops/matmul.hpp"

#include <numeric>

#include "tapegrad/autodiff/custom_op.hpp"
#include "tapegrad/cuda/blaslt.hpp"
#include "tapegrad/ops/detail/broadcast.hpp"
#include "tapegrad/ops/detail/gemm.hpp"
#include "tapegrad/ops/detail/matmul_vjp.hpp"
#include "tapegrad/ops/reduce.hpp"
#include "tapegrad/tensor/eigen.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"

namespace tapegrad {

namespace {

struct MatmulPlan {
  Shape a_shape, b_shape;  // the operands'
  Shape out;               // the result's shape, without the axes of vector operands
  std::int64_t M = 0, K = 0, N = 0;
  Shape batch;             // the broadcast batch axes
  Shape a_stack, b_stack;  // the operands as matrix stacks, [a batch..., M, K] and [b batch..., K, N]
  std::int64_t a_matrices = 0, b_matrices = 0, c_matrices = 0;  // stack sizes
  std::vector<std::int64_t> a_index, b_index, c_index;  // the matrix of A, B and C that each output matrix uses
};

Shape batch_of(const Shape& s) {
  const auto dims = s.dims();
  return s.rank() > 2 ? Shape(dims.first(dims.size() - 2)) : Shape{};
}

Shape with_matrix(const Shape& batch, std::int64_t rows, std::int64_t cols) {
  std::vector<std::int64_t> dims = batch.to_vector();
  dims.push_back(rows);
  dims.push_back(cols);
  return Shape(dims);
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
  p.a_shape = a;
  p.b_shape = b;
  p.K = a.dim(-1);
  const std::int64_t kb = b.dim(b.rank() >= 2 ? -2 : -1);
  check(p.K == kb, "matmul", "shapes ", a, " and ", b, " do not align: ", p.K, " != ", kb);
  p.M = a.rank() >= 2 ? a.dim(-2) : 1;
  p.N = b.rank() >= 2 ? b.dim(-1) : 1;
  const Shape a_batch = batch_of(a), b_batch = batch_of(b);
  check(broadcastable(std::array{a_batch, b_batch}), "matmul", "batch dimensions ", a_batch, " and ", b_batch,
        " of shapes ", a, " and ", b, " cannot be broadcast together");
  const Shape batch = broadcast_shapes(a_batch, b_batch, "matmul");
  std::vector<std::int64_t> out = batch.to_vector();
  if (a.rank() >= 2) out.push_back(p.M);
  if (b.rank() >= 2) out.push_back(p.N);
  p.out = Shape(out);
  p.batch = batch;
  p.a_stack = with_matrix(a_batch, p.M, p.K);
  p.b_stack = with_matrix(b_batch, p.K, p.N);
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
  Shape bias_shape;  // with a bias: [N]
};

// A stack of matrices on the device as a batched GEMM reads it: `count` matrices (1: one shared by every product),
// each stored rows × cols.
template <class T> struct DeviceStack {
  const T* data;
  std::int64_t count, rows, cols;
  Transpose transpose = Transpose::no;
};

// z_i = op(x_i) · op(y_i) (+ bias, N values added to each row in the epilogue) for each of `products` products, into
// the whole stack z.
template <class T>
void device_products(std::int64_t products, const DeviceStack<T>& x, const DeviceStack<T>& y, T* z, Device device,
                     const T* bias = nullptr) {
  const bool tx = x.transpose == Transpose::yes, ty = y.transpose == Transpose::yes;
  const std::int64_t m = tx ? x.cols : x.rows, n = ty ? y.rows : y.cols;
  cuda::GemmArgs g{.dtype = dtype_v<T>,
                   .M = m,
                   .N = n,
                   .K = tx ? x.rows : x.cols,
                   .batch = products,
                   .a = {x.data, x.cols, x.count == 1 ? 0 : x.rows * x.cols, tx},
                   .b = {y.data, y.cols, y.count == 1 ? 0 : y.rows * y.cols, ty},
                   .c = {z, n, m * n},
                   .bias = bias};
  // With y shared, consecutive untransposed x matrices form one tall matrix, and so do z's: a single GEMM.
  if (y.count == 1 && x.count == products && !tx) {
    g.M *= products;
    g.batch = 1;
  }
  cuda::gemm(g, device.index);
}

// An operand ready for device_products: itself when it has one matrix per product or one for all of them, else
// expanded along the batch axes it broadcasts over.
template <class T> struct DeviceOperand {
  Tensor<T> values;
  std::int64_t count, rows, cols;
  DeviceStack<T> stack(Transpose transpose) const { return {values.data(), count, rows, cols, transpose}; }
};

template <class T>
DeviceOperand<T> device_operand(const Tensor<T>& t, const Shape& stack, std::int64_t matrices, const MatmulPlan& p) {
  const std::int64_t rows = stack.dim(-2), cols = stack.dim(-1);
  if (matrices == 1 || matrices == p.c_matrices) return {t, matrices, rows, cols};
  return {expand_to(t.reshape(stack), with_matrix(p.batch, rows, cols)), p.c_matrices, rows, cols};
}

// The gradient of an operand stack of shape `stack` (`matrices` matrices) whose matrix for product i receives
// op(x_i) · op(y_i), summed over the products that share a matrix.
template <class T>
Tensor<T> device_gradient(const Shape& stack, std::int64_t matrices, const MatmulPlan& p, const DeviceStack<T>& x,
                          const DeviceStack<T>& y, Device device) {
  const std::int64_t products = p.c_matrices;
  if (matrices == products) {  // nothing shared
    Tensor<T> grad(stack, device);
    device_products(products, x, y, grad.data(), device);
    return grad;
  }
  if (matrices == 1 && x.transpose == Transpose::yes && y.transpose == Transpose::no && x.count == products &&
      y.count == products) {
    // Σ_i x_iᵀ · y_i is one product over the stacked rows: [products · rows, cols] matrices.
    Tensor<T> grad(stack, device);
    device_products<T>(1, {x.data, 1, products * x.rows, x.cols, Transpose::yes},
                       {y.data, 1, products * y.rows, y.cols}, grad.data(), device);
    return grad;
  }
  Tensor<T> per_product(with_matrix(p.batch, stack.dim(-2), stack.dim(-1)), device);
  device_products(products, x, y, per_product.data(), device);
  return sum_to(per_product, stack);
}

template <class T>
Tensor<T> device_forward(const MatmulPlan& p, const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& bias) {
  const DeviceOperand<T> x = device_operand(a, p.a_stack, p.a_matrices, p),
                         y = device_operand(b, p.b_stack, p.b_matrices, p);
  Tensor<T> c(p.out, a.device());
  device_products(p.c_matrices, x.stack(Transpose::no), y.stack(Transpose::no), c.data(), a.device(),
                  bias.defined() ? bias.data() : nullptr);
  return c;
}

template <class T>
std::tuple<Tensor<T>, Tensor<T>> device_backward(const MatmulPlan& p, const Tensor<T>& a_value,
                                                 const Tensor<T>& b_value, const NeedsGrad& needs,
                                                 const Tensor<T>& dc) {
  const DeviceStack<T> dc_stack{dc.data(), p.c_matrices, p.M, p.N};
  Tensor<T> da, db;
  if (needs[0]) {  // dA = dC · Bᵀ
    const DeviceOperand<T> b = device_operand(b_value, p.b_stack, p.b_matrices, p);
    da = device_gradient(p.a_stack, p.a_matrices, p, dc_stack, b.stack(Transpose::yes), dc.device())
             .reshape(p.a_shape);
  }
  if (needs[1]) {  // dB = Aᵀ · dC
    const DeviceOperand<T> a = device_operand(a_value, p.a_stack, p.a_matrices, p);
    db = device_gradient(p.b_stack, p.b_matrices, p, a.stack(Transpose::yes), dc_stack, dc.device())
             .reshape(p.b_shape);
  }
  return {da, db};
}

template <class T>
Tensor<T> host_forward(const MatmulPlan& p, const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& bias) {
  using C = compute_t<T>;
  const Tensor<C> a_c = cast<C>(a), b_c = cast<C>(b);  // no copy for f32/f64
  Tensor<C> c(p.out);
  batched_gemm<C>({a_c.data(), p.a_matrices, p.M, p.K, p.a_index},  //
                  {b_c.data(), p.b_matrices, p.K, p.N, p.b_index},  //
                  {c.data(), p.c_matrices, p.M, p.N, p.c_index});
  if (bias.defined()) {  // (in the compute type, before the one rounding, as a GPU's epilogue adds it)
    const Tensor<C> bias_c = cast<C>(bias);
    const C* add = bias_c.data();
    C* out = c.data();
    parallel_for(p.N > 0 ? c.numel() / p.N : 0, p.N, [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t r = first; r < last; ++r) {
        for (std::int64_t j = 0; j < p.N; ++j) out[r * p.N + j] += add[j];
      }
    });
  }
  return cast<T>(c);
}

template <class T>
std::tuple<Tensor<T>, Tensor<T>> host_backward(const MatmulPlan& p, const Tensor<T>& a, const Tensor<T>& b,
                                               const NeedsGrad& needs, const Tensor<T>& dc) {
  using C = compute_t<T>;
  const Tensor<C> dc_c = cast<C>(dc);
  const Stack<const C*> dc_stack{dc_c.data(), p.c_matrices, p.M, p.N, p.c_index};
  Tensor<T> da, db;
  if (needs[0]) {  // dA = dC · Bᵀ
    const Tensor<C> b_c = cast<C>(b);
    Tensor<C> da_c(p.a_shape);
    batched_gemm<C>(dc_stack, {b_c.data(), p.b_matrices, p.K, p.N, p.b_index, Transpose::yes},
                    {da_c.data(), p.a_matrices, p.M, p.K, p.a_index});
    da = cast<T>(da_c);
  }
  if (needs[1]) {  // dB = Aᵀ · dC
    const Tensor<C> a_c = cast<C>(a);
    Tensor<C> db_c(p.b_shape);
    batched_gemm<C>({a_c.data(), p.a_matrices, p.M, p.K, p.a_index, Transpose::yes}, dc_stack,
                    {db_c.data(), p.b_matrices, p.K, p.N, p.b_index});
    db = cast<T>(db_c);
  }
  return {da, db};
}

// The plan's three products on the device where the tensors live: C = A·B, and the gradients dA = dC·Bᵀ and
// dB = Aᵀ·dC, each summed over the batch axes its operand was broadcast along.
template <class T>
Tensor<T> product(const MatmulPlan& p, const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& bias = {}) {
  return by_device(
      "matmul", a.device(), [&] { return host_forward(p, a, b, bias); },
      [&](auto) { return device_forward(p, a, b, bias); });
}
// (Each gradient reads only the other operand: the one asked for may be empty.)
template <class T>
std::tuple<Tensor<T>, Tensor<T>> gradients(const MatmulPlan& p, const Tensor<T>& a, const Tensor<T>& b,
                                           const NeedsGrad& needs, const Tensor<T>& dc) {
  return by_device(
      "matmul", dc.device(), [&] { return host_backward(p, a, b, needs, dc); },
      [&](auto) { return device_backward(p, a, b, needs, dc); });
}
template <class T> Tensor<T> operand_gradient(const MatmulPlan& p, int operand, const Tensor<T>& other,
                                              const Tensor<T>& dc) {
  const bool a_grad = operand == 0;
  const auto grads = a_grad ? gradients(p, Tensor<T>(), other, NeedsGrad({true, false}), dc)
                            : gradients(p, other, Tensor<T>(), NeedsGrad({false, true}), dc);
  return a_grad ? std::get<0>(grads) : std::get<1>(grads);
}

template <class T> Var<T> matmul_of_plan(const MatmulPlan& p, const Var<T>& a, const Var<T>& b);

// The recorded backward (create_graph): dA = dC·Bᵀ and dB = Aᵀ·dC each as a node of its own, run as the plain
// backward runs them (transposes as GEMM flags, never copies). Each is bilinear, and its derivatives are products of
// the same three kinds: for dA = dC·Bᵀ at cotangent U (A's shape), ∂dC = U·B and ∂B = Uᵀ·dC; for dB = Aᵀ·dC at U
// (B's shape), ∂A = dC·Uᵀ and ∂dC = A·U.
template <class T>
Var<T> operand_gradient_node(const MatmulPlan& p, int operand, const Var<T>& other, const Var<T>& dc) {
  struct Saved {
    Tensor<T> other, dc;
  };
  // (first, second) are the node's inputs: (dC, B) for operand 0, (A, dC) for operand 1.
  const bool a_grad = operand == 0;
  const auto [first, second] = a_grad ? std::pair{dc, other} : std::pair{other, dc};
  return custom_op<Saved>(
      a_grad ? "matmul_backward_a" : "matmul_backward_b",
      [&](Saved& s, const Tensor<T>& x, const Tensor<T>& y) {
        s = a_grad ? Saved{y, x} : Saved{x, y};
        return operand_gradient(p, operand, s.other, s.dc);
      },
      [p, a_grad](const Saved& s, const NeedsGrad& needs, const Tensor<T>& u) {
        Tensor<T> g_first, g_second;
        if (a_grad) {  // inputs (dC, B)
          if (needs[0]) g_first = product(p, u, s.other);
          if (needs[1]) g_second = operand_gradient(p, 1, u, s.dc);
        } else {  // inputs (A, dC)
          if (needs[0]) g_first = operand_gradient(p, 0, u, s.dc);
          if (needs[1]) g_second = product(p, s.other, u);
        }
        return std::tuple{g_first, g_second};
      },
      graph_backward([p, a_grad](const Saved&, const NeedsGrad& needs, const std::tuple<Var<T>, Var<T>>& in,
                                 const Var<T>& u) {
        const auto& [x, y] = in;
        Var<T> g_first, g_second;
        if (a_grad) {
          if (needs[0]) g_first = matmul_of_plan(p, u, y);
          if (needs[1]) g_second = operand_gradient_node(p, 1, u, x);
        } else {
          if (needs[0]) g_first = operand_gradient_node(p, 0, u, y);
          if (needs[1]) g_second = matmul_of_plan(p, x, u);
        }
        return std::tuple{g_first, g_second};
      }),
      first, second);
}

template <class T> Var<T> matmul_of_plan(const MatmulPlan& p, const Var<T>& a, const Var<T>& b) {
  return custom_op<MatmulSaved<T>>(
      "matmul",
      [&](MatmulSaved<T>& s, const Tensor<T>& x, const Tensor<T>& y) {
        s = {p, x, y, {}};
        return product(p, x, y);
      },
      [](const MatmulSaved<T>& s, const NeedsGrad& needs, const Tensor<T>& dc) {
        return gradients(s.plan, s.a, s.b, needs, dc);
      },
      graph_backward([](const MatmulSaved<T>& s, const NeedsGrad& needs, const std::tuple<Var<T>, Var<T>>& in,
                        const Var<T>& dc) {
        const auto& [a, b] = in;
        return std::tuple{needs[0] ? operand_gradient_node(s.plan, 0, b, dc) : Var<T>(),
                          needs[1] ? operand_gradient_node(s.plan, 1, a, dc) : Var<T>()};
      }),
      a, b);
}

// matmul_of_plan with a bias [N] added to every row of the product: inputs (a, b, bias), the bias's gradient dC summed
// over its rows.
template <class T> Var<T> matmul_bias_of_plan(const MatmulPlan& p, const Var<T>& a, const Var<T>& b, const Var<T>& bias) {
  return custom_op<MatmulSaved<T>>(
      "matmul_bias",
      [&](MatmulSaved<T>& s, const Tensor<T>& x, const Tensor<T>& y, const Tensor<T>& add) {
        s = {p, x, y, add.shape()};
        return product(p, x, y, add);
      },
      [](const MatmulSaved<T>& s, const NeedsGrad& needs, const Tensor<T>& dc) {
        auto [da, db] = gradients(s.plan, s.a, s.b, needs, dc);
        return std::tuple{da, db, needs[2] ? sum_to(dc, s.bias_shape) : Tensor<T>()};
      },
      graph_backward([](const MatmulSaved<T>& s, const NeedsGrad& needs,
                        const std::tuple<Var<T>, Var<T>, Var<T>>& in, const Var<T>& dc) {
        const auto& [a, b, bias] = in;
        return std::tuple{needs[0] ? operand_gradient_node(s.plan, 0, b, dc) : Var<T>(),
                          needs[1] ? operand_gradient_node(s.plan, 1, a, dc) : Var<T>(),
                          needs[2] ? sum_to(dc, bias.shape()) : Var<T>()};
      }),
      a, b, bias);
}

}  // namespace

template <class T> Var<T> matmul(const Var<T>& a, const Var<T>& b, const Var<T>& bias) {
  const OpScope scope = enter_op("matmul", a, b, bias);
  check_same_device("matmul", a, b, bias);
  const MatmulPlan p = plan_matmul(a.shape(), b.shape());
  check(b.shape().rank() >= 2 && bias.shape() == Shape{p.N}, "matmul", "the bias has shape ", bias.shape(),
        " but the product of ", a.shape(), " and ", b.shape(), " has shape ", p.out,
        ": a bias is [N], added to every row of a matrix right operand's product");
  return matmul_bias_of_plan(p, a, b, bias);
}

template <class T> Var<T> matmul(const Var<T>& a, const Var<T>& b) {
  const OpScope scope = enter_op("matmul", a, b);
  check_same_device("matmul", a, b);
  return matmul_of_plan(plan_matmul(a.shape(), b.shape()), a, b);
}

namespace {

// The plan of matmul(a, b) for its gradient at dc, dc's shape checked against the product's.
template <class T> MatmulPlan gradient_plan(const Shape& a, const Shape& b, const Var<T>& dc) {
  MatmulPlan p = plan_matmul(a, b);
  check(dc.shape() == p.out, "matmul", "the gradient has shape ", dc.shape(), " but the product of ", a, " and ", b,
        " has shape ", p.out);
  return p;
}

}  // namespace

namespace detail {

template <class T> Var<T> matmul_grad_a(const Shape& a_shape, const Var<T>& b, const Var<T>& dc) {
  const OpScope scope = enter_op("matmul", b, dc);
  check_same_device("matmul", b, dc);
  return operand_gradient_node(gradient_plan(a_shape, b.shape(), dc), 0, b, dc);
}

template <class T> Var<T> matmul_grad_b(const Var<T>& a, const Shape& b_shape, const Var<T>& dc) {
  const OpScope scope = enter_op("matmul", a, dc);
  check_same_device("matmul", a, dc);
  return operand_gradient_node(gradient_plan(a.shape(), b_shape, dc), 1, a, dc);
}

}  // namespace detail

#define TAPEGRAD_INSTANTIATE_MATMUL(T)                                         \
  template Var<T> matmul<T>(const Var<T>&, const Var<T>&);                     \
  template Var<T> matmul<T>(const Var<T>&, const Var<T>&, const Var<T>&);      \
  template Var<T> detail::matmul_grad_a<T>(const Shape&, const Var<T>&, const Var<T>&);  \
  template Var<T> detail::matmul_grad_b<T>(const Var<T>&, const Shape&, const Var<T>&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_MATMUL)

}  // namespace tapegrad
