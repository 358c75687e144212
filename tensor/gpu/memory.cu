// Device memory, streams and transfers (see memory.hpp). Per device, created on first use and never destroyed (a
// tensor may be freed after main returns): the default stream, the default memory pool set to keep freed memory
// cached, and the count of bytes in use. The current-stream choice is per host thread.
#include "tapegrad/tensor/gpu/memory.hpp"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <mutex>
#include <vector>

#include "tapegrad/tensor/core/detail/op_scope.hpp"
#include "tapegrad/tensor/gpu/detail/capture_memory.hpp"
#include "tapegrad/tensor/gpu/detail/check.cuh"
#include "tapegrad/tensor/gpu/device.hpp"
#include "tapegrad/tensor/gpu/detail/on_device.cuh"

namespace tapegrad::cuda {

namespace {

struct DeviceState {
  std::once_flag ready;
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;
  std::atomic<std::size_t> in_use{0};
  std::atomic<std::size_t> peak_in_use{0};  // the most in_use has been since the last reset_peak_memory
};

DeviceState& state_of(int device) {
  static DeviceState* const states = new DeviceState[static_cast<std::size_t>(device_count())];
  return states[device];
}

// This thread's stream choice per device; none means the device's default stream.
thread_local std::vector<std::optional<Stream>> chosen_streams;

std::optional<Stream>& chosen_stream(int device) {
  const auto index = static_cast<std::size_t>(device);
  if (chosen_streams.size() <= index) chosen_streams.resize(static_cast<std::size_t>(device_count()));
  return chosen_streams[index];
}

// The device's state, set up on first use; throws naming `op` for a device that does not exist.
DeviceState& ready_state(int device, const char* op) {
  check_device_index(device, op);
  DeviceState& s = state_of(device);
  std::call_once(s.ready, [&] {
    int pools_supported = 0;
    TAPEGRAD_CUDA_CHECK(cudaDeviceGetAttribute(&pools_supported, cudaDevAttrMemoryPoolsSupported, device));
    check(pools_supported != 0, op, "device cuda:", device,
          " does not support stream-ordered memory pools, which tapegrad allocates from");
    TAPEGRAD_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&s.pool, device));
    // Keep freed memory in the pool across synchronizations; an allocation that fails trims it (device_allocate).
    std::uint64_t keep_all = std::numeric_limits<std::uint64_t>::max();
    TAPEGRAD_CUDA_CHECK(cudaMemPoolSetAttribute(s.pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
    OnDevice on(device);
    TAPEGRAD_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  });
  return s;
}

Stream current_stream_of(int device, DeviceState& s) {
  const std::optional<Stream>& chosen = chosen_stream(device);
  return chosen ? *chosen : s.stream;
}

// One attempt; an out-of-memory failure is returned, after clearing it from the runtime's last error.
cudaError_t try_allocate(void** ptr, std::size_t bytes, const DeviceState& s, Stream stream) {
  const cudaError_t err = cudaMallocFromPoolAsync(ptr, bytes, s.pool, stream);
  if (err == cudaErrorMemoryAllocation) cudaGetLastError();
  return err;
}

// `bytes` more in use on the device, and the peak raised to match.
void count_in_use(DeviceState& s, std::size_t bytes) {
  const std::size_t now = s.in_use += bytes;
  std::size_t peak = s.peak_in_use.load();
  while (now > peak && !s.peak_in_use.compare_exchange_weak(peak, now)) {
  }
}

// Copies on the device's current stream and waits for the copy: host memory is ready or reusable on return.
void copy_and_wait(void* dst, const void* src, std::size_t bytes, int device, cudaMemcpyKind kind) {
  const Stream stream = current_stream(device);
  if (bytes == 0) return;
  OnDevice on(device);
  TAPEGRAD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  TAPEGRAD_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace

Block device_allocate(std::size_t bytes, int device) {
  DeviceState& s = ready_state(device, "allocate");
  const Stream stream = current_stream_of(device, s);
  if (bytes == 0) return {nullptr, 0, device, stream};
  if (const std::optional<Block> captured = capture_allocate(bytes, device, stream)) {
    count_in_use(s, bytes);
    return *captured;
  }
  OnDevice on(device);
  void* ptr = nullptr;
  cudaError_t err = try_allocate(&ptr, bytes, s, stream);
  if (err == cudaErrorMemoryAllocation) {
    // Once the frees queued on every stream have run, hand the pool's cached memory back to the driver, and retry.
    synchronize(device);
    TAPEGRAD_CUDA_CHECK(cudaMemPoolTrimTo(s.pool, 0));
    err = try_allocate(&ptr, bytes, s, stream);
  }
  if (err == cudaErrorMemoryAllocation) {
    // A failed request can leave the pool holding what it gathered for it (seen on an H200: all of the card): give
    // it back, so that an out-of-memory error does not starve the rest of the process or other processes.
    TAPEGRAD_CUDA_CHECK(cudaMemPoolTrimTo(s.pool, 0));
    const MemoryStats stats = memory_stats(device);
    throw OutOfMemoryError(current_op("allocate"), Device::cuda(device), bytes, stats.device_free, stats.device_total);
  }
  if (err != cudaSuccess) {
    throw_cuda_error(err, "cudaMallocFromPoolAsync(&ptr, bytes, s.pool, stream)", __FILE__, __LINE__);
  }
  count_in_use(s, bytes);
  return {ptr, bytes, device, stream};
}

void device_free(const Block& block) noexcept {
  if (block.ptr == nullptr) return;
  switch (capture_free(block)) {
    case CaptureFree::returned: state_of(block.device).in_use -= block.bytes; return;
    case CaptureFree::kept: return;
    case CaptureFree::not_captured: break;
  }
  const cudaError_t err = cudaFreeAsync(block.ptr, block.stream);
  state_of(block.device).in_use -= block.bytes;  // the state exists: the block was allocated through it
  if (err == cudaSuccess) return;
  cudaGetLastError();
  // At process exit the runtime may have shut down before the last tensors die; their memory goes with it.
  if (err == cudaErrorCudartUnloading || err == cudaErrorContextIsDestroyed) return;
  std::fprintf(stderr, "tapegrad: freeing %zu bytes on cuda:%d failed: %s (%s)\n", block.bytes, block.device,
               cudaGetErrorName(err), cudaGetErrorString(err));
}

void copy_host_to_device(void* dst, const void* src, std::size_t bytes, int device) {
  copy_and_wait(dst, src, bytes, device, cudaMemcpyHostToDevice);
}

void copy_device_to_host(void* dst, const void* src, std::size_t bytes, int device) {
  copy_and_wait(dst, src, bytes, device, cudaMemcpyDeviceToHost);
}

void copy_device_to_device(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes) {
  const Stream stream = current_stream(dst_device);
  OnDevice on(dst_device);
  if (src_device == dst_device) {
    if (bytes != 0) TAPEGRAD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  // The source is complete once its device's stream is; it may be freed (on that stream) once the copy is done.
  TAPEGRAD_CUDA_CHECK(cudaStreamSynchronize(current_stream(src_device)));
  if (bytes == 0) return;
  TAPEGRAD_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, stream));
  TAPEGRAD_CUDA_CHECK(cudaStreamSynchronize(stream));
}

Stream current_stream(int device) { return current_stream_of(device, ready_state(device, "current_stream")); }

Stream default_stream(int device) { return ready_state(device, "default_stream").stream; }

void set_stream(Stream stream, int device) {
  ready_state(device, "set_stream");
  chosen_stream(device) = stream;
}

void synchronize(int device) {
  ready_state(device, "synchronize");
  OnDevice on(device);
  TAPEGRAD_CUDA_CHECK(cudaDeviceSynchronize());
}

StreamGuard::StreamGuard(Stream stream, int device) : device_(device) {
  ready_state(device, "StreamGuard");
  previous_ = chosen_stream(device);
  chosen_stream(device) = stream;
}

StreamGuard::~StreamGuard() { chosen_stream(device_) = previous_; }

MemoryStats memory_stats(int device) {
  DeviceState& s = ready_state(device, "memory_stats");
  MemoryStats stats;
  stats.in_use = s.in_use.load();
  stats.peak_in_use = s.peak_in_use.load();
  std::uint64_t reserved = 0;
  TAPEGRAD_CUDA_CHECK(cudaMemPoolGetAttribute(s.pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  stats.reserved = reserved;
  OnDevice on(device);
  TAPEGRAD_CUDA_CHECK(cudaMemGetInfo(&stats.device_free, &stats.device_total));
  return stats;
}

void reset_peak_memory(int device) {
  DeviceState& s = ready_state(device, "reset_peak_memory");
  s.peak_in_use = s.in_use.load();
}

}  // namespace tapegrad::cuda
