// An operation graph of cuDNN's backend API and its execution plan, as fused attention builds them
// (cuda/cudnn_attention.cpp). The graph owns every descriptor it makes, and the plan owns the graph: cuDNN's plans
// refer to them for as long as they live.
//
// cuDNN's fused engines recognize a graph by its shape, so a graph that does not match one is refused, not run
// slowly: building throws Refused, which the caller turns into a fall back to tapegrad's own kernels.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "tapegrad/cuda/cudnn_library.hpp"

namespace tapegrad::cuda::cudnn {

// cuDNN declined a graph or a step of building it; what says which and cuDNN's message.
struct Refused {
  std::string what;
};

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type);
  ~Descriptor();
  Descriptor(Descriptor&& other) noexcept : d_(std::exchange(other.d_, nullptr)) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor& operator=(Descriptor&&) = delete;

  template <class V> Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const V& v) {
    return set_values(name, type, 1, &v);
  }
  Descriptor& set_values(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, std::int64_t count,
                         const void* values);
  Descriptor& finalize();
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

using Dims = std::vector<std::int64_t>;
using TensorRef = cudnnBackendDescriptor_t;

class Graph {
 public:
  // A tensor bound to memory at execution by its uid (the same tensor for the same uid); a virtual one lives inside
  // the fused kernel.
  TensorRef tensor(std::int64_t uid, cudnnDataType_t type, Dims dims, Dims strides);
  TensorRef virtual_tensor(cudnnDataType_t type, Dims dims, Dims strides);
  // A [1, 1, 1, 1] value passed by host pointer at execution (the same tensor for the same uid).
  TensorRef scalar(std::int64_t uid, cudnnDataType_t type);

  // y = mode(x[, b[, t]]) elementwise, computed in `precision`; GEN_INDEX takes the axis it indexes.
  void pointwise(cudnnPointwiseMode_t mode, TensorRef x, TensorRef b, TensorRef t, TensorRef y,
                 cudnnDataType_t precision = CUDNN_DATA_FLOAT, std::int64_t axis = -1);
  TensorRef pointwise(cudnnPointwiseMode_t mode, TensorRef x, TensorRef b, const Dims& dims, const Dims& strides);
  // c = a·b over the last two axes, f32 accumulation; each override (when not null) gives a [batch] tensor of the
  // rows (M), columns (N) or inner size (K) each batch element actually has.
  void matmul(TensorRef a, TensorRef b, TensorRef c, TensorRef m = nullptr, TensorRef n = nullptr,
              TensorRef k = nullptr);
  void reduce(cudnnReduceTensorOp_t op, TensorRef x, TensorRef y);  // over the axes where y's size is 1
  void reshape(TensorRef x, TensorRef y);                   // y: x's elements under other dims and strides

  std::span<const std::int64_t> uids() const { return uids_; }
  std::vector<cudnnBackendDescriptor_t> operations() const;
  // The operations in order, a word each ("matmul", "mul", "reduce_amax", "reshape", ...): for tests that hold a
  // graph to cudnn-frontend's.
  const std::string& outline() const { return outline_; }

 private:
  TensorRef add_tensor(std::int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides, bool is_virtual,
                       bool by_value);
  void note(std::string_view word);
  std::vector<Descriptor> tensors_, parts_, operations_;
  std::vector<std::int64_t> uids_;
  std::string outline_;
  std::map<std::int64_t, TensorRef> bound_;  // the tensors with uids
  std::int64_t next_virtual_uid_ = std::int64_t{1} << 40;
};

// cuDNN's operation graph of `graph`'s operations, finalized: cuDNN has checked their form (without a GPU: no engine
// is asked). `handle` ties it to a device, as cuDNN before 9.8 needs; null leaves that unset.
Descriptor operation_graph(const Graph& graph, cudnnHandle_t handle);

struct Binding {
  std::int64_t uid;
  const void* pointer;
};

// A graph's execution plan: the first of cuDNN's heuristic choices that compiles for this device, or, with
// `candidates` > 1, the fastest of the first `candidates` that compile, timed by the plan's first execution. The
// others must keep the first one's promises: with `deterministic`, none whose engine notes that its results vary run
// to run, and none that needs more than max_extra_workspace beyond the first one's workspace.
class Plan {
 public:
  static constexpr std::int64_t max_extra_workspace = std::int64_t{256} << 20;

  // Throws Refused when cuDNN rejects the graph or no choice compiles.
  Plan(Graph graph, cudnnHandle_t handle, int candidates = 1, bool deterministic = false);
  // What the next execute needs: the most any candidate needs, then the kept plan's. Under the caller's lock, as
  // execute.
  std::int64_t workspace_bytes() const;
  // The compiled plans the first execute chooses among: 1 once chosen (or from the start).
  std::size_t candidates() const { return plans_.size(); }
  // Queues the plan on `stream` (the handle's), each of the graph's tensors bound to its pointer (device memory; host
  // memory for a scalar, read as the work is queued). Bindings of uids the graph lacks are ignored. With several
  // candidates the first call runs each on these bindings (once, then three timed runs; every run writes the same
  // outputs in full), waits for the timings and keeps the fastest; a first call on a capturing stream keeps the
  // first. Not for two threads at once (the caller serializes: the handle is shared too).
  void execute(cudnnHandle_t handle, cudaStream_t stream, std::span<const Binding> bindings, void* workspace) const;

 private:
  struct Candidate {
    std::unique_ptr<Descriptor> plan;
    std::int64_t workspace = 0;
  };
  void keep_fastest(cudnnHandle_t handle, cudaStream_t stream, cudnnBackendDescriptor_t pack) const;

  Graph graph_;
  Descriptor operation_graph_;
  std::vector<Descriptor> configs_;
  mutable std::vector<Candidate> plans_;  // compiled, cuDNN's order; one once chosen
};

}  // namespace tapegrad::cuda::cudnn
