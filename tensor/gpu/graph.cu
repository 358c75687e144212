// Capture and replay of CUDA graphs (see graph.hpp).
#include "tapegrad/tensor/gpu/graph.hpp"

#include <cstdio>
#include <exception>

#include "tapegrad/tensor/gpu/detail/capture_memory.hpp"
#include "tapegrad/tensor/gpu/detail/check.cuh"
#include "tapegrad/tensor/gpu/memory.hpp"
#include "tapegrad/tensor/gpu/detail/on_device.cuh"

namespace tapegrad::cuda {

struct Graph::State {
  int device = 0;
  std::shared_ptr<CaptureArena> arena;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;

  ~State() {
    OnDevice on(device);
    // Destroying a graph waits for nothing: a replay still running keeps its resources (the runtime's rule); the
    // arena, destroyed after, waits for the device before it frees the memory.
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

Graph Graph::capture(int device, const std::function<void()>& work) {
  auto state = std::make_shared<State>();
  state->device = device;
  state->arena = make_capture_arena(device);
  const Stream stream = current_stream(device);
  OnDevice on(device);
  // Relaxed: the arena may take a chunk from the driver while the capture runs.
  TAPEGRAD_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  try {
    const CaptureScope scope(device, state->arena);
    work();
  } catch (...) {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(stream, &partial);  // ends the capture whatever went wrong; the stream works again
    if (partial != nullptr) cudaGraphDestroy(partial);
    cudaGetLastError();
    throw;
  }
  TAPEGRAD_CUDA_CHECK(cudaStreamEndCapture(stream, &state->graph));
  TAPEGRAD_CUDA_CHECK(cudaGraphInstantiate(&state->exec, state->graph, 0));
  return Graph(std::move(state));
}

void Graph::replay() const {
  OnDevice on(state_->device);
  TAPEGRAD_CUDA_CHECK(cudaGraphLaunch(state_->exec, current_stream(state_->device)));
}

int Graph::device() const { return state_->device; }

bool capturing(int device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TAPEGRAD_CUDA_CHECK(cudaStreamIsCapturing(current_stream(device), &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace tapegrad::cuda
