// dist::Communicator: a group of processes (ranks) and the collectives they run together on tensors. CPU tensors
// travel over MPI; CUDA tensors over NCCL, queued on the tensor's device's current stream, with the NCCL
// communicator made on the first CUDA collective (its id broadcast over MPI). Knows nothing of the tape: the
// differentiable collectives are ops/dist.hpp.
//
// Communicator::in_process makes the ranks threads of one process instead (no MPI needed); when any two of them put
// their CUDA tensors on the same GPU, which NCCL refuses, their CUDA collectives go through host memory instead.
//
// Every rank of the communicator must call the same collectives in the same order with tensors of the same dtype
// and shape (for broadcast: the root's). Before each collective the ranks compare what they were called with (one
// small MPI all-reduce of a fingerprint: op, dtype, shape, device kind, root, call number); when they disagree,
// every rank throws Error naming what each rank called, and the communicator stays usable. A rank that never
// arrives (hung, or gone without mpirun noticing) makes the others throw CommunicationError after the timeout,
// naming the collective; the communicator is unusable after that (a collective is still in flight), and a Session
// ends such a job with MPI_Abort instead of MPI_Finalize (which would wait forever). A rank that dies is seen by
// mpirun, which ends the others within about a second. A rank whose own part of a collective fails after the ranks
// agreed on it (out of memory, a CUDA error) throws that error and leaves the communicator unusable too; ranks of
// one process (in_process) then throw CommunicationError at once, naming it.
//
// Collectives return new tensors on the input's device (the `_in_place` forms overwrite their argument) and, for
// CPU tensors, have finished when they return; on a GPU they are queued on the stream. Sums of bf16, f16 and the
// fp8 types round after each addition, as NCCL's do; over MPI every rank gets the same bits.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad::dist {

// A collective that timed out or that MPI or NCCL failed; the communicator cannot be used again.
class CommunicationError : public Error {
 public:
  using Error::Error;
};

// Whether this build has MPI (CPU collectives) and NCCL (GPU collectives).
bool has_mpi();
bool has_nccl();

// MPI for the process's lifetime: MPI_Init_thread (MPI_THREAD_SERIALIZED) unless MPI is already initialized, and at
// the end MPI_Finalize, or MPI_Abort(124) when a collective failed (MPI cannot finalize with one in flight). One per
// process, made before the first Communicator; throws Error in a build without MPI.
class Session {
 public:
  Session(int& argc, char**& argv);
  Session();
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

 private:
  bool owns_mpi_ = false;
};

struct CommunicatorOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // how long a collective waits for the other ranks
  std::string name = "world";                                   // in error messages
};

namespace detail {
class Group;
class Request;
}  // namespace detail

// A collective in flight (Communicator::all_reduce_start). wait() returns once it is done: for a CPU tensor, its
// values are then the sum; for a CUDA one, the device's current stream then waits for the sum (it runs on a side
// stream meanwhile). Destroying a Pending that was not waited for waits (and drops any error).
class Pending {
 public:
  Pending();
  explicit Pending(std::unique_ptr<detail::Request> request);
  Pending(Pending&&) noexcept;
  Pending& operator=(Pending&&) noexcept;
  ~Pending();
  void wait();
  // Moves an MPI collective along (MPI makes progress only inside its calls); nothing for the others.
  void progress();

 private:
  std::unique_ptr<detail::Request> request_;
};

// A handle: copies refer to the same communicator. Not for concurrent use from several threads.
class Communicator {
 public:
  // All processes of the job (a duplicate of MPI_COMM_WORLD). Collective. Throws Error without a Session or MPI.
  static Communicator world(const CommunicatorOptions& options = {});
  // The ranks that pass the same `color` form a new communicator, ordered by `key` (then by rank here). Collective.
  // (Not for in_process communicators.)
  Communicator split(int color, int key, const std::string& name) const;
  // `size` ranks that are threads of this process, rank r's communicator at r: hand each to the thread that runs
  // that rank (one per GPU, for instance). Needs no MPI: host tensors are summed in shared memory, CUDA ones over
  // NCCL (its id passed in memory). A rank that does not come to a collective within the timeout fails the others'
  // call with CommunicationError naming it.
  // Ranks that share a GPU (NCCL refuses two ranks on one): the ranks compare their devices at their first CUDA
  // collective, and when any two are the same, every rank's CUDA collectives are staged through host memory: each
  // waits for the stream, copies the tensor to the host, runs the host collective (same checks, timeout, errors and
  // rounding) and copies the result back, returning once it is on the device. A test transport (two ranks on one GPU
  // test the sharded GPU code): slow, and not capturable in a CUDA graph (on a capturing stream it throws Error and
  // fails the communicator). Ranks on different GPUs, and MPI jobs, keep NCCL.
  static std::vector<Communicator> in_process(int size, const CommunicatorOptions& options = {});

  int rank() const;
  int size() const;
  const std::string& name() const;

  // Σ over ranks, element by element; every rank gets the sum.
  template <class T> Tensor<T> all_reduce(const Tensor<T>& t) const;
  template <class T> void all_reduce_in_place(Tensor<T>& t) const;
  // Starts all_reduce_in_place and returns at once (after the ranks' agreement on the call); `t` must live, and not
  // be read or written, until the Pending is waited for.
  template <class T> [[nodiscard]] Pending all_reduce_start(Tensor<T>& t) const;
  // The ranks' tensors [d0, ...] stacked along the first axis in rank order: [size·d0, ...].
  template <class T> Tensor<T> all_gather(const Tensor<T>& t) const;
  // Σ over ranks of [size·d, ...] tensors, each rank keeping its block of d rows (rank r: rows r·d to r·d + d - 1).
  template <class T> Tensor<T> reduce_scatter(const Tensor<T>& t) const;
  // The root's tensor on every rank; the others pass a tensor of the root's shape (its values unused).
  template <class T> Tensor<T> broadcast(const Tensor<T>& t, int root) const;
  template <class T> void broadcast_in_place(Tensor<T>& t, int root) const;
  // Returns once every rank has called it (and, for a GPU, once this rank's queued collectives are done).
  void barrier() const;

  std::chrono::milliseconds timeout() const;

 private:
  explicit Communicator(std::shared_ptr<detail::Group> group) : group_(std::move(group)) {}
  std::shared_ptr<detail::Group> group_;
};

}  // namespace tapegrad::dist
