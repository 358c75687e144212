// The tape: an append-only list of nodes in the order they were recorded, which is a topological order.
// backward(y) walks it in reverse from y's node, running each node that has gradient on one of its outputs.
//
// Each thread has its own active tape (a default one, or one made active with TapeScope). Variables keep a weak
// reference to the tape epoch they were recorded in, so a variable from a cleared tape is detected, not used.
//
// A tape is used by one thread at a time: the thread it is active in (a thread's default tape, or a TapeScope's
// tape until the scope ends), or the thread running backward on it. Another thread's TapeScope, backward or clear
// on a tape in use is refused with an AutodiffError; once the scope ends (or the backward returns), any thread may
// use it. A tape that no thread uses is free to be taken up by any.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

#include "tapegrad/autodiff/detail/node.hpp"

namespace tapegrad {

namespace detail {
struct TapeOwner;
}  // namespace detail

struct BackwardOptions {
  bool retain_graph = false;  // keep saved tensors so that backward can run through the graph again
  // Record the backward itself on the tape: each gradient is a variable (Var::grad_var, or grad()'s result) that can
  // be differentiated again. Implies retain_graph: a second backward passes through the same nodes.
  bool create_graph = false;
};

class Tape {
 public:
  Tape();
  ~Tape();
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  // The tape ops record onto in this thread.
  static Tape& active();

  void record(std::unique_ptr<Node> node);
  std::size_t size() const { return nodes_.size(); }
  const Node& node(std::size_t i) const { return *nodes_[i]; }
  // Drops every node. Non-leaf variables recorded so far become stale; leaves (parameters) are untouched.
  void clear();

  // Runs the reverse pass from `roots`, whose pending gradients the caller has seeded while holding a TapeUse of this
  // tape (and, with create_graph, with this tape active), over the nodes from index `floor` up: a pass nested in a
  // create_graph pass (composite_vjp) stays within what it recorded.
  void backward(const std::vector<VarSlot*>& roots, const BackwardOptions& options, std::size_t floor = 0);

 private:
  friend class TapeUse;
  void run_backward(std::size_t last, const BackwardOptions& options, std::size_t floor);
  std::vector<std::unique_ptr<Node>> nodes_;
  std::shared_ptr<detail::TapeOwner> owner_;
  std::shared_ptr<const detail::TapeEpoch> epoch_;
};

// This thread's use of a tape while it lives (see the top of this file); nested uses in one thread are fine.
class TapeUse {
 public:
  // Throws AutodiffError naming `op` when another thread uses `tape`.
  TapeUse(Tape& tape, std::string_view op);
  // The tape that `root` (a non-leaf) was recorded on. Throws AutodiffError naming `op` when that tape has been
  // cleared or destroyed since, or another thread uses it.
  TapeUse(const VarSlot& root, std::string_view op);
  ~TapeUse();
  TapeUse(const TapeUse&) = delete;
  TapeUse& operator=(const TapeUse&) = delete;

  Tape& tape() const { return *tape_; }

 private:
  std::shared_ptr<detail::TapeOwner> owner_;
  Tape* tape_;
};

// Makes `tape` the active tape of this thread until the scope ends. Throws AutodiffError when another thread uses
// `tape`.
class TapeScope {
 public:
  explicit TapeScope(Tape& tape);
  ~TapeScope();
  TapeScope(const TapeScope&) = delete;
  TapeScope& operator=(const TapeScope&) = delete;

 private:
  TapeUse use_;
  Tape* previous_;
};

// Ops record nothing while a NoGradGuard is alive in this thread.
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};
bool grad_enabled();

// Why `input` cannot feed a node recorded now (a phrase to follow "<op>: input 0 of shape [2, 3]"), or nullptr
// when it can. A value from a cleared tape has lost its node; a value from another live tape cannot take part in
// a graph recorded here, since backward on this tape would never reach its node there.
const char* unusable_input_reason(const VarSlot& input);

}  // namespace tapegrad
