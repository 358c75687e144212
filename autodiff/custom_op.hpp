// The public custom-node API: a user-supplied forward and backward that record as ONE tape node.
//
//   struct Saved { Tensor<double> x; };
//   Var<double> y = custom_op<Saved>(
//       "cube",
//       [](Saved& s, const Tensor<double>& x) { s.x = x; return cube(x); },                  // forward
//       [](const Saved& s, const NeedsGrad&, const Tensor<double>& dy) { return 3 * s.x^2 * dy; },  // backward
//       x);
//
// forward(Saved&, const Tensor<Ts>&... inputs) returns the output tensor, or a std::tuple of them.
// backward(const Saved&, const NeedsGrad&, const Tensor<Rs>&... dys) returns the gradient of each input (a
// std::tuple<Tensor<Ts>...>, or one Tensor when there is one input). An input's gradient may be left undefined
// when NeedsGrad says it is not needed. The gradient of an output that received none arrives as zeros.
// Saved lives until the node's backward has run without retain_graph (or the tape is cleared).
//
// Twice differentiable: pass graph_backward(g) after the backward. Under create_graph (autodiff/grad.hpp) the node
// runs g instead, g(const Saved&, const NeedsGrad&, const std::tuple<Var<Ts>...>& inputs, const Var<Rs>&... dys),
// written with Var ops on the inputs (the variables the op was called with) and the outputs' gradients, returning a
// Var per input (a std::tuple, or one Var): its gradients are recorded, so they can be differentiated again.
//
//       graph_backward([](const Saved&, const NeedsGrad&, const std::tuple<Var<double>>& in, const Var<double>& dy) {
//         const Var<double>& x = std::get<0>(in);
//         return Var<double>(3.0 * x * x * dy);
//       }),
//
// Without one, a gradient that passed the node under create_graph can be used, but differentiating it again
// throws naming the op.
//
// Ops over a runtime number of inputs of one dtype (concat) pass a std::vector<Var<T>> instead: forward then
// takes `const std::vector<Tensor<T>>&` and returns one Tensor<T>; backward returns a std::vector<Tensor<T>>
// with one gradient per input.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tapegrad/autodiff/var.hpp"
#include "tapegrad/tensor/core/detail/op_scope.hpp"
#include "tapegrad/tensor/factories.hpp"

namespace tapegrad {

// Which inputs of a node need a gradient (those that require grad).
class NeedsGrad {
 public:
  explicit NeedsGrad(std::vector<bool> flags) : flags_(std::move(flags)) {}
  bool operator[](std::size_t input) const { return flags_.at(input); }
  std::size_t size() const { return flags_.size(); }

 private:
  std::vector<bool> flags_;
};

namespace detail {

template <class X> struct is_tuple : std::false_type {};
template <class... Xs> struct is_tuple<std::tuple<Xs...>> : std::true_type {};

template <class X> auto as_tuple(X&& x) {
  if constexpr (is_tuple<std::remove_cvref_t<X>>::value) {
    return std::forward<X>(x);
  } else {
    return std::make_tuple(std::forward<X>(x));
  }
}

template <class X> struct tensor_element;
template <class T> struct tensor_element<Tensor<T>> { using type = T; };
template <class Tuple> struct element_types;
template <class... Rs> struct element_types<std::tuple<Tensor<Rs>...>> { using type = std::tuple<Rs...>; };

inline std::vector<bool> needs_grad_of(const Node::Inputs& inputs) {
  std::vector<bool> needs(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) needs[i] = inputs[i]->requires_grad;
  return needs;
}

// Where an output lives: its shape and device.
struct OutputPlace {
  Shape shape;
  Device device;
};

// The gradient that arrived at `output`, or zeros where the output lives when none did.
template <class R> Tensor<R> output_grad(const std::weak_ptr<VarSlot>& output, const OutputPlace& place) {
  if (auto slot = output.lock(); slot && slot->has_pending()) return static_cast<const VarImpl<R>&>(*slot).pending;
  return zeros<R>(place.shape, place.device);
}

// The recorded gradient that arrived at `output` (create_graph), or zeros where the output lives when none did.
template <class R> Var<R> output_grad_var(const std::weak_ptr<VarSlot>& output, const OutputPlace& place) {
  if (auto slot = output.lock()) {
    if (const auto& g = static_cast<const VarImpl<R>&>(*slot).pending_graph) return Var<R>::from_slot(g);
  }
  return constant(zeros<R>(place.shape, place.device));
}

// Input i of `node` as the variable the op was called with.
template <class T> Var<T> input_var(const Node& node, std::size_t i) {
  return Var<T>::from_slot(std::static_pointer_cast<VarImpl<T>>(node.inputs[i]));
}

// Adds input i's gradient `g`, unless it is not needed or undefined (an undefined gradient means zero).
template <class T>
void accumulate_input(const Node& node, std::size_t i, const Tensor<T>& g, bool needed) {
  if (!needed || !g.defined()) return;
  static_cast<VarImpl<T>&>(*node.inputs[i]).accumulate(g, node.name(), static_cast<std::ptrdiff_t>(i));
}

// The same for a recorded gradient (create_graph).
template <class T>
void accumulate_input_var(const Node& node, std::size_t i, const Var<T>& g, bool needed) {
  if (!needed || !g.defined()) return;
  static_cast<VarImpl<T>&>(*node.inputs[i]).accumulate(g.slot(), node.name(), static_cast<std::ptrdiff_t>(i));
}

// A custom op without a recorded backward.
struct NoGraphBackward {};

template <class Saved, class Backward, class GraphBackward, class Outputs, class... Ts> class CustomNode;

template <class Saved, class Backward, class GraphBackward, class... Rs, class... Ts>
class CustomNode<Saved, Backward, GraphBackward, std::tuple<Rs...>, Ts...> final : public Node {
 public:
  CustomNode(std::string name, Saved saved, Backward backward, GraphBackward graph_backward,
             std::array<OutputPlace, sizeof...(Rs)> output_places)
      : Node(std::move(name)),
        saved_(std::move(saved)),
        backward_(std::move(backward)),
        graph_backward_(std::move(graph_backward)),
        output_places_(output_places) {}

  void backward() override {
    const std::vector<bool> needs = needs_grad_of(inputs);
    auto dys = output_grads(std::index_sequence_for<Rs...>{});
    auto grads = as_tuple(std::apply(
        [&](const auto&... dy) { return backward_(*saved_, NeedsGrad(needs), dy...); }, dys));
    static_assert(std::is_same_v<decltype(grads), std::tuple<Tensor<Ts>...>>,
                  "custom_op: backward must return one Tensor per input, each of its input's dtype");
    accumulate(grads, needs, std::index_sequence_for<Ts...>{});
  }
  void backward_graph() override {
    if constexpr (std::is_same_v<GraphBackward, NoGraphBackward>) {
      Node::backward_graph();
    } else {
      const std::vector<bool> needs = needs_grad_of(inputs);
      const std::tuple<Var<Ts>...> xs = input_vars(std::index_sequence_for<Ts...>{});
      const std::tuple<Var<Rs>...> dys = output_grad_vars(std::index_sequence_for<Rs...>{});
      auto grads = as_tuple(std::apply(
          [&](const auto&... dy) { return graph_backward_.fn(*saved_, NeedsGrad(needs), xs, dy...); }, dys));
      static_assert(std::is_same_v<decltype(grads), std::tuple<Var<Ts>...>>,
                    "custom_op: graph_backward must return one Var per input, each of its input's dtype");
      accumulate_vars(grads, needs, std::index_sequence_for<Ts...>{});
    }
  }
  void release_saved() override { saved_.reset(); }

 private:
  template <std::size_t... K> std::tuple<Tensor<Rs>...> output_grads(std::index_sequence<K...>) const {
    return {output_grad<Rs>(outputs[K], output_places_[K])...};
  }
  template <std::size_t... K> std::tuple<Var<Rs>...> output_grad_vars(std::index_sequence<K...>) const {
    return {output_grad_var<Rs>(outputs[K], output_places_[K])...};
  }
  template <std::size_t... I> std::tuple<Var<Ts>...> input_vars(std::index_sequence<I...>) const {
    return {input_var<Ts>(*this, I)...};
  }
  template <std::size_t... I>
  void accumulate(const std::tuple<Tensor<Ts>...>& grads, const std::vector<bool>& needs, std::index_sequence<I...>) {
    (accumulate_input<Ts>(*this, I, std::get<I>(grads), needs[I]), ...);
  }
  template <std::size_t... I>
  void accumulate_vars(const std::tuple<Var<Ts>...>& grads, const std::vector<bool>& needs,
                       std::index_sequence<I...>) {
    (accumulate_input_var<Ts>(*this, I, std::get<I>(grads), needs[I]), ...);
  }

  std::optional<Saved> saved_;
  Backward backward_;
  GraphBackward graph_backward_;
  std::array<OutputPlace, sizeof...(Rs)> output_places_;
};

inline void check_input(const std::string& name, std::size_t i, const VarSlot& slot) {
  if (const char* why = unusable_input_reason(slot)) {
    throw AutodiffError(name + ": input " + std::to_string(i) + " of shape " + slot.shape().str() + why);
  }
}
// A node's inputs are usable and on one device (which one is the op's business: its forward gets the tensors).
template <class... Ts> void check_inputs(const std::string& name, const Var<Ts>&... inputs) {
  check_defined_inputs(name, inputs...);
  [[maybe_unused]] std::size_t i = 0;
  (check_input(name, i++, *inputs.slot()), ...);
  if constexpr (sizeof...(Ts) > 0) check_same_device(name, inputs...);
}
template <class T> void check_inputs(const std::string& name, const std::vector<Var<T>>& inputs) {
  check_defined_inputs(name, inputs);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    check_input(name, i, *inputs[i].slot());
    check_device_matches(name, inputs[0].device(), i, inputs[i].device());
  }
}

// Throws naming the first undefined output tensor that a forward returned.
template <class... Rs> void check_outputs(const std::string& name, const Tensor<Rs>&... outputs) {
  std::size_t k = 0;
  const auto check_one = [&](bool defined) {
    if (!defined) [[unlikely]] throw_undefined_tensor(name, concat("output ", k, " of its forward"));
    ++k;
  };
  (check_one(outputs.defined()), ...);
}

// The node of a custom op over a list of inputs of one dtype, with one output.
template <class Saved, class Backward, class GraphBackward, class T> class ListNode final : public Node {
 public:
  ListNode(std::string name, Saved saved, Backward backward, GraphBackward graph_backward, OutputPlace output_place)
      : Node(std::move(name)),
        saved_(std::move(saved)),
        backward_(std::move(backward)),
        graph_backward_(std::move(graph_backward)),
        output_place_(output_place) {}

  void backward() override {
    const std::vector<bool> needs = needs_grad_of(inputs);
    const Tensor<T> dy = output_grad<T>(outputs[0], output_place_);
    const std::vector<Tensor<T>> grads = backward_(*saved_, NeedsGrad(needs), dy);
    check_count(grads.size());
    for (std::size_t i = 0; i < grads.size(); ++i) accumulate_input(*this, i, grads[i], needs[i]);
  }
  void backward_graph() override {
    if constexpr (std::is_same_v<GraphBackward, NoGraphBackward>) {
      Node::backward_graph();
    } else {
      const std::vector<bool> needs = needs_grad_of(inputs);
      std::vector<Var<T>> xs;
      for (std::size_t i = 0; i < inputs.size(); ++i) xs.push_back(input_var<T>(*this, i));
      const std::vector<Var<T>> grads =
          graph_backward_.fn(*saved_, NeedsGrad(needs), xs, output_grad_var<T>(outputs[0], output_place_));
      check_count(grads.size());
      for (std::size_t i = 0; i < grads.size(); ++i) accumulate_input_var(*this, i, grads[i], needs[i]);
    }
  }
  void release_saved() override { saved_.reset(); }

 private:
  void check_count(std::size_t count) const {
    if (count != inputs.size()) {
      throw AutodiffError(name() + ": backward returned " + std::to_string(count) + " gradients for " +
                          std::to_string(inputs.size()) + " inputs");
    }
  }

  std::optional<Saved> saved_;
  Backward backward_;
  GraphBackward graph_backward_;
  OutputPlace output_place_;
};

}  // namespace detail

// A backward written with Var ops (see the top of this file).
template <class F> struct GraphBackward {
  F fn;
};
template <class F> GraphBackward<std::decay_t<F>> graph_backward(F&& fn) { return {std::forward<F>(fn)}; }

namespace detail {

template <class Saved, class Forward, class Backward, class Graph, class... Ts>
auto record_custom_op(std::string name, Forward&& forward, Backward&& backward, Graph graph,
                      const Var<Ts>&... inputs) {
  detail::check_inputs(name, inputs...);
  Saved saved{};
  auto outputs = run_op(name, [&] { return detail::as_tuple(forward(saved, inputs.value()...)); });
  using Elements = typename detail::element_types<decltype(outputs)>::type;
  std::apply([&](const auto&... outs) { detail::check_outputs(name, outs...); }, outputs);
  const bool record = grad_enabled() && (inputs.requires_grad() || ...);

  auto vars = std::apply(
      [&](auto&... outs) {
        return std::make_tuple(
            Var<typename detail::tensor_element<std::remove_cvref_t<decltype(outs)>>::type>(std::move(outs), record)...);
      },
      outputs);
  if (record) {
    std::array<detail::OutputPlace, std::tuple_size_v<Elements>> places;
    std::apply([&](const auto&... v) {
      std::size_t k = 0;
      ((places[k++] = {v.shape(), v.device()}), ...);
    }, vars);
    auto node = std::make_unique<detail::CustomNode<Saved, std::decay_t<Backward>, Graph, Elements, Ts...>>(
        std::move(name), std::move(saved), std::forward<Backward>(backward), std::move(graph), places);
    node->inputs.reserve(sizeof...(Ts));
    (node->inputs.push_back(inputs.slot()), ...);
    std::apply([&](const auto&... v) { (node->outputs.push_back(v.slot()), ...); }, vars);
    Tape::active().record(std::move(node));
  }
  if constexpr (std::tuple_size_v<Elements> == 1) {
    return std::get<0>(std::move(vars));
  } else {
    return vars;
  }
}

}  // namespace detail

template <class Saved, class Forward, class Backward, class... Ts>
auto custom_op(std::string name, Forward&& forward, Backward&& backward, const Var<Ts>&... inputs) {
  return detail::record_custom_op<Saved>(std::move(name), std::forward<Forward>(forward),
                                         std::forward<Backward>(backward), detail::NoGraphBackward{}, inputs...);
}

template <class Saved, class Forward, class Backward, class F, class... Ts>
auto custom_op(std::string name, Forward&& forward, Backward&& backward, GraphBackward<F> graph,
               const Var<Ts>&... inputs) {
  return detail::record_custom_op<Saved>(std::move(name), std::forward<Forward>(forward),
                                         std::forward<Backward>(backward), std::move(graph), inputs...);
}

namespace detail {

template <class Saved, class Forward, class Backward, class Graph, class T>
Var<T> record_list_op(std::string name, Forward&& forward, Backward&& backward, Graph graph,
                      const std::vector<Var<T>>& inputs) {
  detail::check_inputs(name, inputs);
  std::vector<Tensor<T>> values;
  bool any_requires_grad = false;
  for (const Var<T>& x : inputs) {
    values.push_back(x.value());
    any_requires_grad = any_requires_grad || x.requires_grad();
  }
  Saved saved{};
  Tensor<T> output = run_op(name, [&] { return forward(saved, std::as_const(values)); });
  detail::check_outputs(name, output);
  const bool record = grad_enabled() && any_requires_grad;
  Var<T> y(std::move(output), record);
  if (record) {
    auto node = std::make_unique<detail::ListNode<Saved, std::decay_t<Backward>, Graph, T>>(
        std::move(name), std::move(saved), std::forward<Backward>(backward), std::move(graph),
        detail::OutputPlace{y.shape(), y.device()});
    node->inputs.reserve(inputs.size());
    for (const Var<T>& x : inputs) node->inputs.push_back(x.slot());
    node->outputs.push_back(y.slot());
    Tape::active().record(std::move(node));
  }
  return y;
}

}  // namespace detail

template <class Saved, class Forward, class Backward, class T>
Var<T> custom_op(std::string name, Forward&& forward, Backward&& backward, const std::vector<Var<T>>& inputs) {
  return detail::record_list_op<Saved>(std::move(name), std::forward<Forward>(forward),
                                       std::forward<Backward>(backward), detail::NoGraphBackward{}, inputs);
}

// With a recorded backward g(const Saved&, const NeedsGrad&, const std::vector<Var<T>>& inputs, const Var<T>& dy),
// returning one Var per input.
template <class Saved, class Forward, class Backward, class F, class T>
Var<T> custom_op(std::string name, Forward&& forward, Backward&& backward, GraphBackward<F> graph,
                 const std::vector<Var<T>>& inputs) {
  return detail::record_list_op<Saved>(std::move(name), std::forward<Forward>(forward),
                                       std::forward<Backward>(backward), std::move(graph), inputs);
}

}  // namespace tapegrad
