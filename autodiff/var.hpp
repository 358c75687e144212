// Var<T>: a differentiable value. It holds a tensor, the gradient accumulated into it by backward passes, and the
// node that created it (none for a leaf). Copies of a Var are handles to the same variable.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tapegrad/autodiff/detail/node.hpp"
#include "tapegrad/autodiff/tape.hpp"
#include "tapegrad/tensor/core/detail/op_scope.hpp"

namespace tapegrad {

namespace detail {
// "<op>: <what> is undefined (a default-constructed Var, ...)"
[[noreturn]] void throw_undefined_var(std::string_view op, std::string_view what);
[[noreturn]] void throw_undefined_input(std::string_view op, std::size_t input);
}  // namespace detail

template <class T> class VarImpl final : public VarSlot {
 public:
  explicit VarImpl(Tensor<T> v) : value(std::move(v)) {}

  Shape shape() const override { return value.shape(); }
  DType dtype() const override { return dtype_v<T>; }
  bool has_pending() const override { return pending.defined() || pending_graph != nullptr; }
  void drop_pending() override {
    pending = Tensor<T>();
    pending_graph.reset();
  }
  void pending_value() override {
    if (pending_graph) pending = pending_graph->value;
  }
  void keep_pending() override;

  // Adds `g` into the gradient flowing into this variable (the `.grad` of a leaf). `who` names the node that
  // produced it (and `input`, where not negative, which of its inputs this is), for the error when the shape or
  // device is wrong; the name is only formatted then.
  void accumulate(const Tensor<T>& g, std::string_view who, std::ptrdiff_t input = -1);
  // The same for a recorded gradient (create_graph): sums are recorded too.
  void accumulate(const std::shared_ptr<VarImpl<T>>& g, std::string_view who, std::ptrdiff_t input = -1);
  // Adds g into `.grad` (and a recorded g into grad_var's), taking turns with other threads' passes.
  void accumulate_into_grad(const Tensor<T>& g);
  void accumulate_into_grad(const std::shared_ptr<VarImpl<T>>& g);

  Tensor<T> value;
  Tensor<T> grad;     // what the user reads: accumulated over backward passes for leaves and retained variables
  Tensor<T> pending;  // gradient of the pass in progress, for non-leaves
  // Under create_graph: the recorded counterparts of grad (over such passes) and pending.
  std::shared_ptr<VarImpl<T>> grad_graph, pending_graph;
};

template <class T> class Var {
 public:
  Var() = default;  // undefined; `defined()` is false
  // Throws when `value` is undefined: a defined Var always holds a tensor.
  explicit Var(Tensor<T> value, bool requires_grad = false)
      : impl_(std::allocate_shared<VarImpl<T>>(detail::BlockAllocator<VarImpl<T>>(),
                                               (check_defined(value, "Var", "the value"), std::move(value)))) {
    impl_->requires_grad = requires_grad;
  }
  // Evaluates (and records) a lazy expression that yields a Var<T>, such as `a * b + exp(c)`.
  template <class Expr>
    requires(!std::is_same_v<std::remove_cvref_t<Expr>, Var> &&
             requires(const Expr& e) { { e.evaluate() } -> std::same_as<Var<T>>; })
  Var(const Expr& expr) : Var(expr.evaluate()) {}  // NOLINT: implicit by design

  bool defined() const { return impl_ != nullptr; }
  const Tensor<T>& value() const { return impl().value; }
  // The accumulated gradient; an undefined tensor if none has arrived (check `grad().defined()`).
  const Tensor<T>& grad() const { return impl().grad; }
  // The gradient that backward passes with create_graph recorded, as a variable that can be differentiated again
  // (its value is their part of grad()); undefined if there was none.
  Var grad_var() const { return impl().grad_graph ? from_slot(impl().grad_graph) : Var(); }
  const Shape& shape() const { return impl().value.shape(); }
  Device device() const { return impl().value.device(); }
  std::int64_t numel() const { return impl().value.numel(); }
  bool requires_grad() const { return impl().requires_grad; }
  bool is_leaf() const { return impl().is_leaf(); }
  static constexpr DType dtype() { return dtype_v<T>; }

  // A new leaf with the same value that no gradient flows through.
  Var detach() const { return Var(impl().value, false); }
  void zero_grad() {
    impl().grad = Tensor<T>();
    impl().grad_graph.reset();
  }
  // Keep this non-leaf variable's gradient after backward (leaves always keep theirs).
  void retain_grad() { impl().retains_grad = true; }

  const std::shared_ptr<VarImpl<T>>& slot() const { return impl_; }
  static Var from_slot(std::shared_ptr<VarImpl<T>> slot) {
    Var v;
    v.impl_ = std::move(slot);
    return v;
  }

 private:
  VarImpl<T>& impl() const {
    if (!impl_) [[unlikely]] detail::throw_undefined_var("Var", "the variable");
    return *impl_;
  }
  std::shared_ptr<VarImpl<T>> impl_;
};

template <class X> struct is_var : std::false_type {};
template <class T> struct is_var<Var<T>> : std::true_type {};

// Something that is not a Var but evaluates into one, such as a lazy elementwise expression. Ops that are not
// elementwise take Vars; each also accepts a VarExpression by evaluating it first.
template <class E>
concept VarExpression = !is_var<std::remove_cvref_t<E>>::value && requires(const E& e) {
  { e.evaluate() };
  requires is_var<decltype(e.evaluate())>::value;
};

// A Var or something that evaluates into one.
template <class X> concept VarLike = is_var<std::remove_cvref_t<X>>::value || VarExpression<X>;

// A Var as is; an expression evaluated (and recorded) into a Var.
template <class T> const Var<T>& eval(const Var<T>& v) { return v; }
template <VarExpression E> auto eval(const E& e) { return e.evaluate(); }

// A leaf that gradients flow into: a parameter or an input to differentiate with respect to.
template <class T> Var<T> param(Tensor<T> value) {
  check_defined(value, "param", "the value");
  return Var<T>(std::move(value), true);
}
// A leaf that no gradient flows into.
template <class T> Var<T> constant(Tensor<T> value) {
  check_defined(value, "constant", "the value");
  return Var<T>(std::move(value), false);
}

// Throws "<op>: input <i> is undefined (a default-constructed Var ...)" for the first undefined one of `inputs`.
template <class... Ts> void check_defined_inputs(std::string_view op, const Var<Ts>&... inputs) {
  std::size_t i = 0;
  const auto check_one = [&](bool defined) {
    if (!defined) [[unlikely]] detail::throw_undefined_input(op, i);
    ++i;
  };
  (check_one(inputs.defined()), ...);
}

template <class T> void check_defined_inputs(std::string_view op, const std::vector<Var<T>>& inputs) {
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) [[unlikely]] detail::throw_undefined_input(op, i);
  }
}

// Where an op starts: its inputs are defined, and it is the op in scope (tensor/core/detail/op_scope.hpp) for the
// errors raised below it, such as a result shape too large to count.
template <class... Ts> [[nodiscard]] OpScope enter_op(std::string_view op, const Var<Ts>&... inputs) {
  check_defined_inputs(op, inputs...);
  return OpScope(op);
}

// Backward from a scalar (one-element) output, seeded with 1.
template <class T> void backward(const Var<T>& y, BackwardOptions options = {});
// Backward from any output, seeded with `dy` of y's shape.
template <class T> void backward(const Var<T>& y, const Tensor<T>& dy, BackwardOptions options = {});

// Clears the gradient of each variable.
template <class... Vars> void zero_grad(Vars&... vars) { (vars.zero_grad(), ...); }

}  // namespace tapegrad
