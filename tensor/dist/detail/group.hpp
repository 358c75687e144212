// The transports behind dist::Communicator (tensor/dist/communicator.hpp). Internal.
//
// A Group is one communicator's ranks and the collectives on host memory (MPI: tensor/dist/mpi_group.cpp; threads
// of one process: tensor/dist/thread_group.cpp); a DeviceLink the same collectives on one GPU's memory, queued on a
// stream (NCCL: tensor/dist/nccl_link.cpp; for threads that share a GPU, the group's host collectives on staged
// copies: tensor/dist/staged_link.cpp). Each collective runs as a nonblocking call polled until it completes or the
// group's timeout passes; after a timeout the group is failed: every later call throws CommunicationError with the
// first failure's message.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tapegrad/tensor/core/dtype_tag.hpp"
#include "tapegrad/tensor/dist/communicator.hpp"
#include "tapegrad/tensor/gpu/memory.hpp"

namespace tapegrad::dist::detail {

// What a rank called a collective with, as the ranks compare it (tensor/dist/fingerprint.cpp).
using Fingerprint = std::array<std::int64_t, 16>;

class DeviceLink {
 public:
  virtual ~DeviceLink() = default;
  // As Group's below, on device memory, queued on `stream`.
  virtual void all_reduce(const void* in, void* out, std::size_t count, DType dtype, cuda::Stream stream) = 0;
  virtual void all_gather(const void* in, void* out, std::size_t count, DType dtype, cuda::Stream stream) = 0;
  virtual void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, cuda::Stream stream) = 0;
  virtual void broadcast(void* data, std::size_t count, DType dtype, int root, cuda::Stream stream) = 0;
};

// A collective in flight (Communicator::all_reduce_start).
class Request {
 public:
  virtual ~Request() = default;
  // Returns once the collective is done (on a GPU: once the current stream waits for it); throws as the group does.
  virtual void wait() = 0;
  // Lets the transport move the collective along (MPI progresses nonblocking calls only inside its calls).
  virtual void progress() {}
};

class Group {
 public:
  Group(int rank, int size, const CommunicatorOptions& options) : rank_(rank), size_(size), options_(options) {}
  virtual ~Group() = default;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const CommunicatorOptions& options() const { return options_; }
  // The number of collectives called so far: part of each fingerprint, so that ranks that skipped one disagree.
  std::int64_t next_call() { return calls_++; }

  // Every rank's fingerprint when they are not all equal to this rank's `mine`; empty when they are.
  virtual std::vector<Fingerprint> disagreement(const Fingerprint& mine) = 0;
  // `count` elements per rank; `in` may equal `out` for all_reduce.
  virtual void all_reduce(const void* in, void* out, std::size_t count, DType dtype) = 0;
  // out holds size() blocks of `count` elements, in rank order.
  virtual void all_gather(const void* in, void* out, std::size_t count, DType dtype) = 0;
  // in holds size() blocks of `count` elements; out gets the sum of this rank's block.
  virtual void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype) = 0;
  virtual void broadcast(void* data, std::size_t count, DType dtype, int root) = 0;
  virtual void barrier() = 0;
  // Starts the all_reduce of `data` in place; the request completes it. (Here: done at once; MPI overrides it.)
  virtual std::unique_ptr<Request> start_all_reduce(void* data, std::size_t count, DType dtype);
  virtual std::shared_ptr<Group> split(int color, int key, const std::string& name) = 0;
  // The link for GPU `device`, made on first use (collective: every rank asks for its own GPU in the same call).
  virtual DeviceLink& device_link(int device) = 0;

  // Throws CommunicationError "communicator '<name>' (rank r of p): <what>" and fails the group (and the process:
  // any_group_failed); the group's later calls throw it again.
  [[noreturn]] void fail(const std::string& what);
  // Fails the group as fail does, without throwing, after this rank's part of a collective went wrong after the
  // ranks agreed on it (its memory, a CUDA error): the others may be waiting for it, and this rank's next collective
  // must not meet theirs. Ranks in one process are told at once (their collective throws, naming `what`); MPI ranks
  // see the timeout.
  virtual void abort(const std::string& what);
  // Throws the recorded failure, if any.
  void throw_if_failed() const;

 private:
  int rank_, size_;
  CommunicatorOptions options_;
  std::int64_t calls_ = 0;
  std::string failure_;
};

// The job's communicator (MPI_COMM_WORLD duplicated); throws Error in a build without MPI or without a Session.
std::shared_ptr<Group> world_group(const CommunicatorOptions& options);

// The groups of `size` ranks that are threads of this process (tensor/dist/thread_group.cpp), rank r's at r.
std::vector<std::shared_ptr<Group>> thread_groups(int size, const CommunicatorOptions& options);
// Whether threads whose CUDA tensors are on `devices` (rank r's at r) stage their CUDA collectives through host
// memory rather than run them over NCCL: when any two share a GPU (NCCL refuses that: "Duplicate GPU detected").
bool stage_through_host(std::span<const int> devices);

// Whether a collective failed in this process (a Session then aborts the job rather than finalize MPI).
bool any_group_failed();
void note_group_failed();

}  // namespace tapegrad::dist::detail
