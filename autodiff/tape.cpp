#include "tapegrad/autodiff/tape.hpp"

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <thread>
#include <utility>

#include "tapegrad/autodiff/gradient_hook.hpp"
#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/core/detail/op_scope.hpp"

namespace tapegrad {

namespace detail {
// Which thread uses a tape. The tape's epochs share it, so that a thread holding only a variable's epoch can ask
// without touching the tape itself.
struct TapeOwner {
  std::mutex mutex;
  Tape* tape = nullptr;    // null once the tape is being destroyed
  std::thread::id thread;  // the thread using it, while `uses` > 0
  std::size_t uses = 0;
};
struct TapeEpoch {
  std::shared_ptr<TapeOwner> owner;
};
}  // namespace detail

namespace {
// Read by every op: initial-exec, one load instead of the dynamic linker's lookup per access (tensor/small_blocks.cpp).
[[gnu::tls_model("initial-exec")]] thread_local Tape* active_tape = nullptr;
[[gnu::tls_model("initial-exec")]] thread_local bool grad_mode = true;

std::shared_ptr<const detail::TapeEpoch> new_epoch(const std::shared_ptr<detail::TapeOwner>& owner) {
  return std::make_shared<const detail::TapeEpoch>(detail::TapeEpoch{owner});
}

// Marks `owner`'s tape as used by this thread once more; throws naming `op` when another thread uses it.
Tape& claim(detail::TapeOwner& owner, std::string_view op) {
  const std::lock_guard lock(owner.mutex);
  if (owner.tape == nullptr) {
    throw AutodiffError(detail::concat(op, ": the tape has been destroyed"));
  }
  if (owner.uses > 0 && owner.thread != std::this_thread::get_id()) {
    throw AutodiffError(detail::concat(
        op, ": the tape is in use by another thread (active there, or running backward); a tape is used by one thread "
            "at a time: do this in that thread, or record on a Tape of this thread's own (TapeScope)"));
  }
  owner.thread = std::this_thread::get_id();
  ++owner.uses;
  return *owner.tape;
}
}  // namespace

Tape::Tape() : owner_(std::make_shared<detail::TapeOwner>()), epoch_(new_epoch(owner_)) { owner_->tape = this; }

Tape::~Tape() {
  const std::lock_guard lock(owner_->mutex);
  owner_->tape = nullptr;
}

Tape& Tape::active() {
  if (active_tape == nullptr) {
    // A thread's default tape is in use by it for as long as the thread lives: never released, so that no other
    // thread can take it up while it is destroyed at the thread's exit.
    thread_local Tape default_tape;
    [[maybe_unused]] thread_local const bool claimed = (claim(*default_tape.owner_, "Tape::active"), true);
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
  const TapeUse use(*this, "Tape::clear");
  nodes_.clear();
  epoch_ = new_epoch(owner_);
}

void Tape::backward(const std::vector<VarSlot*>& roots, const BackwardOptions& options, std::size_t floor) {
  std::size_t last = 0;
  bool any = false;
  for (const VarSlot* root : roots) {
    if (root->is_leaf()) continue;  // the seed already sits in the leaf's gradient
    if (root->recording.lock() != epoch_) {
      throw AutodiffError("backward: the output was recorded on another tape, or on this tape before it was cleared");
    }
    last = std::max(last, root->creator->tape_index);
    any = true;
  }
  if (!any) return;
  try {
    run_backward(last, options, floor);
  } catch (...) {
    // Leave no half-propagated gradient behind for the next pass.
    for (std::size_t i = floor; i <= last; ++i) {
      for (auto& out : nodes_[i]->outputs) {
        if (auto slot = out.lock()) slot->drop_pending();
      }
    }
    throw;
  }
}

namespace {
// The hooked leaves of a pass (autodiff/gradient_hook.hpp), by the earliest node that takes each: a leaf's gradient
// is complete once the pass has gone below that node. Empty (and free) while no hook lives.
class ReadyLeaves {
 public:
  ReadyLeaves(const std::vector<std::unique_ptr<Node>>& nodes, std::size_t last) {
    if (!detail::gradient_hooks_live() || detail::grad_capture()) return;  // (grad() leaves .grad alone)
    std::unordered_map<VarSlot*, Place> earliest;
    for (std::size_t i = last + 1; i-- > 0;) {
      const auto& inputs = nodes[i]->inputs;
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        if (inputs[k]->gradient_ready) earliest[inputs[k].get()] = {i, k};
      }
    }
    for (const auto& [leaf, place] : earliest) order_.push_back({place, leaf});
    // The order the pass completes them in, the same in every process that records the same ops.
    std::sort(order_.begin(), order_.end(), [](const auto& a, const auto& b) {
      return a.first.node != b.first.node ? a.first.node > b.first.node : a.first.input < b.first.input;
    });
  }
  // Calls the hooks of the leaves whose earliest node is at `index` or above (the pass is now below it).
  void passed(std::size_t index) {
    while (next_ < order_.size() && order_[next_].first.node >= index) (*order_[next_++].second->gradient_ready)();
  }

 private:
  struct Place {
    std::size_t node, input;  // the earliest node that takes the leaf, and which of its inputs it is
  };
  std::vector<std::pair<Place, VarSlot*>> order_;
  std::size_t next_ = 0;
};
}  // namespace

void Tape::run_backward(std::size_t last, const BackwardOptions& options, std::size_t floor) {
  std::vector<std::shared_ptr<VarSlot>> outputs;  // the node's live outputs, each locked once
  ReadyLeaves ready(nodes_, last);
  const bool retain_graph = options.retain_graph || options.create_graph;
  for (std::size_t i = last + 1; i-- > floor;) {  // (create_graph appends the nodes it records past `last`)
    ready.passed(i + 1);
    Node& node = *nodes_[i];
    outputs.clear();
    bool has_gradient = false;
    for (auto& out : node.outputs) {
      if (auto slot = out.lock()) {
        has_gradient = has_gradient || slot->has_pending();
        outputs.push_back(std::move(slot));
      }
    }
    if (!has_gradient) continue;
    if (node.released) {
      throw AutodiffError("backward: trying to run backward through node '" + node.name() +
                          "' a second time, but its saved tensors were freed after the first backward; pass "
                          "retain_graph = true (or create_graph = true, for a derivative of the gradients) to the "
                          "first backward to keep them");
    }
    if (options.create_graph) {
      run_op(node.name(), [&] { node.backward_graph(); });
    } else {
      run_op(node.name(), [&] { node.backward(); });
    }
    for (auto& slot : outputs) {
      if (slot->retains_grad) slot->keep_pending();
      slot->drop_pending();
    }
    if (!retain_graph) {
      node.release_saved();
      node.released = true;
    }
  }
  ready.passed(floor);
}

detail::GradCapture*& detail::grad_capture() {
  [[gnu::tls_model("initial-exec")]] thread_local GradCapture* capture = nullptr;
  return capture;
}

const Node*& detail::once_differentiable_node() {
  [[gnu::tls_model("initial-exec")]] thread_local const Node* node = nullptr;
  return node;
}

void Node::backward_graph() {
  for (auto& out : outputs) {
    if (auto slot = out.lock()) slot->pending_value();
  }
  struct Current {
    const Node* previous;
    explicit Current(const Node* node) : previous(std::exchange(detail::once_differentiable_node(), node)) {}
    ~Current() { detail::once_differentiable_node() = previous; }
  } current(this);
  backward();
}

namespace {
// What a gradient computed by a node without a recorded backward comes from under create_graph: differentiating it
// again would need that node's second derivative, which it does not have.
class OnceDifferentiableNode final : public Node {
 public:
  explicit OnceDifferentiableNode(const Node& from) : Node(from.name()) {}
  void backward() override {
    throw AutodiffError(name() + ": a second derivative through this op is not available: its backward computes "
                        "gradients without recording them (a custom_op needs graph_backward for that); differentiate "
                        "a gradient that does not depend on it, or write the op with differentiable ops");
  }
  void backward_graph() override { backward(); }
  void release_saved() override {}
};
}  // namespace

void detail::record_once_differentiable(const std::shared_ptr<VarSlot>& gradient, const Node& from) {
  auto node = std::make_unique<OnceDifferentiableNode>(from);
  node->outputs.push_back(gradient);
  Tape::active().record(std::move(node));
}

TapeUse::TapeUse(Tape& tape, std::string_view op) : owner_(tape.owner_), tape_(&claim(*owner_, op)) {}

TapeUse::TapeUse(const VarSlot& root, std::string_view op) {
  const std::shared_ptr<const detail::TapeEpoch> epoch = root.recording.lock();
  if (!epoch) {
    throw AutodiffError(detail::concat(op, ": the output of shape ", root.shape(),
                                       " was recorded on a tape that has since been cleared"));
  }
  owner_ = epoch->owner;
  tape_ = &claim(*owner_, op);
}

TapeUse::~TapeUse() {
  const std::lock_guard lock(owner_->mutex);
  --owner_->uses;
}

TapeScope::TapeScope(Tape& tape) : use_(tape, "TapeScope"), previous_(&Tape::active()) { active_tape = &tape; }
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
