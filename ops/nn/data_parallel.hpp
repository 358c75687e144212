// Data parallelism for a module (PyTorch DDP's design): every rank holds the whole module, runs it on its own part
// of the batch, and the gradients are averaged over the ranks while backward still runs.
//
//   nn::broadcast_parameters(model, comm);          // every rank starts from rank 0's values
//   nn::DataParallel ddp(model, comm);             // hooks every parameter
//   for (...) {
//     backward(loss_on_my_shard);                   // full buckets start their all_reduce as they complete
//     ddp.finish_gradients();                       // waits for the buckets: .grad() is the ranks' average
//     optimizer.step();                             // the same update on every rank
//     optimizer.zero_grad();
//   }
//
// The parameters are grouped into buckets of at most `bucket_bytes` (one dtype and device each), filled in reverse
// registration order, which is roughly the order backward completes their gradients (the last layer's first). A
// bucket's all_reduce starts as soon as backward has gone past every node that takes one of its parameters
// (autodiff/gradient_hook.hpp) and the buckets before it have started (every rank then starts them in the same
// order): on a GPU on a side stream beside the rest of the backward; over MPI as a nonblocking
// call. With each rank's loss the mean over its own equal share of the batch, the averaged gradients are those of
// the mean over the whole batch. One backward pass per finish_gradients (accumulate micro-batches' losses first).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "tapegrad/autodiff/gradient_hook.hpp"
#include "tapegrad/ops/nn/module.hpp"
#include "tapegrad/tensor/dist/communicator.hpp"

namespace tapegrad::nn {

struct DataParallelOptions {
  std::size_t bucket_bytes = std::size_t{25} << 20;  // PyTorch's default
};

class DataParallel {
 public:
  // `module` must outlive this; its parameters must not change identity (to(), set_parameter) while it lives.
  DataParallel(const Module& module, dist::Communicator comm, DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Starts the buckets backward did not complete (a parameter no node used counts as a zero gradient), waits for
  // every bucket and gives each parameter the ranks' average as its .grad(). Collective.
  void finish_gradients();
  std::size_t bucket_count() const { return buckets_.size(); }
  // The buckets whose all_reduce this pass has started so far (backward starts them as they complete).
  std::size_t started_buckets() const;

 private:
  struct Bucket;
  void parameter_ready(std::size_t bucket);
  void start(Bucket& bucket);

  dist::Communicator comm_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<std::unique_ptr<GradientHook>> hooks_;
  std::size_t next_to_start_ = 0;  // buckets start in order: those before it have started this pass
};

// Copies rank `root`'s parameter values into every rank's parameters, in place. Collective.
void broadcast_parameters(Module& module, const dist::Communicator& comm, int root = 0);

}  // namespace tapegrad::nn
