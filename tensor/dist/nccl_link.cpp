// The NCCL link: a nonblocking NCCL communicator (every call returns at once; its state is polled) on one GPU.
// Collectives are queued on the caller's stream, each followed by an event. A watchdog thread polls the events and
// NCCL's asynchronous error every 50 ms: a collective older than the timeout, or an error NCCL reports (a peer that
// died), aborts the NCCL communicator (its kernels then return, so no stream waits forever) and fails the group,
// whose next call throws CommunicationError naming it.
#include "tapegrad/tensor/dist/detail/nccl_link.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>

#include "tapegrad/tensor/gpu/detail/check.cuh"
#include "tapegrad/tensor/gpu/detail/on_device.cuh"

namespace tapegrad::dist::detail {

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::f8e4m3: return ncclFloat8e4m3;
    case DType::f8e5m2: return ncclFloat8e5m2;
  }
  return ncclFloat32;
}

std::string nccl_text(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  if (comm) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) text += std::string(" (") + last + ")";
  }
  return text;
}

class NcclLink final : public DeviceLink {
 public:
  NcclLink(Group& group, int device, const std::function<void(void*, std::size_t)>& share_id)
      : group_(group), device_(device) {
    cuda::OnDevice on(device);
    ncclUniqueId id{};
    if (group.rank() == 0) call("ncclGetUniqueId", ncclGetUniqueId(&id));
    share_id(&id, sizeof id);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    call("ncclCommInitRankConfig", ncclCommInitRankConfig(&comm_, group.size(), id, group.rank(), &config));
    settle("ncclCommInitRankConfig");
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclLink() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    watchdog_.join();
    for (auto& pending : pending_) cudaEventDestroy(pending.done);
    if (!comm_) return;  // aborted
    cuda::OnDevice on(device_);
    // A clean end flushes what is queued; one that does not settle within the timeout aborts.
    const ncclResult_t finalizing = ncclCommFinalize(comm_);
    bool clean = finalizing == ncclSuccess || finalizing == ncclInProgress;
    if (clean) {
      const auto deadline = Clock::now() + group_.options().timeout;
      ncclResult_t state = ncclInProgress;
      while (state == ncclInProgress && Clock::now() < deadline) {
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclSystemError;
        if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      clean = state == ncclSuccess;
    }
    if (clean) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }

  void all_reduce(const void* in, void* out, std::size_t count, DType dtype, cuda::Stream stream) override {
    enqueue("ncclAllReduce", stream, [&] { return ncclAllReduce(in, out, count, nccl_type(dtype), ncclSum, comm_, stream); });
  }
  void all_gather(const void* in, void* out, std::size_t count, DType dtype, cuda::Stream stream) override {
    enqueue("ncclAllGather", stream, [&] { return ncclAllGather(in, out, count, nccl_type(dtype), comm_, stream); });
  }
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, cuda::Stream stream) override {
    enqueue("ncclReduceScatter", stream,
            [&] { return ncclReduceScatter(in, out, count, nccl_type(dtype), ncclSum, comm_, stream); });
  }
  void broadcast(void* data, std::size_t count, DType dtype, int root, cuda::Stream stream) override {
    enqueue("ncclBroadcast", stream,
            [&] { return ncclBroadcast(data, data, count, nccl_type(dtype), root, comm_, stream); });
  }

 private:
  struct Pending {
    cudaEvent_t done;
    Clock::time_point queued;
    const char* what;
  };

  // Fails the group for a call NCCL refused (ncclInProgress is the nonblocking communicator's "started").
  void call(const char* what, ncclResult_t result) {
    if (result == ncclSuccess || result == ncclInProgress) return;
    abort_with(std::string(what) + " failed: " + nccl_text(result, comm_));
    group_.fail(failure_);
  }

  // Waits (under the timeout) until the communicator has taken the last call in.
  void settle(const char* what) {
    const auto deadline = Clock::now() + group_.options().timeout;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      call("ncclCommGetAsyncError", ncclCommGetAsyncError(comm_, &state));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) call(what, state);
      if (Clock::now() > deadline) {
        abort_with(std::string(what) + ": not every rank took part within the timeout");
        group_.fail(failure_);
      }
      std::this_thread::yield();
    }
  }

  template <class Start> void enqueue(const char* what, cuda::Stream stream, Start&& start) {
    cuda::OnDevice on(device_);
    std::lock_guard lock(mutex_);
    if (!failure_.empty()) group_.fail(failure_);
    call(what, start());
    settle(what);
    cudaEvent_t done = nullptr;
    TAPEGRAD_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    TAPEGRAD_CUDA_CHECK(cudaEventRecord(done, stream));
    pending_.push_back({done, Clock::now(), what});
  }

  // With the mutex held: aborts the NCCL communicator and records why (the first reason wins).
  void abort_with(const std::string& why) {
    if (failure_.empty()) failure_ = "NCCL on cuda:" + std::to_string(device_) + ": " + why;
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    note_group_failed();
  }

  void watch() {
    if (cudaSetDevice(device_) != cudaSuccess) return;
    std::unique_lock lock(mutex_);
    while (!stopping_ && comm_) {
      wake_.wait_for(lock, std::chrono::milliseconds(50));
      while (!pending_.empty() && cudaEventQuery(pending_.front().done) == cudaSuccess) {
        cudaEventDestroy(pending_.front().done);
        pending_.pop_front();
      }
      ncclResult_t state = ncclSuccess;
      if (comm_ && ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess &&
          state != ncclInProgress) {
        abort_with("a collective failed: " + nccl_text(state, comm_));
      } else if (!pending_.empty() && Clock::now() - pending_.front().queued > group_.options().timeout) {
        abort_with(std::string(pending_.front().what) + " did not finish within the timeout (a rank hung or died)");
      }
    }
  }

  Group& group_;
  int device_;
  ncclComm_t comm_ = nullptr;
  std::mutex mutex_;  // guards comm_, pending_, failure_ and stopping_ between the caller and the watchdog
  std::condition_variable wake_;
  std::deque<Pending> pending_;
  std::string failure_;
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<DeviceLink> make_nccl_link(Group& group, int device,
                                           const std::function<void(void*, std::size_t)>& share_id) {
  return std::make_unique<NcclLink>(group, device, share_id);
}

}  // namespace tapegrad::dist::detail
