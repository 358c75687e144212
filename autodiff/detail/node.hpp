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
  // The gradient flowing into this variable during the current backward pass.
  virtual bool has_pending() const = 0;
  virtual void drop_pending() = 0;
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
  virtual void backward() = 0;
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

}  // namespace tapegrad
