// GradientHook: a callback that runs during each backward pass as soon as a leaf's gradient for that pass is
// complete: once the pass has gone past the earliest node on the tape that takes the leaf as input (every node that
// adds to its gradient has then run or been skipped). A pass that does not reach the leaf does not call it. For
// gradient communication that starts while the rest of the backward still runs (nn::DataParallel's buckets).
#pragma once

#include <functional>
#include <memory>

#include "tapegrad/autodiff/var.hpp"

namespace tapegrad {

class GradientHook {
 public:
  // Calls `ready` during backward passes on this thread's tapes while the hook lives. Throws for a non-leaf or a
  // leaf that already has a hook.
  template <class T> GradientHook(const Var<T>& leaf, std::function<void()> ready) : GradientHook(slot_of(leaf), std::move(ready)) {}
  ~GradientHook();
  GradientHook(const GradientHook&) = delete;
  GradientHook& operator=(const GradientHook&) = delete;

 private:
  template <class T> static std::shared_ptr<VarSlot> slot_of(const Var<T>& leaf) {
    if (!leaf.defined()) detail::throw_undefined_var("GradientHook", "the leaf");
    return leaf.slot();
  }
  GradientHook(std::shared_ptr<VarSlot> leaf, std::function<void()> ready);

  std::shared_ptr<VarSlot> leaf_;
  std::function<void()> ready_;
};

namespace detail {
// Whether any GradientHook lives (the tape looks for hooked leaves only then).
bool gradient_hooks_live();
}  // namespace detail

}  // namespace tapegrad
