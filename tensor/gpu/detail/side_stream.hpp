// A second stream per device and host thread, for work that overlaps the current stream's (a collective beside a
// GEMM). Plain C++, as memory.hpp.
//
// Memory allocated while the side stream is current is freed in its order: before such a tensor dies, make the side
// stream wait for the current stream's uses of it (wait_for_current), as for any tensor used on two streams.
#pragma once

#include "tapegrad/tensor/gpu/memory.hpp"

namespace tapegrad::cuda {

class SideStream {
 public:
  // The side stream of `device` for this thread (a non-blocking stream, made on first use).
  explicit SideStream(int device);
  Stream stream() const { return stream_; }
  // The side stream waits for the work queued so far on the device's current stream.
  void wait_for_current() const;
  // The current stream waits for the work queued so far on the side stream.
  void current_waits() const;

 private:
  int device_;
  Stream stream_;
};

}  // namespace tapegrad::cuda
