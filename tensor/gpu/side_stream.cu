#include "tapegrad/tensor/gpu/detail/side_stream.hpp"

#include <map>

#include "tapegrad/tensor/gpu/detail/check.cuh"
#include "tapegrad/tensor/gpu/detail/on_device.cuh"

namespace tapegrad::cuda {

namespace {
// `to` waits for what is queued on `from` now.
void order_after(int device, Stream from, Stream to) {
  OnDevice on(device);
  cudaEvent_t event = nullptr;
  TAPEGRAD_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(event, from);
  const cudaError_t waited = recorded == cudaSuccess ? cudaStreamWaitEvent(to, event, 0) : recorded;
  cudaEventDestroy(event);  // (the wait keeps what it needs)
  TAPEGRAD_CUDA_CHECK(waited);
}

// Lives as long as the thread; its streams are destroyed with it (CUDA ignores that at process exit).
struct SideStreams {
  std::map<int, Stream> by_device;
  ~SideStreams() {
    for (auto& [device, stream] : by_device) cudaStreamDestroy(stream);
  }
};
}  // namespace

SideStream::SideStream(int device) : device_(device) {
  thread_local SideStreams streams;
  Stream& stream = streams.by_device[device];
  if (!stream) {
    OnDevice on(device);
    TAPEGRAD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  stream_ = stream;
}

void SideStream::wait_for_current() const { order_after(device_, current_stream(device_), stream_); }
void SideStream::current_waits() const { order_after(device_, stream_, current_stream(device_)); }

}  // namespace tapegrad::cuda
