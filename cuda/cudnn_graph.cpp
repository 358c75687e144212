// Building cuDNN backend graphs and plans (see cudnn_graph.hpp): the calls cudnn-frontend makes, written out.
#include "tapegrad/cuda/cudnn_graph.hpp"

#include <algorithm>
#include <optional>

#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/gpu/detail/timing_event.hpp"

namespace tapegrad::cuda::cudnn {

namespace {

void require(cudnnStatus_t status, const char* step) {
  if (status != CUDNN_STATUS_SUCCESS) throw Refused{detail::concat(step, ": ", describe(status))};
}

// The attributes that tie a graph or a plan to a handle: needed before cuDNN 9.8, deprecated since (hence the raw
// values), ignored where a later version no longer knows them.
constexpr auto operation_graph_handle = static_cast<cudnnBackendAttributeName_t>(800);
constexpr auto plan_handle = static_cast<cudnnBackendAttributeName_t>(400);

// Whether the engine of heuristic choice `config` may give other bits run to run (cuDNN's numerical notes); true
// when they cannot be read, so that such a choice is not taken where determinism was asked for.
bool may_vary(cudnnBackendDescriptor_t config) {
  const Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t filled = engine.get();  // cuDNN fills a descriptor the caller made
  std::int64_t count = 0;
  if (api()->get_attribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &filled) !=
      CUDNN_STATUS_SUCCESS) {
    return true;
  }
  std::vector<cudnnBackendNumericalNote_t> notes(CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
  if (api()->get_attribute(filled, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, std::ssize(notes),
                           &count, notes.data()) != CUDNN_STATUS_SUCCESS) {
    return true;
  }
  notes.resize(static_cast<std::size_t>(std::clamp<std::int64_t>(count, 0, std::ssize(notes))));
  return std::ranges::find(notes, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) != notes.end();
}

// Milliseconds of three runs of `plan` after one that warms it up, or none when cuDNN fails to run it.
std::optional<float> time_runs(const Descriptor& plan, cudnnHandle_t handle, cudaStream_t stream,
                               cudnnBackendDescriptor_t pack, const TimingEvent& start, const TimingEvent& stop) {
  const auto run = [&] {
    if (api()->execute(handle, plan.get(), pack) == CUDNN_STATUS_SUCCESS) return true;
    cudaGetLastError();  // the failed run's launch error, which the next launch check would blame on its kernel
    return false;
  };
  if (!run()) return std::nullopt;
  constexpr int timed_runs = 3;
  TAPEGRAD_CUDA_CHECK(cudaEventRecord(start.get(), stream));
  bool ran = true;
  for (int r = 0; r < timed_runs && ran; ++r) ran = run();
  TAPEGRAD_CUDA_CHECK(cudaEventRecord(stop.get(), stream));
  const float ms = elapsed_ms(start, stop);
  return ran ? std::optional(ms) : std::nullopt;
}

std::string_view pointwise_word(cudnnPointwiseMode_t mode) {
  switch (mode) {
    case CUDNN_POINTWISE_ADD: return "add";
    case CUDNN_POINTWISE_SUB: return "sub";
    case CUDNN_POINTWISE_MUL: return "mul";
    case CUDNN_POINTWISE_DIV: return "div";
    case CUDNN_POINTWISE_EXP: return "exp";
    case CUDNN_POINTWISE_LOG: return "log";
    case CUDNN_POINTWISE_IDENTITY: return "identity";
    case CUDNN_POINTWISE_GEN_INDEX: return "index";
    case CUDNN_POINTWISE_CMP_LT: return "lt";
    case CUDNN_POINTWISE_CMP_GE: return "ge";
    case CUDNN_POINTWISE_CMP_GT: return "gt";
    case CUDNN_POINTWISE_LOGICAL_AND: return "and";
    case CUDNN_POINTWISE_BINARY_SELECT: return "select";
    default: return "pointwise";
  }
}

std::string_view reduction_word(cudnnReduceTensorOp_t reduction) {
  switch (reduction) {
    case CUDNN_REDUCE_TENSOR_ADD: return "reduce_add";
    case CUDNN_REDUCE_TENSOR_MAX: return "reduce_max";
    case CUDNN_REDUCE_TENSOR_AMAX: return "reduce_amax";
    default: return "reduce";
  }
}

}  // namespace

Descriptor::Descriptor(cudnnBackendDescriptorType_t type) {
  require(api()->create_descriptor(type, &d_), "cudnnBackendCreateDescriptor");
}

Descriptor::~Descriptor() {
  if (d_) api()->destroy_descriptor(d_);
}

Descriptor& Descriptor::set_values(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                                   std::int64_t count, const void* values) {
  require(api()->set_attribute(d_, name, type, count, values), "cudnnBackendSetAttribute");
  return *this;
}

Descriptor& Descriptor::finalize() {
  require(api()->finalize(d_), "cudnnBackendFinalize");
  return *this;
}

TensorRef Graph::add_tensor(std::int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides,
                            bool is_virtual, bool by_value) {
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const std::int64_t alignment = 16;
  const auto rank = static_cast<std::int64_t>(dims.size());
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, type)
      .set_values(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, rank, dims.data())
      .set_values(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, rank, strides.data())
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, alignment);
  if (is_virtual) t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, true);
  if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, true);
  t.finalize();
  if (!is_virtual) uids_.push_back(uid);
  return tensors_.emplace_back(std::move(t)).get();
}

TensorRef Graph::tensor(std::int64_t uid, cudnnDataType_t type, Dims dims, Dims strides) {
  const auto [at, inserted] = bound_.try_emplace(uid, nullptr);
  if (inserted) at->second = add_tensor(uid, type, dims, strides, false, false);
  return at->second;
}

TensorRef Graph::virtual_tensor(cudnnDataType_t type, Dims dims, Dims strides) {
  return add_tensor(next_virtual_uid_++, type, dims, strides, true, false);
}

TensorRef Graph::scalar(std::int64_t uid, cudnnDataType_t type) {
  const auto [at, inserted] = bound_.try_emplace(uid, nullptr);
  if (inserted) at->second = add_tensor(uid, type, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  return at->second;
}

void Graph::pointwise(cudnnPointwiseMode_t mode, TensorRef x, TensorRef b, TensorRef t, TensorRef y,
                      cudnnDataType_t precision, std::int64_t axis) {
  Descriptor p(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  p.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, mode)
      .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, precision);
  if (mode == CUDNN_POINTWISE_GEN_INDEX) p.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, axis);
  p.finalize();
  Descriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  const float one = 1;
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, p.get())
      .set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y);
  if (b) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, b);
  if (t) op.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, t);
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, one)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, one)
      .finalize();
  parts_.push_back(std::move(p));
  operations_.push_back(std::move(op));
  note(pointwise_word(mode));
}

TensorRef Graph::pointwise(cudnnPointwiseMode_t mode, TensorRef x, TensorRef b, const Dims& dims, const Dims& strides) {
  const TensorRef y = virtual_tensor(CUDNN_DATA_FLOAT, dims, strides);
  pointwise(mode, x, b, nullptr, y);
  return y;
}

void Graph::matmul(TensorRef a, TensorRef b, TensorRef c, TensorRef m, TensorRef n, TensorRef k) {
  Descriptor product(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  product.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT).finalize();
  Descriptor op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, a)
      .set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, b)
      .set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, c)
      .set(CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, product.get());
  if (m) op.set(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, m);
  if (n) op.set(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, n);
  if (k) op.set(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, k);
  op.finalize();
  parts_.push_back(std::move(product));
  operations_.push_back(std::move(op));
  note("matmul");
}

void Graph::reduce(cudnnReduceTensorOp_t reduction, TensorRef x, TensorRef y) {
  Descriptor r(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  r.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, reduction)
      .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT)
      .finalize();
  Descriptor op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  op.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x)
      .set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y)
      .set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, r.get())
      .finalize();
  parts_.push_back(std::move(r));
  operations_.push_back(std::move(op));
  note(reduction_word(reduction));
}

void Graph::reshape(TensorRef x, TensorRef y) {
  Descriptor op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x)
      .set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y)
      .finalize();
  operations_.push_back(std::move(op));
  note("reshape");
}

std::vector<cudnnBackendDescriptor_t> Graph::operations() const {
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const Descriptor& op : operations_) ops.push_back(op.get());
  return ops;
}

void Graph::note(std::string_view word) {
  if (!outline_.empty()) outline_ += ' ';
  outline_ += word;
}

Descriptor operation_graph(const Graph& graph, cudnnHandle_t handle) {
  const std::vector<cudnnBackendDescriptor_t> ops = graph.operations();
  Descriptor d(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  d.set_values(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<std::int64_t>(ops.size()),
               ops.data());
  if (handle) api()->set_attribute(d.get(), operation_graph_handle, CUDNN_TYPE_HANDLE, 1, &handle);
  d.finalize();
  return d;
}

Plan::Plan(Graph graph, cudnnHandle_t handle, int candidates, bool deterministic)
    : graph_(std::move(graph)), operation_graph_(operation_graph(graph_, handle)) {

  Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, operation_graph_.get())
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, CUDNN_HEUR_MODE_A)
      .finalize();
  std::int64_t count = 0;
  require(api()->get_attribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                               &count, nullptr),
          "the heuristics' count");
  // cuDNN fills descriptors the caller made.
  std::vector<cudnnBackendDescriptor_t> raw;
  for (std::int64_t i = 0; i < count; ++i) {
    raw.push_back(configs_.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR).get());
  }
  require(api()->get_attribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                               &count, raw.data()),
          "the heuristics' choices");
  std::string failures;
  for (std::int64_t i = 0; i < count && std::ssize(plans_) < candidates; ++i) {
    const cudnnBackendDescriptor_t config = raw[static_cast<std::size_t>(i)];
    // Alternatives to the first choice (what runs without autotuning, which a deterministic graph is built for) must
    // not vary run to run where that was asked for.
    if (deterministic && !plans_.empty() && may_vary(config)) continue;
    auto plan = std::make_unique<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    api()->set_attribute(plan->get(), plan_handle, CUDNN_TYPE_HANDLE, 1, &handle);
    plan->set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, config);
    // Finalizing compiles the engine's kernel (NVRTC): a choice that does not compile here is skipped.
    if (const cudnnStatus_t status = api()->finalize(plan->get()); status != CUDNN_STATUS_SUCCESS) {
      failures += detail::concat(failures.empty() ? "" : "; ", describe(status));
      continue;
    }
    std::int64_t workspace = 0;
    require(api()->get_attribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, nullptr,
                                 &workspace),
            "the plan's workspace size");
    // ... nor need over max_extra_workspace beyond its workspace (the most autotuning adds to a first call's memory).
    if (!plans_.empty() && workspace > plans_.front().workspace + max_extra_workspace) continue;
    plans_.push_back({std::move(plan), workspace});
  }
  if (plans_.empty()) {
    throw Refused{detail::concat("none of cuDNN's ", count, " engine choices compiled: ", failures)};
  }
}

std::int64_t Plan::workspace_bytes() const {
  std::int64_t most = 0;
  for (const Candidate& c : plans_) most = std::max(most, c.workspace);
  return most;
}

void Plan::keep_fastest(cudnnHandle_t handle, cudaStream_t stream, cudnnBackendDescriptor_t pack) const {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  TAPEGRAD_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
  std::size_t fastest = 0;
  if (capturing == cudaStreamCaptureStatusNone) {
    const TimingEvent start, stop;
    std::optional<float> best;
    for (std::size_t i = 0; i < plans_.size(); ++i) {
      const std::optional<float> ms = time_runs(*plans_[i].plan, handle, stream, pack, start, stop);
      if (ms && (!best || *ms < *best)) {
        best = ms;
        fastest = i;
      }
    }
  }
  Candidate kept = std::move(plans_[fastest]);
  plans_.clear();
  plans_.push_back(std::move(kept));
}

void Plan::execute(cudnnHandle_t handle, cudaStream_t stream, std::span<const Binding> bindings,
                   void* workspace) const {
  const std::span<const std::int64_t> uids = graph_.uids();
  std::vector<void*> pointers;
  for (const std::int64_t uid : uids) {
    const auto bound = std::find_if(bindings.begin(), bindings.end(), [&](const Binding& b) { return b.uid == uid; });
    check(bound != bindings.end(), "cudnn", "no memory was bound to the plan's tensor ", uid);
    pointers.push_back(const_cast<void*>(bound->pointer));  // cuDNN's variant pack takes void* for inputs too
  }
  try {
    Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    pack.set_values(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<std::int64_t>(uids.size()),
                    uids.data())
        .set_values(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                    static_cast<std::int64_t>(pointers.size()), pointers.data())
        .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, workspace)
        .finalize();
    if (plans_.size() > 1) keep_fastest(handle, stream, pack.get());
    require(api()->execute(handle, plans_.front().plan->get(), pack.get()), "cudnnBackendExecute");
  } catch (const Refused& refused) {
    throw Error(detail::concat("cuDNN failed to run a plan it had compiled: ", refused.what));
  }
}

}  // namespace tapegrad::cuda::cudnn
