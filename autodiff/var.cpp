#include "tapegrad/autodiff/var.hpp"

#include <array>
#include <cstdint>
#include <mutex>

#include "tapegrad/tensor/detail/accumulate.hpp"
#include "tapegrad/tensor/factories.hpp"

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
}  // namespace


template <class T> void VarImpl<T>::keep_pending() { add_to(grad, pending); }

template <class T> void VarImpl<T>::accumulate(const Tensor<T>& g, std::string_view who, std::ptrdiff_t input) {
  const auto node = [&] { return input < 0 ? std::string(who) : detail::concat(who, " (input ", input, ")"); };
  if (!(g.shape() == value.shape())) {
    throw AutodiffError(node() + ": backward returned a gradient of shape " + g.shape().str() + " for a " +
                        std::string(dtype_name(dtype_v<T>)) + " input of shape " + value.shape().str());
  }
  if (!(g.device() == value.device())) {
    throw AutodiffError(node() + ": backward returned a gradient on " + g.device().str() + " for an input on " +
                        value.device().str());
  }
  if (!is_leaf()) {
    add_to(pending, g);  // a non-leaf belongs to one tape, which one thread at a time runs backward on
    return;
  }
  const std::lock_guard lock(leaf_lock(this));
  add_to(grad, g);
}

template <class T> void backward(const Var<T>& y, const Tensor<T>& dy, BackwardOptions options) {
  if (!y.defined()) detail::throw_undefined_var("backward", "the output");
  check_defined(dy, "backward", "the seed gradient");
  auto& slot = *y.slot();
  if (!slot.requires_grad) {
    throw AutodiffError("backward: the output of shape " + y.shape().str() +
                        " does not require grad (no input that requires grad was used to compute it)");
  }
  if (slot.is_stale()) {
    throw AutodiffError("backward: the output of shape " + y.shape().str() +
                        " was recorded on a tape that has since been cleared");
  }
  if (!(dy.shape() == y.shape())) {
    throw AutodiffError("backward: the seed gradient has shape " + dy.shape().str() + " but the output has shape " +
                        y.shape().str());
  }
  if (!(dy.device() == y.device())) {
    throw AutodiffError("backward: the seed gradient is on " + dy.device().str() + " but the output is on " +
                        y.device().str());
  }
  if (slot.is_leaf()) {
    slot.accumulate(dy, "backward (seed gradient)");
    return;
  }
  const TapeUse use(slot, "backward");  // before the seed: a refused backward leaves nothing behind
  slot.accumulate(dy, "backward (seed gradient)");
  use.tape().backward(slot, options.retain_graph);
}

template <class T> void backward(const Var<T>& y, BackwardOptions options) {
  if (!y.defined()) detail::throw_undefined_var("backward", "the output");
  if (y.numel() != 1) {
    throw AutodiffError("backward: output of shape " + y.shape().str() +
                        " is not a scalar; pass a seed gradient of that shape: backward(y, dy)");
  }
  backward(y, ones<T>(y.shape(), y.device()), options);
}

#define TAPEGRAD_INSTANTIATE_VAR(T)                                                 \
  template class VarImpl<T>;                                                        \
  template void backward<T>(const Var<T>&, BackwardOptions);                        \
  template void backward<T>(const Var<T>&, const Tensor<T>&, BackwardOptions);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_VAR)

}  // namespace tapegrad
