// The tape: an append-only list of nodes in the order they were recorded, which is a topological order.
// backward(y) walks it in reverse from y's node, running each node that has gradient on one of its outputs.
//
// Each thread has its own active tape (a default one, or one made active with TapeScope). Variables keep a weak
// reference to the tape epoch they were recorded in, so a variable from a cleared tape is detected, not used.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "autodiff/node.hpp"

namespace tapegrad {

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
  std::weak_ptr<const void> epoch() const { return epoch_; }

  // Runs the reverse pass from `root`, whose pending gradient the caller has seeded.
  void backward(VarSlot& root, bool retain_graph);

 private:
  void run_backward(std::size_t last, bool retain_graph);
  std::vector<std::unique_ptr<Node>> nodes_;
  std::shared_ptr<const void> epoch_;
};

// Makes `tape` the active tape of this thread until the scope ends.
class TapeScope {
 public:
  explicit TapeScope(Tape& tape);
  ~TapeScope();
  TapeScope(const TapeScope&) = delete;
  TapeScope& operator=(const TapeScope&) = delete;

 private:
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
