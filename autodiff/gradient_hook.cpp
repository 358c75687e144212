#include "tapegrad/autodiff/gradient_hook.hpp"

#include <atomic>

namespace tapegrad {

namespace {
std::atomic<int> live_hooks{0};
}

GradientHook::GradientHook(std::shared_ptr<VarSlot> leaf, std::function<void()> ready)
    : leaf_(std::move(leaf)), ready_(std::move(ready)) {
  if (!leaf_->is_leaf()) {
    throw AutodiffError("GradientHook: the variable of shape " + leaf_->shape().str() +
                        " is not a leaf (its gradient is not kept); hook a parameter");
  }
  if (leaf_->gradient_ready) {
    throw AutodiffError("GradientHook: the leaf of shape " + leaf_->shape().str() + " already has a hook");
  }
  leaf_->gradient_ready = &ready_;
  ++live_hooks;
}

GradientHook::~GradientHook() {
  leaf_->gradient_ready = nullptr;
  --live_hooks;
}

bool detail::gradient_hooks_live() { return live_hooks.load(std::memory_order_relaxed) > 0; }

}  // namespace tapegrad
