// Device memory, streams and transfers of the CUDA backend. Plain C++: callable from code without CUDA headers
// (a Stream is a cudaStream_t).
//
// Memory comes from each device's CUDA memory pool, stream-ordered (cudaMallocFromPoolAsync on the device's
// current stream). The pool keeps freed memory cached rather than returning it to the driver at each
// synchronization; only an allocation that fails hands the cache back (trim) and tries once more before throwing
// OutOfMemoryError. A block is freed on the stream it was allocated on, after the work queued there: a tensor used
// on another stream needs that stream synchronized before the tensor dies, and a stream must outlive the tensors
// allocated on it.
//
// Each device has a current stream per host thread: by default a non-blocking stream tapegrad creates (one per
// device, shared by all threads); set_stream or a StreamGuard makes ops and copies of this thread use the
// caller's own stream instead (a null stream is CUDA's legacy default stream).
#pragma once

#include <cstddef>
#include <optional>

struct CUstream_st;

namespace tapegrad::cuda {

using Stream = CUstream_st*;

// One allocation: where it is, its size, and the stream it is ordered on (and will be freed on).
struct Block {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  int device = 0;
  Stream stream = nullptr;
};

// `bytes` on `device`, ordered on its current stream (0 bytes give a null pointer). Throws OutOfMemoryError when
// the device cannot supply them even after trimming the pool, and tapegrad::Error naming the device and the
// device count when it does not exist.
Block device_allocate(std::size_t bytes, int device);
// Returns `block` to its pool, after the work queued on its stream. Never throws (it runs in destructors, also
// during process shutdown): a failure other than the CUDA runtime having already shut down is reported on stderr.
void device_free(const Block& block) noexcept;

// Scratch device memory for the work queued while it lives: from the pool on the current stream, returned to it in
// stream order (once the work queued before the release is done) when it goes out of scope.
class Scratch {
 public:
  Scratch(std::size_t bytes, int device) : block_(device_allocate(bytes, device)) {}
  ~Scratch() { device_free(block_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* data() const { return block_.ptr; }
  std::size_t bytes() const { return block_.bytes; }

 private:
  Block block_;
};

// Copies, all ordered on the current stream of the device involved. Those that touch host memory return only once
// the copy is done: host data may be read, changed or freed at once.
void copy_host_to_device(void* dst, const void* src, std::size_t bytes, int device);
void copy_device_to_host(void* dst, const void* src, std::size_t bytes, int device);
// Within one device the copy is only queued: the host does not wait. Between two devices it waits for the source
// device's stream, copies peer to peer on the destination's, and waits for the copy.
void copy_device_to_device(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes);

// The stream this thread's ops and copies on `device` are queued on.
Stream current_stream(int device);
// The non-blocking stream tapegrad created for `device`: the current stream unless one was set.
Stream default_stream(int device);
// Makes `stream` (a stream of `device`) this thread's current stream on `device`; default_stream(device) goes back.
void set_stream(Stream stream, int device);
// Waits for all work on `device`, on every stream.
void synchronize(int device);

// Makes `stream` this thread's current stream on `device` for the guard's lifetime.
class StreamGuard {
 public:
  explicit StreamGuard(Stream stream, int device = 0);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  std::optional<Stream> previous_;  // this thread's choice before the guard; none means the default stream
};

struct MemoryStats {
  std::size_t in_use = 0;        // bytes of the live blocks tapegrad allocated on the device
  std::size_t peak_in_use = 0;   // the most in_use has been since the process began or reset_peak_memory
  std::size_t reserved = 0;      // bytes the device's pool holds from the driver: in use plus cached
  std::size_t device_free = 0;   // free bytes of the device, as the driver reports them
  std::size_t device_total = 0;  // the device's total memory
};
MemoryStats memory_stats(int device);
// Starts a new peak: peak_in_use becomes the bytes in use now (to measure what a step needs beyond its inputs).
void reset_peak_memory(int device);

}  // namespace tapegrad::cuda
