// The type-erased pieces the tape works with: a variable's slot (value, gradient, creator) and a recorded node.
// Nothing here knows about particular ops.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tapegrad/tensor/detail/small_blocks.hpp"
#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad {

class Node;
class Tape;
namespace detail {
struct TapeEpoch;
}  // namespace detail

// What the tape needs of a variable regardless of its dtype.
class VarSlot {
 public:
  virtual ~VarSlot() = default;
  virtual Shape shape() const = 0;
  virtual DType dtype() const = 0;
  // The gradient flowing into this variable during the current backward pass: a tensor, or under create_graph a
  // recorded variable (whose value pending_value() makes readable as the tensor, for a backward that reads tensors).
  virtual bool has_pending() const = 0;
  virtual void drop_pending() = 0;
  virtual void pending_value() = 0;
  // Adds the pending gradient to the user-visible `.grad` (for retained non-leaf variables).
  virtual void keep_pending() = 0;

  bool requires_grad = false;
  bool retains_grad = false;
  Node* creator = nullptr;              // null for leaves; valid while `recording` has not expired
  Tape* tape = nullptr;                 // the tape `creator` is on; same validity
  std::weak_ptr<const detail::TapeEpoch> recording;  // the tape epoch the creator belongs to
  std::size_t output_index = 0;         // which output of `creator` this is
  const std::function<void()>* gradient_ready = nullptr;  // a leaf's GradientHook (autodiff/gradient_hook.hpp)

  bool is_leaf() const { return creator == nullptr; }
  // True for a non-leaf whose tape has been cleared (or destroyed) since it was recorded.
  bool is_stale() const { return creator != nullptr && recording.expired(); }
};

// One recorded operation. Subclasses implement `backward`: read the pending gradients of `outputs` and add
// gradients into `inputs`.
class Node {
 public:
  explicit Node(std::string name) : owned_name_(std::move(name)), name_(&owned_name_) {}
  // A name that outlives the node, such as a per-type constant: referred to, not copied.
  struct StaticName {
    const std::string& text;
  };
  explicit Node(StaticName name) : name_(&name.text) {}
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Nodes, and their lists below, come from the thread's small-block cache (tensor/detail/small_blocks.hpp): every op
  // that records makes one, and a backward pass frees them by the thousand.
  static void* operator new(std::size_t bytes) { return detail::block_allocate(bytes); }
  static void operator delete(void* node, std::size_t bytes) noexcept { detail::block_free(node, bytes); }

  const std::string& name() const { return *name_; }
  // Reads the pending gradients of `outputs` and adds gradients into `inputs`.
  virtual void backward() = 0;
  // The same under create_graph, recorded on the active tape, so that the gradients are variables that can be
  // differentiated again. A node without its own runs backward() and hands out gradients that a later backward
  // cannot pass: differentiating them again throws naming the node (never a silent zero).
  virtual void backward_graph();
  // Frees what forward saved; after this, backward may not run again.
  virtual void release_saved() = 0;

  using Inputs = std::vector<std::shared_ptr<VarSlot>, detail::BlockAllocator<std::shared_ptr<VarSlot>>>;
  using Outputs = std::vector<std::weak_ptr<VarSlot>, detail::BlockAllocator<std::weak_ptr<VarSlot>>>;
  Inputs inputs;
  Outputs outputs;  // weak: a dropped output simply receives no gradient
  bool released = false;
  std::size_t tape_index = 0;

 private:
  std::string owned_name_;
  const std::string* name_;
};

namespace detail {
// The node whose backward() a create_graph pass runs in place of a recorded one (null otherwise): the gradients it
// adds become variables made by a node that refuses to be differentiated.
const Node*& once_differentiable_node();
// Records on the active tape that `gradient` came from `from`'s backward() under create_graph.
void record_once_differentiable(const std::shared_ptr<VarSlot>& gradient, const Node& from);

// grad()'s pass: the variables whose gradients it hands back, each with the leaf that collects them; leaves outside
// it are left alone (their .grad untouched).
struct GradCapture {
  std::vector<std::pair<const VarSlot*, VarSlot*>> sinks{};
  // A nested pass's floor (Tape::backward): a gradient for a variable made below it stops at its sink, leaving the
  // enclosing pass's gradients alone.
  std::size_t floor = 0;
  VarSlot* sink_of(const VarSlot* slot) const {
    for (const auto& [from, sink] : sinks) {
      if (from == slot) return sink;
    }
    return nullptr;
  }
};
// This thread's pass in grad(), or null.
GradCapture*& grad_capture();
}  // namespace detail

}  // namespace tapegrad
