// Device memory while work is captured into a CUDA graph (tensor/gpu/graph.hpp). Internal to cuda/: memory.cu and
// graph.cu use it. Plain C++.
//
// A captured graph replays its kernels on the addresses they saw during capture, so what they use must stay where
// it was for the graph's life. While a thread captures on a device, its allocations there come from the graph's
// arena: device memory the arena takes from the driver in chunks and never gives back before the graph and every
// block from it are gone. A block freed during the capture returns to the arena and serves a later allocation of
// the same capture (the recorded work runs in one stream, in order, as stream-ordered reuse would). Memory from
// outside the arena that is freed during the capture is kept alive with the arena: the recorded kernels may read it.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>

#include "tapegrad/tensor/gpu/memory.hpp"

namespace tapegrad::cuda {

class CaptureArena;

// A new, empty arena for captures on `device`.
std::shared_ptr<CaptureArena> make_capture_arena(int device);

// While alive, this thread's allocations on `device` come from `arena`, and its frees of other device memory there
// are kept by the arena. Not nested.
class CaptureScope {
 public:
  CaptureScope(int device, std::shared_ptr<CaptureArena> arena);
  ~CaptureScope();
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;

 private:
  int device_;
};

// For device_allocate: a block from this thread's capturing arena on `device`, if there is one.
std::optional<Block> capture_allocate(std::size_t bytes, int device, Stream stream);

// For device_free: what became of a block. Returned to its arena (it is no longer in use), kept by the arena that
// is capturing (still allocated: the arena frees it when it goes), or none of these (free it as usual).
enum class CaptureFree { returned, kept, not_captured };
CaptureFree capture_free(const Block& block) noexcept;

}  // namespace tapegrad::cuda
