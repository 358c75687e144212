// The staged link: CUDA collectives of in-process ranks that share a GPU, which NCCL refuses ("Duplicate GPU
// detected"). Each collective copies the tensor to the host on its stream (waiting for the work queued there first),
// runs the group's host collective on the copy, so that the timeout, the errors naming ranks and the rounding of the
// 16-bit and fp8 sums are the host path's, and copies the result back on the stream, waiting for that copy too. The
// ranks' call check ran before (communicator.cpp), and a failure of this rank's part fails the group there, so that
// the other ranks do not wait for it. A test transport: it blocks on the device, so it cannot be captured in a CUDA
// graph (a capturing stream is refused), and each collective crosses the bus twice.
#include <vector>

#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/dist/detail/nccl_link.hpp"
#include "tapegrad/tensor/dtype.hpp"
#include "tapegrad/tensor/gpu/backend.hpp"
#include "tapegrad/tensor/gpu/graph.hpp"

namespace tapegrad::dist::detail {

namespace {

using Bytes = std::vector<unsigned char>;

class StagedLink final : public DeviceLink {
 public:
  StagedLink(Group& group, int device) : group_(group), device_(device) {}

  void all_reduce(const void* in, void* out, std::size_t count, DType dtype, cuda::Stream stream) override {
    Bytes host = to_host(in, count, dtype, stream);
    group_.all_reduce(host.data(), host.data(), count, dtype);
    to_device(out, host, stream);
  }
  void all_gather(const void* in, void* out, std::size_t count, DType dtype, cuda::Stream stream) override {
    const Bytes mine = to_host(in, count, dtype, stream);
    Bytes all(mine.size() * static_cast<std::size_t>(group_.size()));
    group_.all_gather(mine.data(), all.data(), count, dtype);
    to_device(out, all, stream);
  }
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, cuda::Stream stream) override {
    const Bytes all = to_host(in, count * static_cast<std::size_t>(group_.size()), dtype, stream);
    Bytes mine(count * dtype_size(dtype));
    group_.reduce_scatter(all.data(), mine.data(), count, dtype);
    to_device(out, mine, stream);
  }
  void broadcast(void* data, std::size_t count, DType dtype, int root, cuda::Stream stream) override {
    Bytes host = to_host(data, count, dtype, stream);  // (only the root's is read)
    group_.broadcast(host.data(), count, dtype, root);
    to_device(data, host, stream);
  }

 private:
  // `count` elements of device memory, copied once the work queued on `stream` before is done.
  Bytes to_host(const void* src, std::size_t count, DType dtype, cuda::Stream stream) const {
    Bytes host(count * dtype_size(dtype));
    on_stream(stream, [&](auto device) { cuda::copy_device_to_host(host.data(), src, host.size(), device); });
    return host;
  }
  void to_device(void* dst, const Bytes& host, cuda::Stream stream) const {
    on_stream(stream, [&](auto device) { cuda::copy_host_to_device(dst, host.data(), host.size(), device); });
  }
  // copy(device) with `stream` this thread's current stream on the device (the copies wait for it). A build without
  // CUDA has no device tensors: this is never reached there.
  template <class Copy> void on_stream(cuda::Stream stream, Copy&& copy) const {
    by_device("dist: a collective staged through host memory", Device::cuda(device_), [] {}, [&](auto gpu) {
      const cuda::StreamGuard guard(stream, gpu.index);
      check(!cuda::capturing(gpu.index), "dist",  // (`stream` is current now)
            "a collective of ranks that share a GPU (staged through host memory) cannot be captured in a CUDA graph: "
            "it waits for the device");
      copy(gpu.index);
    });
  }

  Group& group_;
  int device_;
};

}  // namespace

std::unique_ptr<DeviceLink> make_staged_link(Group& group, int device) {
  return std::make_unique<StagedLink>(group, device);
}

}  // namespace tapegrad::dist::detail
