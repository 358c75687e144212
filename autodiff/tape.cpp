#include "autodiff/tape.hpp"

#include "tensor/error.hpp"

namespace tapegrad {

namespace {
thread_local Tape* active_tape = nullptr;
thread_local bool grad_mode = true;
}  // namespace

Tape::Tape() : epoch_(std::make_shared<char>()) {}
Tape::~Tape() = default;

Tape& Tape::active() {
  if (active_tape == nullptr) {
    thread_local Tape default_tape;
    active_tape = &default_tape;
  }
  return *active_tape;
}

void Tape::record(std::unique_ptr<Node> node) {
  node->tape_index = nodes_.size();
  for (auto& out : node->outputs) {
    if (auto slot = out.lock()) {
      slot->creator = node.get();
      slot->tape = this;
      slot->recording = epoch_;
    }
  }
  nodes_.push_back(std::move(node));
}

void Tape::clear() {
  nodes_.clear();
  epoch_ = std::make_shared<char>();
}

void Tape::backward(VarSlot& root, bool retain_graph) {
  if (root.is_leaf()) return;  // the seed already sits in the leaf's gradient
  if (root.recording.lock() != epoch_) {
    throw AutodiffError("backward: the output was recorded on another tape, or on this tape before it was cleared");
  }
  const std::size_t last = root.creator->tape_index;
  try {
    run_backward(last, retain_graph);
  } catch (...) {
    // Leave no half-propagated gradient behind for the next pass.
    for (std::size_t i = 0; i <= last; ++i) {
      for (auto& out : nodes_[i]->outputs) {
        if (auto slot = out.lock()) slot->drop_pending();
      }
    }
    throw;
  }
}

void Tape::run_backward(std::size_t last, bool retain_graph) {
  for (std::size_t i = last + 1; i-- > 0;) {
    Node& node = *nodes_[i];
    bool has_gradient = false;
    for (auto& out : node.outputs) {
      if (auto slot = out.lock(); slot && slot->has_pending()) has_gradient = true;
    }
    if (!has_gradient) continue;
    if (node.released) {
      throw AutodiffError("backward: trying to run backward through node '" + node.name() +
                          "' a second time, but its saved tensors were freed after the first backward; pass "
                          "retain_graph = true to the first backward to keep them");
    }
    node.backward();
    for (auto& out : node.outputs) {
      if (auto slot = out.lock()) {
        if (slot->retains_grad) slot->keep_pending();
        slot->drop_pending();
      }
    }
    if (!retain_graph) {
      node.release_saved();
      node.released = true;
    }
  }
}

TapeScope::TapeScope(Tape& tape) : previous_(&Tape::active()) { active_tape = &tape; }
TapeScope::~TapeScope() { active_tape = previous_; }

NoGradGuard::NoGradGuard() : previous_(grad_mode) { grad_mode = false; }
NoGradGuard::~NoGradGuard() { grad_mode = previous_; }
bool grad_enabled() { return grad_mode; }

const char* unusable_input_reason(const VarSlot& input) {
  if (input.is_stale()) {
    return " was recorded on a tape that has since been cleared; detach() it to reuse its value";
  }
  if (grad_mode && !input.is_leaf() && input.tape != &Tape::active()) {
    return " was recorded on another tape than the active one, where backward would not reach it; record it on the "
           "active tape, or detach() it";
  }
  return nullptr;
}

}  // namespace tapegrad
