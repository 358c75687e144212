// dot_product_attention on cuDNN (cudnn_attention.hpp): which problems its graphs (cuda/cudnn_sdpa.hpp) express, one
// compiled plan per problem, and the memory each plan reads bound to its uids.
#include "tapegrad/cuda/cudnn_attention.hpp"

#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "tapegrad/cuda/attention.hpp"
#include "tapegrad/cuda/cudnn_graph.hpp"
#include "tapegrad/cuda/cudnn_sdpa.hpp"
#include "tapegrad/cuda/settings.hpp"
#include "tapegrad/cuda/strided_copy.hpp"
#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/gpu/detail/on_device.cuh"
#include "tapegrad/tensor/gpu/memory.hpp"

namespace tapegrad::cuda {

namespace {

using attention::Problem;
using attention::RowStrides;
using cudnn::Dims;
using Key = cudnn::SdpaKey;
using enum cudnn::SdpaUid;

// A layout's strides [batch, head, row, element] as a rank-4 tensor's, or none for q's heads packed by kv group,
// which need a fifth axis.
std::optional<Dims> strides_of(const RowStrides& r) {
  if (r.group != 1 && r.group_skip != 0) return std::nullopt;
  return Dims{r.batch, r.head + (r.group == 1 ? r.group_skip : 0), r.row, 1};
}

// Where q's copy gathered from packed groups keeps it: [B, Sq, Hq, D] rows.
Dims gathered_q(const Problem& p) { return {p.Sq * p.q_heads * p.D, p.D, p.q_heads * p.D, 1}; }


bool padded(const Problem& p) { return p.q_lengths || p.kv_lengths; }

Key key_of(DType dtype, const Problem& p, bool backward, int device, DType gradient_dtype = {}) {
  const std::optional<Dims> q = strides_of(p.q);
  return {.backward = backward, .device = device, .dtype = dtype,
          .gradient_dtype = is_fp8(dtype) && backward ? gradient_dtype : DType{}, .batch = p.batch,
          .q_heads = p.q_heads, .kv_heads = p.kv_heads, .Sq = p.Sq, .Sk = p.Sk, .D = p.D, .Dv = p.Dv,
          .q = q ? *q : gathered_q(p), .k = *strides_of(p.k), .v = *strides_of(p.v), .o = *strides_of(p.o),
          .right_bound = p.causal ? 0 : p.window_right, .left_bound = p.window_left,
          .bottom_right = p.bottom_right && (p.Sq != p.Sk || padded(p)), .deterministic = backward && p.deterministic,
          .padding = padded(p)};
}

// Whether r's rows start on 16 bytes (16 / the element size elements).
bool rows_on_16_bytes(const RowStrides& r, bool gathered, DType dtype) {
  const std::optional<Dims> s = strides_of(r);
  if (gathered && !s) return true;  // read by the gather, whose copy is aligned
  const auto n = static_cast<std::int64_t>(16 / dtype_size(dtype));
  return s && r.offset % n == 0 && (*s)[0] % n == 0 && (*s)[1] % n == 0 && (*s)[2] % n == 0;
}

// Why the FP8 graphs cannot express the problem on this device, beyond what every graph needs (TransformerEngine's
// and cudnn-frontend's limits on Hopper); empty when they can.
std::string fp8_unexpressible(const Problem& p, bool backward, int device) {
  int major = 0;
  TAPEGRAD_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major != 9) return detail::concat("a device of compute capability ", major, ".x (FP8 attention: 9.x)");
  if (p.window_left >= 0 || (!p.causal && p.window_right >= 0)) return "a sliding window with FP8";
  if (padded(p)) return "per-batch lengths with FP8";
  if (p.causal && p.bottom_right && p.Sq != p.Sk) return "a bottom-right causal mask with FP8";
  if (p.D % 16 != 0 || p.Dv % 16 != 0) {
    return detail::concat("head sizes ", p.D, " and ", p.Dv, " (FP8: multiples of 16)");
  }
  if (backward && (p.D != 128 || p.Dv != 128)) {
    return detail::concat("head sizes ", p.D, " and ", p.Dv, " in the backward (FP8 on Hopper: 128 only)");
  }
  if (cudnn::api()->version() < 90700 && (p.Sq % 128 != 0 || p.Sk % 128 != 0)) {
    return "sequences not a multiple of 128 with FP8 before cuDNN 9.7";
  }
  return {};
}

// Why cuDNN's graphs cannot express the problem (before asking cuDNN itself); empty when they can.
std::string unexpressible(DType dtype, const Problem& p, bool backward, int device) {
  if (!cudnn::api()) return detail::concat("cuDNN could not be loaded: ", cudnn::unavailable());
  if (dtype != DType::bf16 && dtype != DType::f16 && dtype != DType::f8e4m3) {
    return detail::concat("dtype ", dtype_name(dtype));
  }
  if (p.dropout > 0) return "dropout (cuDNN draws its own numbers)";
  if (p.has_bias) return "a bias";
  if (p.D % 8 != 0 || p.Dv % 8 != 0 || p.D > 256 || p.Dv > 256) {
    return detail::concat("head sizes ", p.D, " and ", p.Dv, " (cuDNN takes multiples of 8 up to 256)");
  }
  if (p.queries_without_keys) return "a query that sees no key";  // tapegrad's kernels give it zeros
  // The frontend's limits without padding.
  const bool right_bound = p.causal || p.window_right >= 0, shifted = p.bottom_right && p.Sq != p.Sk;
  if (!padded(p) && p.Sq > p.Sk && ((right_bound && shifted) || p.window_left >= 0)) {
    return "a bottom-right mask or a left window with more queries than keys";
  }
  // Versions with known bugs, as the frontend refuses them.
  const std::size_t version = cudnn::api()->version();
  if (version == 91000 || version == 91001) return "cuDNN 9.10.0 and 9.10.1 (known bugs)";
  if (version < 91002 && p.window_left >= 0 && !right_bound) return "a left window alone before cuDNN 9.10.2";
  if (version <= 90900 && p.window_left >= 0 && right_bound && p.bottom_right && p.Sq == p.Sk) {
    return "cuDNN 9.9 and older's bug with a bottom-right band";
  }
  if (version == 91400 && p.window_left >= 0 && !p.causal && p.Sk > 1024) {
    return "cuDNN 9.14.0's bug with sliding windows over more than 1024 keys";
  }
  if (backward && version <= 91500 && p.Sk % 128 != 0 && !padded(p)) {
    return "cuDNN 9.15.0 and older's backward with a key count not a multiple of 128";
  }
  if (backward && p.Sq == 1 && p.Sk == 1) return "one query and one key";
  if (!rows_on_16_bytes(p.q, true, dtype) || !rows_on_16_bytes(p.k, false, dtype) ||
      !rows_on_16_bytes(p.v, false, dtype) || !rows_on_16_bytes(p.o, false, dtype)) {
    return "rows that do not start on 16 bytes";
  }
  return is_fp8(dtype) ? fp8_unexpressible(p, backward, device) : std::string();
}

cudnn::Graph graph_of(const Key& key) {
  if (is_fp8(key.dtype)) return key.backward ? cudnn::sdpa_fp8_backward_graph(key) : cudnn::sdpa_fp8_forward_graph(key);
  return key.backward ? cudnn::sdpa_backward_graph(key) : cudnn::sdpa_forward_graph(key);
}

// With set_attention_autotune: how many of cuDNN's heuristic choices a problem's first call times.
constexpr int autotune_candidates = 4;

// A problem's plan, or why there is none.
struct Entry {
  std::unique_ptr<cudnn::Plan> plan;
  std::string refusal;
};

// The entry of `key`, its plan compiled on first use (under the lock: compiling takes a fraction of a second once).
const Entry& entry(const Key& key) {
  static std::mutex mutex;
  static std::map<Key, Entry> entries;
  const std::lock_guard lock(mutex);
  const auto [at, inserted] = entries.try_emplace(key);
  if (inserted) {
    try {
      const OnDevice on(key.device);
      cudnn::Graph graph = graph_of(key);
      at->second.plan = std::make_unique<cudnn::Plan>(std::move(graph), cudnn::handle(key.device),
                                                      attention_autotune() ? autotune_candidates : 1,
                                                      key.deterministic);
    } catch (const cudnn::Refused& refused) {
      at->second.refusal = refused.what;
    } catch (...) {
      entries.erase(at);
      throw;
    }
  }
  return at->second;
}

// The plan for the problem, null with `refusal` set when cuDNN does not run it.
const cudnn::Plan* plan_for(DType dtype, const Problem& p, bool backward, int device, std::string& refusal,
                            DType gradient_dtype = {}) {
  refusal = unexpressible(dtype, p, backward, device);
  if (!refusal.empty()) return nullptr;
  const Entry& e = entry(key_of(dtype, p, backward, device, gradient_dtype));
  refusal = e.refusal;
  return e.plan.get();
}

// Whether every tensor's memory starts on 16 bytes, as the graphs declare (the strides were checked with the problem).
bool on_16_bytes(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

const void* at(const void* base, const RowStrides& r, DType dtype) {
  return static_cast<const char*>(base) + r.offset * static_cast<std::int64_t>(dtype_size(dtype));
}
void* at(void* base, const RowStrides& r, DType dtype) {
  return static_cast<char*>(base) + r.offset * static_cast<std::int64_t>(dtype_size(dtype));
}

// q's heads packed by kv group <-> the gathered copy's rows (gathered_q): the axes [B, Sq, Hkv, G, D].
std::vector<CopyAxis> group_axes(const Problem& p, bool gather) {
  const std::int64_t G = p.q_heads / p.kv_heads;
  const RowStrides& r = p.q;
  const std::int64_t packed[] = {r.batch, r.row, G * r.head + r.group_skip, r.head, 1};
  const std::int64_t dense[] = {p.Sq * p.q_heads * p.D, p.q_heads * p.D, G * p.D, p.D, 1};
  const std::int64_t dims[] = {p.batch, p.Sq, p.kv_heads, G, p.D};
  std::vector<CopyAxis> axes;
  for (int a = 0; a < 5; ++a) axes.push_back({dims[a], gather ? packed[a] : dense[a], gather ? dense[a] : packed[a]});
  return axes;
}

std::atomic<std::int64_t> candidates_timed{0};  // (cudnn_attention_candidates_timed)

// Runs a plan on the device's current stream. The handle is shared by the threads: its stream is set and used
// under a lock, and so is the plan, whose first call may keep one of its candidates (and that one's workspace).
void run(const cudnn::Plan& plan, int device, const std::vector<cudnn::Binding>& bindings) {
  const OnDevice on(device);
  static std::mutex mutex;
  const std::lock_guard lock(mutex);
  const Scratch workspace(static_cast<std::size_t>(plan.workspace_bytes()), device);
  if (plan.candidates() > 1) candidates_timed += static_cast<std::int64_t>(plan.candidates());
  const cudnnHandle_t handle = cudnn::handle(device);
  const cudaStream_t stream = current_stream(device);
  if (const cudnnStatus_t status = cudnn::api()->set_stream(handle, stream); status != CUDNN_STATUS_SUCCESS) {
    throw Error(detail::concat("cudnnSetStream on cuda:", device, ": ", cudnn::describe(status)));
  }
  plan.execute(handle, stream, bindings, workspace.data());
}

std::size_t q_bytes(DType dtype, const Problem& p) {
  return static_cast<std::size_t>(p.batch * p.Sq * p.q_heads * p.D) * dtype_size(dtype);
}

// What every plan of a problem reads, bound to its uids: q (gathered into a copy when its heads are packed by kv
// group), k, v, o, the row statistics, and the scalars, read by host pointer (so they live here until the plan is
// queued).
class Inputs {
 public:
  Inputs(DType dtype, const Problem& p, const void* q, const void* k, const void* v, const void* o,
         const void* log_sums, int device)
      : gathered(!strides_of(p.q)),
        scale_(static_cast<float>(p.scale)),
        // cuDNN before 9.10 needs a finite mask value
        minus_inf_(cudnn::api()->version() >= 91000 ? -INFINITY : -FLT_MAX),
        query_count_(static_cast<std::int32_t>(p.Sq)),
        key_count_(static_cast<std::int32_t>(p.Sk)),
        right_bound_(static_cast<std::int32_t>(p.window_right)),
        // keys j with j + left_bound > the query's row: the diagonal's shift folded in, as the frontend does
        left_bound_(static_cast<float>(p.window_left + 1 - (p.bottom_right ? p.Sk - p.Sq : 0))),
        left_window_(static_cast<std::int32_t>(p.window_left + 1)),
        q_copy_(gathered ? q_bytes(dtype, p) : 0, device),
        // the keys' lengths start on 16 bytes, as the graphs declare
        key_lengths_at_((p.batch + 3) / 4 * 4),
        lengths_(padded(p) ? 2 * static_cast<std::size_t>(key_lengths_at_) * sizeof(std::int32_t) : 0, device) {
    if (gathered) strided_copy(dtype, at(q, p.q, dtype), q_copy_.data(), group_axes(p, true), device);
    if (padded(p)) attention_lengths_int32(p, query_lengths(), key_lengths(), device);
    bindings = {{scale_uid, &scale_},
                {minus_inf_uid, &minus_inf_},
                {one_uid, &one_},
                {q_length_uid, &query_count_},
                {kv_length_uid, &key_count_},
                {right_bound_uid, &right_bound_},
                {left_bound_uid, &left_bound_},
                {left_window_uid, &left_window_},
                {q_lengths_uid, query_lengths()},
                {kv_lengths_uid, key_lengths()},
                {q_uid, gathered ? q_copy_.data() : at(q, p.q, dtype)},
                {k_uid, at(k, p.k, dtype)},
                {v_uid, at(v, p.v, dtype)},
                {o_uid, at(o, p.o, dtype)},
                {stats_uid, log_sums}};
  }
  Inputs(const Inputs&) = delete;
  Inputs& operator=(const Inputs&) = delete;

  const bool gathered;
  std::vector<cudnn::Binding> bindings;

 private:
  float scale_, minus_inf_, one_ = 1;
  std::int32_t query_count_, key_count_, right_bound_;
  float left_bound_;
  std::int32_t left_window_;
  Scratch q_copy_;
  std::int64_t key_lengths_at_;
  Scratch lengths_;  // with padding: each batch element's valid queries, then (at key_lengths_at_) keys, as int32

  std::int32_t* query_lengths() const { return static_cast<std::int32_t*>(lengths_.data()); }
  std::int32_t* key_lengths() const { return query_lengths() ? query_lengths() + key_lengths_at_ : nullptr; }
};

// The FP8 graphs' scales and amaxes bound to their uids (each checked to start on 16 bytes, as the graphs declare),
// the amaxes zeroed first on the current stream (whether cuDNN's engines merge into them or set them).
void bind_fp8(std::vector<cudnn::Binding>& bindings, const cuda::Fp8AttentionScales& s,
              const cuda::Fp8AttentionAmaxes& a, bool backward, int device) {
  const std::vector<cudnn::Binding> scales =
      backward ? std::vector<cudnn::Binding>{{descale_q_uid, s.descale_q},   {descale_k_uid, s.descale_k},
                                             {descale_v_uid, s.descale_v},   {scale_s_uid, s.scale_s},
                                             {descale_s_uid, s.descale_s},   {descale_o_uid, s.descale_o},
                                             {descale_dout_uid, s.descale_dout}, {scale_dp_uid, s.scale_dp},
                                             {descale_dp_uid, s.descale_dp}, {scale_dq_uid, s.scale_dq},
                                             {scale_dk_uid, s.scale_dk},     {scale_dv_uid, s.scale_dv}}
               : std::vector<cudnn::Binding>{{descale_q_uid, s.descale_q}, {descale_k_uid, s.descale_k},
                                             {descale_v_uid, s.descale_v}, {scale_s_uid, s.scale_s},
                                             {descale_s_uid, s.descale_s}, {scale_o_uid, s.scale_o}};
  const std::vector<std::pair<std::int64_t, float*>> amaxes =
      backward ? std::vector<std::pair<std::int64_t, float*>>{{amax_dp_uid, a.dp}, {amax_dq_uid, a.dq},
                                                              {amax_dk_uid, a.dk}, {amax_dv_uid, a.dv}}
               : std::vector<std::pair<std::int64_t, float*>>{{amax_s_uid, a.s}, {amax_o_uid, a.o}};
  for (const cudnn::Binding& b : scales) {
    check(b.pointer && on_16_bytes({b.pointer}), "dot_product_attention",
          "FP8 attention's scales must each start on 16 bytes of device memory (scale ", b.uid, ")");
    bindings.push_back(b);
  }
  const cudaStream_t stream = current_stream(device);
  for (const auto& [uid, amax] : amaxes) {
    check(amax && on_16_bytes({amax}), "dot_product_attention",
          "FP8 attention's amaxes must each start on 16 bytes of device memory (amax ", uid, ")");
    TAPEGRAD_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
    bindings.push_back({uid, amax});
  }
}

}  // namespace

std::int64_t cudnn_attention_candidates_timed() { return candidates_timed.load(); }

std::string cudnn_attention_refusal(DType dtype, const Problem& p, bool backward, int device) {
  std::string refusal;
  plan_for(dtype, p, backward, device, refusal);
  return refusal;
}

bool cudnn_attention_forward(DType dtype, const Problem& p, const void* q, const void* k, const void* v, void* o,
                             void* log_sums, int device) {
  std::string refusal;
  const cudnn::Plan* plan = plan_for(dtype, p, false, device, refusal);
  if (!plan || !on_16_bytes({q, k, v, o})) return false;
  const Inputs inputs(dtype, p, q, k, v, o, log_sums, device);
  run(*plan, device, inputs.bindings);
  if (padded(p)) attention_clear_padding(dtype, p, o, p.o, p.q_heads, p.Dv, true, log_sums, device);
  return true;
}

bool cudnn_attention_backward(DType dtype, const Problem& p, const void* q, const void* k, const void* v,
                              const void* o, const void* log_sums, const void* dout, void* delta, void* dq, void* dk,
                              void* dv, int device) {
  std::string refusal;
  const cudnn::Plan* plan = plan_for(dtype, p, true, device, refusal);
  if (!plan || !on_16_bytes({q, k, v, o, dout, dq, dk, dv})) return false;
  Inputs inputs(dtype, p, q, k, v, o, log_sums, device);
  const Scratch dq_copy(inputs.gathered ? q_bytes(dtype, p) : 0, device);
  const Scratch dq_sum(p.deterministic ? 0 : static_cast<std::size_t>(p.batch * p.q_heads * p.Sq * p.D) * sizeof(float),
                       device);
  inputs.bindings.insert(inputs.bindings.end(), {{dout_uid, at(dout, p.o, dtype)},
                                                 {softmax_sum_uid, delta},
                                                 {dq_sum_uid, dq_sum.data()},
                                                 {dq_uid, inputs.gathered ? dq_copy.data() : at(dq, p.q, dtype)},
                                                 {dk_uid, at(dk, p.k, dtype)},
                                                 {dv_uid, at(dv, p.v, dtype)}});
  run(*plan, device, inputs.bindings);
  if (inputs.gathered) strided_copy(dtype, dq_copy.data(), at(dq, p.q, dtype), group_axes(p, false), device);
  if (padded(p)) {  // the rows past each batch element's lengths, which cuDNN leaves unwritten
    attention_clear_padding(dtype, p, dq, p.q, p.q_heads, p.D, true, nullptr, device);
    attention_clear_padding(dtype, p, dk, p.k, p.kv_heads, p.D, false, nullptr, device);
    attention_clear_padding(dtype, p, dv, p.v, p.kv_heads, p.Dv, false, nullptr, device);
  }
  return true;
}

std::string cudnn_attention_fp8_refusal(const Problem& p, bool backward, DType gradient_dtype, int device) {
  std::string refusal;
  plan_for(DType::f8e4m3, p, backward, device, refusal, gradient_dtype);
  return refusal;
}

bool cudnn_attention_fp8_forward(const Problem& p, const void* q, const void* k, const void* v, void* o,
                                 void* log_sums, const Fp8AttentionScales& scales, const Fp8AttentionAmaxes& amaxes,
                                 int device) {
  constexpr DType e4m3 = DType::f8e4m3;
  std::string refusal;
  const cudnn::Plan* plan = plan_for(e4m3, p, false, device, refusal);
  if (!plan || !on_16_bytes({q, k, v, o})) return false;
  Inputs inputs(e4m3, p, q, k, v, o, log_sums, device);
  const OnDevice on(device);
  bind_fp8(inputs.bindings, scales, amaxes, false, device);
  run(*plan, device, inputs.bindings);
  return true;
}

bool cudnn_attention_fp8_backward(const Problem& p, DType gradient_dtype, const void* q, const void* k, const void* v,
                                  const void* o, const void* log_sums, const void* dout, void* dq, void* dk, void* dv,
                                  const Fp8AttentionScales& scales, const Fp8AttentionAmaxes& amaxes, int device) {
  constexpr DType e4m3 = DType::f8e4m3;
  check(is_fp8(gradient_dtype), "dot_product_attention", "FP8 attention's gradients in ", dtype_name(gradient_dtype),
        " (f8e4m3 or f8e5m2)");
  std::string refusal;
  const cudnn::Plan* plan = plan_for(e4m3, p, true, device, refusal, gradient_dtype);
  if (!plan || !on_16_bytes({q, k, v, o, dout, dq, dk, dv})) return false;
  Inputs inputs(e4m3, p, q, k, v, o, log_sums, device);
  const Scratch dq_copy(inputs.gathered ? q_bytes(gradient_dtype, p) : 0, device);
  inputs.bindings.insert(inputs.bindings.end(),
                         {{dout_uid, at(dout, p.o, gradient_dtype)},
                          {dq_uid, inputs.gathered ? dq_copy.data() : at(dq, p.q, gradient_dtype)},
                          {dk_uid, at(dk, p.k, gradient_dtype)},
                          {dv_uid, at(dv, p.v, gradient_dtype)}});
  const OnDevice on(device);
  bind_fp8(inputs.bindings, scales, amaxes, true, device);
  run(*plan, device, inputs.bindings);
  if (inputs.gathered) {
    strided_copy(gradient_dtype, dq_copy.data(), at(dq, p.q, gradient_dtype), group_axes(p, false), device);
  }
  return true;
}

std::string cudnn_attention_outline(DType dtype, const Problem& p, bool backward, DType gradient_dtype) {
  if (!cudnn::api()) throw Error(detail::concat("cuDNN could not be loaded: ", cudnn::unavailable()));
  try {
    const cudnn::Graph graph = graph_of(key_of(dtype, p, backward, 0, gradient_dtype));
    cudnn::operation_graph(graph, nullptr);
    return graph.outline();
  } catch (const cudnn::Refused& refused) {
    throw Error(detail::concat("cuDNN refused the graph of ", dtype_name(dtype), " attention: ", refused.what));
  }
}

}  // namespace tapegrad::cuda
