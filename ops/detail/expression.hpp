// Elementwise expression templates.
//
// `a * b + exp(c)` on Vars builds a tree of small value types (Leaf, Unary, Binary) and computes nothing. Turning
// it into a Var (assignment, `Var<T> y = ...`, or `.eval()`) records ONE tape node:
//   forward:  one Eigen expression over views of the leaves' tensors, evaluated in one fused loop (on the thread
//             pool when large), in compute_t<T> (f32 for bf16/f16) and rounded once at the end;
//   backward: each leaf's gradient is one Eigen expression built by walking the tree top-down (the chain rule at
//             compile time), evaluated straight into that leaf's gradient; no intermediate tensor is stored.
// Broadcasting follows NumPy: shapes are merged to rank <= 4 and broadcast inside the Eigen expression; a
// broadcast leaf's gradient is reduced to its own shape in the same expression.
// On a GPU the same tree is compiled into a register program (ops/detail/element_term.hpp) that one launch runs (a
// kernel made for the program, or the interpreting one: cuda/elementwise.hpp), forward and, for backward, every
// needed leaf gradient at once.
//
// Expressions hold their leaves by value (Var handles share ownership), so keeping one (`auto e = a * b;`) is
// safe: each evaluation records a fresh node with the right inputs. Mixing dtypes in one expression does not
// compile: cast first.
#pragma once

#include <concepts>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "tapegrad/autodiff/var.hpp"
#include "tapegrad/ops/detail/broadcast.hpp"
#include "tapegrad/ops/detail/element_term.hpp"
#include "tapegrad/ops/detail/packet_math.hpp"
#include "tapegrad/ops/detail/row_sum.hpp"
#include "tapegrad/ops/reduce.hpp"
#include "tapegrad/tensor/core/detail/op_scope.hpp"
#include "tapegrad/tensor/eigen.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"

namespace tapegrad {

namespace expr {

struct ExpressionTag {};
template <class X> concept Expression = std::derived_from<std::remove_cvref_t<X>, ExpressionTag>;

// Views of the leaves for one evaluation: rank 1 (every leaf has the output's shape, or expanded to it) or rank 4
// (broadcast, with the plan's dims and factors).
template <class T, int R> struct Context {
  const T* const* data;  // each leaf's values, as the plan lays them out
  std::array<Eigen::Index, R> out_dims{};
  const BroadcastPlan* plan;
  const Tensor<T>* const* leaves;     // each leaf's own tensor
  const bool* needs_grad = nullptr;  // backward: which leaves need a gradient
};

template <class To, class X> auto cast_to(const X& x) {
  using From = typename Eigen::internal::traits<X>::Scalar;
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else {
    return x.template cast<To>();
  }
}

// The scalar `v` in the element type of the Eigen expression `x`; for a Term, a constant term; for a recorded value,
// v itself (a Var expression takes scalars as they are).
template <class X> auto scalar_of(const X&, double v) {
  if constexpr (Recorded<X>) {
    return v;
  } else {
    return typename Eigen::internal::traits<X>::Scalar(v);
  }
}
inline Term scalar_of(const Term&, double v) { return Term::constant(v); }

// One op recorded (create_graph), defined in ops/detail/elementwise_graph.hpp and instantiated there for every op
// and dtype, so that the expressions a program writes instantiate no expression of their own for it: the op's
// value, and its step of the chain rule (op.backward(x, g) for a unary op, Op::backward_a and backward_b for a
// binary one).
template <class Op, class T> Var<T> recorded_unary(const Op& op, const Var<T>& x);
template <class Op, class T> Var<T> recorded_binary(const Var<T>& x, const Var<T>& y);
template <class Op, class T> Var<T> recorded_backward(const Op& op, const Var<T>& x, const Var<T>& g);
template <class Op, class T> Var<T> recorded_backward_a(const Var<T>& x, const Var<T>& y, const Var<T>& g);
template <class Op, class T> Var<T> recorded_backward_b(const Var<T>& x, const Var<T>& y, const Var<T>& g);

// The values of an expression's nodes during its recorded backward, each computed once: by node, its Var (returned
// by value: a later node's value may move the stored ones).
template <class T> class RecordedValues {
 public:
  template <class Make> Var<T> of(const void* node, Make&& make) {
    for (const auto& [key, value] : values_) {
      if (key == node) return value;
    }
    values_.emplace_back(node, std::forward<Make>(make)());
    return values_.back().second;
  }

 private:
  std::vector<std::pair<const void*, Var<T>>> values_;  // (a few: one per op of the expression)
};

// Each leaf's gradient term, where one is needed (the GPU's backward).
using GradientTerms = std::vector<std::optional<Term>>;

// Evaluates `assign(device)` on the pool when `n` elements are worth it.
template <class Assign> void run(std::int64_t n, Assign&& assign) {
  run_on_cpu(n > parallel_threshold ? parallel_threshold : n * 8, assign);
}

// g (an Eigen expression of the output's shape, in C) as a view: evaluated once into `buffer` (vectorized, on the pool
// when large) unless it is a view already. Where two branches read the same gradient, or a reduction would
// evaluate it coefficient by coefficient, this evaluates its functions (exp, the activations) once, in packets.
template <class C, std::size_t N, class G, int R = static_cast<int>(N)>
ConstTensorView<C, R> materialized(const std::array<Eigen::Index, N>& dims, const G& g, Tensor<C>& buffer) {
  if constexpr (std::is_same_v<G, ConstTensorView<C, R>>) {
    return g;
  } else {
    buffer = Tensor<C>(Shape{Eigen::internal::array_prod(dims)});
    auto b = view_as<R>(buffer, dims);
    run(buffer.numel(), [&](auto& d) { b.device(d) = g; });
    return ConstTensorView<C, R>(buffer.data(), dims);
  }
}

// Where a leaf of dims `own` is broadcast along leading axes only (factor > 1 only before its first own axis of
// size > 1; a bias), the output seen as [rows, cols] with the leaf one row of cols: its gradient is g's column sums.
struct LeadingBroadcast {
  std::int64_t rows = 1, cols = 1;
};
template <std::size_t R>
std::optional<LeadingBroadcast> leading_broadcast(const std::array<Eigen::Index, R>& own,
                                                  const std::array<Eigen::Index, R>& factor) {
  LeadingBroadcast split;
  std::size_t axis = 0;
  for (; axis < R && own[axis] == 1; ++axis) split.rows *= factor[axis];
  for (; axis < R; ++axis) {
    if (factor[axis] != 1) return std::nullopt;
    split.cols *= own[axis];
  }
  return split;
}

template <class T> class Leaf : public ExpressionTag {
 public:
  using element_type = T;
  static constexpr int leaves = 1;
  explicit Leaf(Var<T> v) : var_(std::move(v)) {}

  template <int Offset, int R> auto eigen(const Context<T, R>& ctx) const {
    using C = compute_t<T>;
    if constexpr (R == 1) {
      return cast_to<C>(ConstTensorView<T, 1>(ctx.data[Offset], ctx.out_dims));
    } else {
      return cast_to<C>(ConstTensorView<T, R>(ctx.data[Offset], ctx.plan->operand_dims[Offset])
                            .broadcast(ctx.plan->operand_factors[Offset]));
    }
  }

  // Evaluates the gradient expression `g` (in compute_t<T>, of the output's shape) into this leaf's gradient.
  template <int Offset, int R, class G>
  void backprop(const Context<T, R>& ctx, const G& g, std::span<Tensor<T>> grads) const {
    const Shape& own_shape = ctx.leaves[Offset]->shape();
    Tensor<T> out(own_shape);
    const BroadcastPlan& plan = *ctx.plan;
    if constexpr (R == 1) {
      if (plan.full(Offset)) {
        auto o = view_as<1>(out, ctx.out_dims);
        run(out.numel(), [&](auto& d) { o.device(d) = cast_to<T>(g); });
      } else {
        // Expand plan, broadcast leaf: the gradient at the output's size, summed down in compute_t, rounded once.
        Tensor<compute_t<T>> wide(plan.output);
        auto w = view_as<1>(wide, ctx.out_dims);
        run(wide.numel(), [&](auto& d) { w.device(d) = g; });
        out = cast<T>(sum_to(wide, own_shape));
      }
    } else if (plan.full(Offset)) {
      auto o = view_as<R>(out, ctx.out_dims);
      run(out.numel(), [&](auto& d) { o.device(d) = cast_to<T>(g); });
    } else if (const auto leading = leading_broadcast(plan.operand_dims[Offset], plan.operand_factors[Offset])) {
      // g once, in packets, then its column sums in compute_t (blocked: the same bits for every thread count).
      using C = compute_t<T>;
      Tensor<C> buffer;
      const C* rows = materialized<C>(ctx.out_dims, g, buffer).data();
      const std::int64_t cols = leading->cols;
      const std::vector<C> sums = detail::blocked_row_sum<C>(
          leading->rows, cols, cols, [&](std::int64_t begin, std::int64_t end, C* partial) {
            Eigen::Map<Eigen::Array<C, Eigen::Dynamic, 1>> total(partial, cols);
            for (std::int64_t r = begin; r < end; ++r) {
              total += Eigen::Map<const Eigen::Array<C, Eigen::Dynamic, 1>>(rows + r * cols, cols);
            }
          });
      out = detail::rounded_tensor<T>(sums.data(), own_shape);
    } else {
      // Split each output axis into (own, broadcast) and sum the broadcast halves away.
      const auto& own = plan.operand_dims[Offset];
      const auto& factor = plan.operand_factors[Offset];
      std::array<Eigen::Index, 2 * R> split;
      std::array<Eigen::Index, R> broadcast_axes;
      for (int i = 0; i < R; ++i) {
        split[2 * i] = own[i];
        split[2 * i + 1] = factor[i];
        broadcast_axes[i] = 2 * i + 1;
      }
      auto o = view_as<R>(out, own);
      const std::int64_t work = Eigen::internal::array_prod(ctx.out_dims);
      run(work, [&](auto& d) { o.device(d) = cast_to<T>(g.reshape(split).sum(broadcast_axes)); });
    }
    grads[Offset] = out;
  }

  // The GPU's counterparts of eigen and backprop: the same walk, building Terms (ops/detail/element_term.hpp).
  template <int Offset> Term term() const { return Term::input(Offset); }
  template <int Offset> void backprop_terms(const Term& g, GradientTerms& grads) const { grads[Offset] = g; }

  // The recorded counterparts (create_graph), over the node's input variables `xs`: the expression rebuilt on them,
  // and each leaf's gradient as a Var of the output's shape (summed down to the leaf's by the node).
  template <int Offset, std::size_t N>
  const Var<T>& value_of(const std::array<Var<T>, N>& xs, RecordedValues<T>&) const {
    return xs[Offset];
  }
  template <int Offset, std::size_t N>
  void backprop_recorded(const std::array<Var<T>, N>&, const Var<T>& g, std::array<Var<T>, N>& grads,
                         RecordedValues<T>&) const {
    grads[Offset] = g;
  }
  template <int Offset, std::size_t N> static bool needs_recorded(const std::array<Var<T>, N>& xs) {
    return xs[Offset].requires_grad();
  }

  bool requires_grad() const { return var_.requires_grad(); }
  template <int Offset, class Ctx> static bool needs_grad(const Ctx& ctx) { return ctx.needs_grad[Offset]; }
  template <int Offset, class Slots> void collect(Slots& out) const { out[Offset] = var_.slot(); }
  // This expression without its variables: what a recorded node keeps (its inputs hold the variables).
  Leaf without_leaves() const { return Leaf(Var<T>()); }
  // Two appends, not "x" + to_string(...): GCC 12 reports a false -Wrestrict on the latter once inlined.
  static void describe(std::string& s, int& next) {
    s += 'x';
    s += std::to_string(next++);
  }

 private:
  Var<T> var_;
};

template <class Op, class A> class Unary : public ExpressionTag {
 public:
  using element_type = typename A::element_type;
  static constexpr int leaves = A::leaves;
  Unary(Op op, A a) : op_(std::move(op)), a_(std::move(a)) {}

  template <int Offset, class Ctx> auto eigen(const Ctx& ctx) const {
    return op_.forward(a_.template eigen<Offset>(ctx));
  }
  template <int Offset, class Ctx, class G>
  void backprop(const Ctx& ctx, const G& g, std::span<Tensor<element_type>> grads) const {
    if (!a_.template needs_grad<Offset>(ctx)) return;
    a_.template backprop<Offset>(ctx, op_.backward(a_.template eigen<Offset>(ctx), g), grads);
  }
  template <int Offset> Term term() const { return op_.forward(a_.template term<Offset>()); }
  template <int Offset> void backprop_terms(const Term& g, GradientTerms& grads) const {
    if (!a_.requires_grad()) return;
    a_.template backprop_terms<Offset>(op_.backward(a_.template term<Offset>(), g), grads);
  }
  template <int Offset, class Xs, class Values> auto value_of(const Xs& xs, Values& values) const {
    return values.of(this, [&] { return recorded_unary(op_, a_.template value_of<Offset>(xs, values)); });
  }
  template <int Offset, class Xs, class G, class Grads, class Values>
  void backprop_recorded(const Xs& xs, const G& g, Grads& grads, Values& values) const {
    if (!a_.template needs_recorded<Offset>(xs)) return;
    a_.template backprop_recorded<Offset>(
        xs, recorded_backward(op_, a_.template value_of<Offset>(xs, values), g), grads, values);
  }
  template <int Offset, class Xs> bool needs_recorded(const Xs& xs) const {
    return a_.template needs_recorded<Offset>(xs);
  }
  bool requires_grad() const { return a_.requires_grad(); }
  template <int Offset, class Ctx> bool needs_grad(const Ctx& ctx) const { return a_.template needs_grad<Offset>(ctx); }
  Unary without_leaves() const { return Unary(op_, A(a_.without_leaves())); }
  static const char* op_name() { return Op::name(); }
  template <int Offset, class Slots> void collect(Slots& out) const { a_.template collect<Offset>(out); }
  static void describe(std::string& s, int& next) {
    s += Op::name();
    s += "(";
    A::describe(s, next);
    s += ")";
  }

 private:
  Op op_;
  A a_;
};

template <class Op, class A, class B> class Binary : public ExpressionTag {
  static_assert(std::is_same_v<typename A::element_type, typename B::element_type>,
                "tapegrad: cannot mix dtypes in one expression; cast one operand first");

 public:
  using element_type = typename A::element_type;
  static constexpr int leaves = A::leaves + B::leaves;
  Binary(A a, B b) : a_(std::move(a)), b_(std::move(b)) {}

  template <int Offset, class Ctx> auto eigen(const Ctx& ctx) const {
    return Op::forward(a_.template eigen<Offset>(ctx), b_.template eigen<Offset + A::leaves>(ctx));
  }
  template <int Offset, class Ctx, class G>
  void backprop(const Ctx& ctx, const G& g, std::span<Tensor<element_type>> grads) const {
    // Where both sides read g, it is evaluated once.
    if (a_.template needs_grad<Offset>(ctx) && b_.template needs_grad<Offset + A::leaves>(ctx)) {
      Tensor<compute_t<element_type>> buffer;
      backprop_both<Offset>(ctx, materialized<compute_t<element_type>>(ctx.out_dims, g, buffer), grads);
    } else {
      backprop_both<Offset>(ctx, g, grads);
    }
  }
  template <int Offset> Term term() const {
    return Op::forward(a_.template term<Offset>(), b_.template term<Offset + A::leaves>());
  }
  template <int Offset> void backprop_terms(const Term& g, GradientTerms& grads) const {
    const Term x = a_.template term<Offset>();
    const Term y = b_.template term<Offset + A::leaves>();
    if (a_.requires_grad()) a_.template backprop_terms<Offset>(Op::backward_a(x, y, g), grads);
    if (b_.requires_grad()) b_.template backprop_terms<Offset + A::leaves>(Op::backward_b(x, y, g), grads);
  }
  template <int Offset, class Xs, class Values> auto value_of(const Xs& xs, Values& values) const {
    return values.of(this, [&] {
      return recorded_binary<Op>(a_.template value_of<Offset>(xs, values),
                                 b_.template value_of<Offset + A::leaves>(xs, values));
    });
  }
  template <int Offset, class Xs, class G, class Grads, class Values>
  void backprop_recorded(const Xs& xs, const G& g, Grads& grads, Values& values) const {
    const bool to_a = a_.template needs_recorded<Offset>(xs), to_b = b_.template needs_recorded<Offset + A::leaves>(xs);
    if (!to_a && !to_b) return;
    const auto x = a_.template value_of<Offset>(xs, values);
    const auto y = b_.template value_of<Offset + A::leaves>(xs, values);
    if (to_a) a_.template backprop_recorded<Offset>(xs, recorded_backward_a<Op>(x, y, g), grads, values);
    if (to_b) {
      b_.template backprop_recorded<Offset + A::leaves>(xs, recorded_backward_b<Op>(x, y, g), grads, values);
    }
  }
  template <int Offset, class Xs> bool needs_recorded(const Xs& xs) const {
    return a_.template needs_recorded<Offset>(xs) || b_.template needs_recorded<Offset + A::leaves>(xs);
  }
  bool requires_grad() const { return a_.requires_grad() || b_.requires_grad(); }
  template <int Offset, class Ctx> bool needs_grad(const Ctx& ctx) const {
    return a_.template needs_grad<Offset>(ctx) || b_.template needs_grad<Offset + A::leaves>(ctx);
  }
  Binary without_leaves() const { return Binary(A(a_.without_leaves()), B(b_.without_leaves())); }
  static const char* op_name() { return Op::name(); }
  template <int Offset, class Slots> void collect(Slots& out) const {
    a_.template collect<Offset>(out);
    b_.template collect<Offset + A::leaves>(out);
  }
  static void describe(std::string& s, int& next) {
    s += Op::name();
    s += "(";
    A::describe(s, next);
    s += ", ";
    B::describe(s, next);
    s += ")";
  }

 private:
  template <int Offset, class Ctx, class G>
  void backprop_both(const Ctx& ctx, const G& g, std::span<Tensor<element_type>> grads) const {
    const auto x = a_.template eigen<Offset>(ctx);
    const auto y = b_.template eigen<Offset + A::leaves>(ctx);
    if (a_.template needs_grad<Offset>(ctx)) a_.template backprop<Offset>(ctx, Op::backward_a(x, y, g), grads);
    if (b_.template needs_grad<Offset + A::leaves>(ctx)) {
      b_.template backprop<Offset + A::leaves>(ctx, Op::backward_b(x, y, g), grads);
    }
  }

  A a_;
  B b_;
};

// ---- evaluation ----------------------------------------------------------------------------------------------

// The expression's text, "add(x0, mul(x1, x2))": its node's name and its errors' subject. It depends on the type
// alone, so it is made once per type.
template <class E> const std::string& description() {
  static const std::string text = [] {
    std::string s;
    int next = 0;
    E::describe(s, next);
    return s;
  }();
  return text;
}

// Each leaf's variable, in the order of the expression's x0, x1, ...
template <class E> using Slots = std::array<std::shared_ptr<VarImpl<typename E::element_type>>, E::leaves>;
template <class E> using LeafValues = std::array<const Tensor<typename E::element_type>*, E::leaves>;

// Runs `body(ctx)` with the leaves laid out as `plan` says; in expand mode, broadcast leaves are first expanded.
// `needs_grad` (backward) says which leaves need a gradient.
template <class T, std::size_t N, class Body>
void with_context(const BroadcastPlan& plan, const std::array<const Tensor<T>*, N>& leaves, Body&& body,
                  const bool* needs_grad = nullptr) {
  std::array<const T*, N> data;
  std::array<Tensor<T>, N> expanded;  // keeps expanded copies alive during the call
  for (std::size_t k = 0; k < N; ++k) {
    if (plan.kind == BroadcastPlan::Kind::expand && !plan.full(k)) {
      expanded[k] = expand_to(*leaves[k], plan.output);
      data[k] = expanded[k].data();
    } else {
      data[k] = leaves[k]->data();
    }
  }
  if (plan.kind == BroadcastPlan::Kind::broadcast) {
    body(Context<T, BroadcastPlan::rank>{data.data(), plan.out_dims, &plan, leaves.data(), needs_grad});
  } else {
    body(Context<T, 1>{data.data(), {plan.output.numel()}, &plan, leaves.data(), needs_grad});
  }
}

// The recorded backward of an expression's node (create_graph): the chain rule walked op by op over the node's input
// variables, each op's value computed again and each op's step of the chain rule recorded
// (ops/detail/elementwise_graph.hpp); a broadcast leaf's gradient summed down to its shape (sum_to, recorded).
template <class E> void backward_recorded(const E& expr, const Node& node) {
  using T = typename E::element_type;
  const auto& g = static_cast<const VarImpl<T>&>(*node.outputs[0].lock()).pending_graph;
  if (!g) return;
  std::array<Var<T>, E::leaves> xs, grads;
  for (std::size_t k = 0; k < xs.size(); ++k) {
    xs[k] = Var<T>::from_slot(std::static_pointer_cast<VarImpl<T>>(node.inputs[k]));
  }
  RecordedValues<T> values;
  expr.template backprop_recorded<0>(xs, Var<T>::from_slot(g), grads, values);
  for (std::size_t k = 0; k < grads.size(); ++k) {
    if (!grads[k].defined()) continue;
    const Var<T> grad = sum_to(grads[k], xs[k].shape());
    static_cast<VarImpl<T>&>(*node.inputs[k]).accumulate(grad.slot(), node.name());
  }
}

template <class E> class ExpressionNode final : public Node {
  using T = typename E::element_type;
  using C = compute_t<T>;

 public:
  // The expression is kept without its variables (the inputs hold them): a shared_ptr copy fewer per leaf.
  ExpressionNode(const E& e, BroadcastPlan plan)
      : Node(StaticName{description<E>()}), expr_(e.without_leaves()), plan_(std::move(plan)) {}

  void backward() override {
    const Tensor<T>& dy = static_cast<VarImpl<T>&>(*outputs[0].lock()).pending;
    LeafValues<E> leaves;
    std::array<bool, E::leaves> needs_grad;
    for (std::size_t k = 0; k < leaves.size(); ++k) {
      leaves[k] = &static_cast<VarImpl<T>&>(*inputs[k]).value;
      needs_grad[k] = inputs[k]->requires_grad;
    }
    std::array<Tensor<T>, E::leaves> grads;
    with_context<T>(
        plan_, leaves,
        [&](const auto& ctx) {
          constexpr int R = std::tuple_size_v<std::remove_cvref_t<decltype(ctx.out_dims)>>;
          const auto g = cast_to<C>(ConstTensorView<T, R>(dy.data(), ctx.out_dims));
          expr_->template backprop<0>(ctx, g, std::span<Tensor<T>>(grads));
        },
        needs_grad.data());
    for (std::size_t k = 0; k < grads.size(); ++k) {
      if (!grads[k].defined()) continue;
      static_cast<VarImpl<T>&>(*inputs[k]).accumulate(grads[k], name());
    }
  }
  void backward_graph() override { backward_recorded(*expr_, *this); }
  void release_saved() override { expr_.reset(); }

 private:
  std::optional<E> expr_;
  BroadcastPlan plan_;
};

// The GPU's node: backward compiles every needed leaf gradient into ONE program (inputs: the leaves and dy) and runs
// it; a broadcast leaf's gradient is written at the output's size in the compute type and summed down to its shape.
// Where a leaf's gradient is dy itself (a leaf added), it is dy summed down directly (cuda::sum: f32 sums for 16-bit
// types), or at full size for a variable an op made, dy shared (gradients may share memory: add_to copies on write):
// a residual's add writes nothing. (A parameter's gradient, which the user holds, stays a tensor of its own.)
template <class E> class GpuExpressionNode final : public Node {
  using T = typename E::element_type;
  using C = compute_t<T>;

 public:
  GpuExpressionNode(const E& e, Shape output)
      : Node(StaticName{description<E>()}), expr_(e), output_(std::move(output)) {}

  void backward() override {
    const Tensor<T>& dy = static_cast<VarImpl<T>&>(*outputs[0].lock()).pending;
    GradientTerms terms(E::leaves);
    expr_->template backprop_terms<0>(Term::input(E::leaves), terms);
    std::vector<Shape> shapes;
    std::vector<const void*> in;
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      const Tensor<T>& leaf = static_cast<VarImpl<T>&>(*inputs[k]).value;
      shapes.push_back(leaf.shape());
      in.push_back(leaf.data());
    }
    shapes.push_back(output_);
    in.push_back(dy.data());
    std::vector<TermOutput> outs;
    std::vector<void*> out;
    std::vector<Tensor<T>> grads(E::leaves);
    std::vector<Tensor<C>> wide(E::leaves);
    for (std::size_t k = 0; k < terms.size(); ++k) {
      if (!terms[k]) continue;
      const bool full = shapes[k] == output_;
      if (is_dy(*terms[k]) && !(full && inputs[k]->is_leaf())) {
        grads[k] = full ? dy : sum_to(dy, shapes[k]);
        continue;
      }
      if (full) {
        grads[k] = Tensor<T>(output_, dy.device());
        out.push_back(grads[k].data());
      } else {
        wide[k] = Tensor<C>(output_, dy.device());
        out.push_back(wide[k].data());
      }
      outs.push_back({*terms[k], static_cast<int>(outs.size()), !full});
    }
    if (!outs.empty()) run_terms(dtype_v<T>, dy.device(), outs, output_, shapes, in, out, name());
    for (std::size_t k = 0; k < terms.size(); ++k) {
      if (wide[k].defined()) grads[k] = cast<T>(sum_to(wide[k], shapes[k]));
      if (grads[k].defined()) static_cast<VarImpl<T>&>(*inputs[k]).accumulate(grads[k], name());
    }
  }
  void backward_graph() override { backward_recorded(*expr_, *this); }
  void release_saved() override { expr_.reset(); }

 private:
  // Whether a gradient term is dy itself (input E::leaves of the backward's program).
  static bool is_dy(const Term& t) {
    return t.node().op == cuda::ElementOp::input && t.node().input == static_cast<int>(E::leaves);
  }

  std::optional<E> expr_;
  Shape output_;
};

// `e` on the cpu: Eigen expressions over the broadcast leaves.
template <class E, class T = typename E::element_type>
Tensor<T> evaluate_on_cpu(const E& e, const LeafValues<E>& leaves, const BroadcastPlan& plan) {
  Tensor<T> out(plan.output);
  with_context<T>(plan, leaves, [&](const auto& ctx) {
    constexpr int R = std::tuple_size_v<std::remove_cvref_t<decltype(ctx.out_dims)>>;
    auto o = view_as<R>(out, ctx.out_dims);
    run(out.numel(), [&](auto& d) { o.device(d) = cast_to<T>(e.template eigen<0>(ctx)); });
  });
  return out;
}

// `e` on `device`, a GPU: one program.
template <class E, class T = typename E::element_type>
Tensor<T> evaluate_on_gpu(const E& e, const Slots<E>& slots, const Shape& output, Device device) {
  std::vector<const void*> inputs;
  std::vector<Shape> shapes;
  for (const auto& slot : slots) {
    inputs.push_back(slot->value.data());
    shapes.push_back(slot->value.shape());
  }
  Tensor<T> out(output, device);
  run_terms(dtype_v<T>, device, {{e.template term<0>(), 0}}, output, shapes, inputs, {out.data()}, description<E>());
  return out;
}

// The value `out` of `e` as a Var, with its node (a NodeType made from `node_args`) on the tape when a gradient is
// wanted.
template <class NodeType, class E, class T = typename E::element_type, class... NodeArgs>
Var<T> recorded(Tensor<T> out, const E& e, Slots<E>& slots, const NodeArgs&... node_args) {
  const bool record = grad_enabled() && e.requires_grad();
  Var<T> y(std::move(out), record);
  if (record) {
    auto node = std::make_unique<NodeType>(e, node_args...);
    node->inputs.assign(std::make_move_iterator(slots.begin()), std::make_move_iterator(slots.end()));
    node->outputs.push_back(y.slot());
    Tape::active().record(std::move(node));
  }
  return y;
}

template <class E> Var<typename E::element_type> evaluate_in_scope(const E& e) {
  Slots<E> slots;
  e.template collect<0>(slots);
  std::array<Shape, E::leaves> shapes;
  LeafValues<E> leaves;
  for (std::size_t k = 0; k < slots.size(); ++k) {
    if (!slots[k]) detail::throw_undefined_var(description<E>(), "operand x" + std::to_string(k));
    if (const char* why = unusable_input_reason(*slots[k])) {
      throw AutodiffError(description<E>() + ": operand x" + std::to_string(k) + " of shape " +
                          slots[k]->shape().str() + why);
    }
    const Device operand_device = slots[k]->value.device();
    if (!(operand_device == slots.front()->value.device())) {
      detail::throw_mixed_devices(description<E>(), slots.front()->value.device(), k, operand_device);
    }
    shapes[k] = slots[k]->value.shape();
    leaves[k] = &slots[k]->value;
  }
  const Device device = slots.front()->value.device();  // every expression has a leaf
  if (!broadcastable(shapes)) {
    std::string msg = description<E>() + ": operand shapes";
    for (const Shape& s : shapes) {  // two appends: GCC 12 reports a false -Wrestrict on `" " + s.str()` here
      msg += ' ';
      msg += s.str();
    }
    throw Error(msg + " cannot be broadcast together");
  }
  const BroadcastPlan plan = plan_broadcast(shapes, "elementwise");
  return by_device(
      E::op_name(), device,
      [&] { return recorded<ExpressionNode<E>>(evaluate_on_cpu(e, leaves, plan), e, slots, plan); },
      [&](auto gpu) {
        return recorded<GpuExpressionNode<E>>(evaluate_on_gpu(e, slots, plan.output, gpu), e, slots, plan.output);
      });
}

// Errors raised below (a result too large, memory) name the expression's outermost op, e.g. "add": describing the
// whole expression costs a string per evaluation.
template <class E> Var<typename E::element_type> evaluate(const E& e) {
  return run_op(E::op_name(), [&] { return evaluate_in_scope(e); });
}

// The public face of every expression: evaluation into a Var.
template <class Inner> class Expr : public Inner {
 public:
  using Inner::Inner;
  explicit Expr(Inner inner) : Inner(std::move(inner)) {}
  Var<typename Inner::element_type> evaluate() const { return expr::evaluate(static_cast<const Inner&>(*this)); }
  Var<typename Inner::element_type> eval() const { return evaluate(); }
};

// ---- operands ------------------------------------------------------------------------------------------------

// A Var or an expression: what elementwise functions accept.
template <class X> concept Operand = is_var<std::remove_cvref_t<X>>::value || Expression<X>;

template <class T> Leaf<T> as_node(const Var<T>& v) { return Leaf<T>(v); }
template <Expression E> const E& as_node(const E& e) { return e; }
template <class X> using node_t = std::remove_cvref_t<decltype(as_node(std::declval<const X&>()))>;
template <class X> using element_t = typename node_t<X>::element_type;

template <class Op, Operand X> auto make_unary(Op op, const X& x) {
  return Expr<Unary<Op, node_t<X>>>(Unary<Op, node_t<X>>(std::move(op), as_node(x)));
}
template <class Op, Operand X, Operand Y> auto make_binary(const X& x, const Y& y) {
  return Expr<Binary<Op, node_t<X>, node_t<Y>>>(Binary<Op, node_t<X>, node_t<Y>>(as_node(x), as_node(y)));
}

}  // namespace expr

}  // namespace tapegrad
