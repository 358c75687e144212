#include "tapegrad/autodiff/var.hpp"

#include <array>
#include <cstdint>
#include <mutex>

#include "tapegrad/tensor/detail/accumulate.hpp"

namespace tapegrad {

namespace detail {
void throw_undefined_var(std::string_view op, std::string_view what) {
  throw Error(concat(op, ": ", what,
                     " is undefined (a default-constructed Var, holding no value); assign it a Var made by param(), "
                     "constant() or an op first"));
}
void throw_undefined_input(std::string_view op, std::size_t input) {
  throw_undefined_var(op, concat("input ", input));
}
}  // namespace detail

namespace {
// Leaves (parameters) may be shared by the tapes of several threads, whose backward passes then add into one
// gradient: those additions take turns, under one of a few locks chosen by the leaf's address.
std::mutex& leaf_lock(const void* leaf) {
  static std::array<std::mutex, 64> locks;
  return locks[(reinterpret_cast<std::uintptr_t>(leaf) / alignof(std::max_align_t)) % locks.size()];
}

// a + b of two recorded gradients (create_graph), recorded itself: the sum of a variable's gradient contributions.
// It lives here, below the ops, as the tape's own: its backward hands the gradient to both unchanged.
template <class T> class GradientSumNode final : public Node {
 public:
  GradientSumNode() : Node(StaticName{name_text}) {}
  void backward() override {
    const Tensor<T>& g = static_cast<VarImpl<T>&>(*outputs[0].lock()).pending;
    for (auto& in : inputs) static_cast<VarImpl<T>&>(*in).accumulate(g, name());
  }
  void backward_graph() override {
    const auto& g = static_cast<VarImpl<T>&>(*outputs[0].lock()).pending_graph;
    for (auto& in : inputs) static_cast<VarImpl<T>&>(*in).accumulate(g, name());
  }
  void release_saved() override {}

 private:
  static inline const std::string name_text = "gradient sum";
};

template <class T>
std::shared_ptr<VarImpl<T>> recorded_sum(const std::shared_ptr<VarImpl<T>>& a, const std::shared_ptr<VarImpl<T>>& b) {
  Tensor<T> total = a->value;
  add_to(total, b->value);
  auto sum = std::allocate_shared<VarImpl<T>>(detail::BlockAllocator<VarImpl<T>>(), std::move(total));
  sum->requires_grad = a->requires_grad || b->requires_grad;
  if (sum->requires_grad) {
    auto node = std::make_unique<GradientSumNode<T>>();
    node->inputs.push_back(a);
    node->inputs.push_back(b);
    node->outputs.push_back(sum);
    Tape::active().record(std::move(node));
  }
  return sum;
}

template <class T>
void check_gradient(const VarImpl<T>& to, const Tensor<T>& g, std::string_view who, std::ptrdiff_t input) {
  const auto node = [&] { return input < 0 ? std::string(who) : detail::concat(who, " (input ", input, ")"); };
  if (!(g.shape() == to.value.shape())) {
    throw AutodiffError(node() + ": backward returned a gradient of shape " + g.shape().str() + " for a " +
                        std::string(dtype_name(dtype_v<T>)) + " input of shape " + to.value.shape().str());
  }
  if (!(g.device() == to.value.device())) {
    throw AutodiffError(node() + ": backward returned a gradient on " + g.device().str() + " for an input on " +
                        to.value.device().str());
  }
}

// Where a gradient for `to` goes in a grad() pass: into its collecting leaf (returned), nowhere for other leaves and
// for variables below a nested pass's floor (`skip` set), and on as usual for the other non-leaves.
template <class T> VarImpl<T>* capture_sink(VarImpl<T>& to, bool& skip) {
  const detail::GradCapture* capture = detail::grad_capture();
  if (!capture) return nullptr;
  auto* sink = static_cast<VarImpl<T>*>(capture->sink_of(&to));
  skip = to.is_leaf() || (capture->floor > 0 && to.creator->tape_index < capture->floor);
  return sink;
}

}  // namespace

template <class T> void VarImpl<T>::keep_pending() {
  add_to(grad, pending_graph ? pending_graph->value : pending);
  if (pending_graph) grad_graph = grad_graph ? recorded_sum(grad_graph, pending_graph) : pending_graph;
}

template <class T> void VarImpl<T>::accumulate(const Tensor<T>& g, std::string_view who, std::ptrdiff_t input) {
  check_gradient(*this, g, who, input);
  if (const Node* from = detail::once_differentiable_node()) {  // a create_graph pass, through a node without one
    auto recorded = std::allocate_shared<VarImpl<T>>(detail::BlockAllocator<VarImpl<T>>(), g);
    recorded->requires_grad = true;
    detail::record_once_differentiable(recorded, *from);
    accumulate(recorded, who, input);
    return;
  }
  bool skip = false;
  if (VarImpl<T>* sink = capture_sink(*this, skip)) sink->accumulate_into_grad(g);
  if (skip) return;
  if (!is_leaf()) {
    add_to(pending, g);  // a non-leaf belongs to one tape, which one thread at a time runs backward on
    return;
  }
  accumulate_into_grad(g);
}

template <class T>
void VarImpl<T>::accumulate(const std::shared_ptr<VarImpl<T>>& g, std::string_view who, std::ptrdiff_t input) {
  check_gradient(*this, g->value, who, input);
  bool skip = false;
  if (VarImpl<T>* sink = capture_sink(*this, skip)) sink->accumulate_into_grad(g);
  if (skip) return;
  if (!is_leaf()) {
    pending_graph = pending_graph ? recorded_sum(pending_graph, g) : g;
    return;
  }
  accumulate_into_grad(g);
}

template <class T> void VarImpl<T>::accumulate_into_grad(const Tensor<T>& g) {
  const std::lock_guard lock(leaf_lock(this));
  add_to(grad, g);
}

template <class T> void VarImpl<T>::accumulate_into_grad(const std::shared_ptr<VarImpl<T>>& g) {
  const std::lock_guard lock(leaf_lock(this));
  add_to(grad, g->value);
  grad_graph = grad_graph ? recorded_sum(grad_graph, g) : g;
}

#define TAPEGRAD_INSTANTIATE_VAR(T) template class VarImpl<T>;
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_VAR)

}  // namespace tapegrad
