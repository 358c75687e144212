// The scaled-dot-product-attention graphs of cuDNN 9, forward and backward, written out as cudnn-frontend expands
// them (its CompositeSDPANode and CompositeSDPABackwardNode): cuDNN's fused engines recognize a graph by its shape,
// so the order of the operations, the types of the intermediate tensors, k and v described transposed and the
// probabilities cast to the I/O type before their product are all as the frontend writes them. The forward keeps
// each row's log-sum-exp (cuDNN's "stats": the natural log of the scaled, masked scores' sum, f32 [B, Hq, Sq]), which
// is what tapegrad's kernels save too: a forward on one engine and a backward on the other agree.
#include "tapegrad/cuda/cudnn_attention.hpp"

#include <cfloat>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "tapegrad/cuda/attention.hpp"
#include "tapegrad/cuda/cudnn_graph.hpp"
#include "tapegrad/cuda/strided_copy.hpp"
#include "tapegrad/tensor/core/error.hpp"
#include "tapegrad/tensor/gpu/detail/on_device.cuh"
#include "tapegrad/tensor/gpu/memory.hpp"

namespace tapegrad::cuda {

namespace {

using attention::Problem;
using attention::RowStrides;
using cudnn::Dims;
using cudnn::Graph;
using cudnn::TensorRef;

constexpr cudnnDataType_t f32 = CUDNN_DATA_FLOAT;

enum Uid : std::int64_t {
  q_uid = 1, k_uid, v_uid, o_uid, stats_uid, scale_uid, minus_inf_uid, q_length_uid, kv_length_uid, right_bound_uid,
  left_bound_uid, dout_uid, dq_uid, dk_uid, dv_uid, one_uid, softmax_sum_uid, dq_sum_uid, q_lengths_uid,
  kv_lengths_uid, left_window_uid
};

// A layout's strides [batch, head, row, element] as a rank-4 tensor's, or none for q's heads packed by kv group,
// which need a fifth axis.
std::optional<Dims> strides_of(const RowStrides& r) {
  if (r.group != 1 && r.group_skip != 0) return std::nullopt;
  return Dims{r.batch, r.head + (r.group == 1 ? r.group_skip : 0), r.row, 1};
}

// Where q's copy gathered from packed groups keeps it: [B, Sq, Hq, D] rows.
Dims gathered_q(const Problem& p) { return {p.Sq * p.q_heads * p.D, p.D, p.q_heads * p.D, 1}; }

// Everything a plan depends on.
struct Key {
  bool backward = false;
  int device = 0;
  DType dtype{};
  std::int64_t batch = 0, q_heads = 0, kv_heads = 0, Sq = 0, Sk = 0, D = 0, Dv = 0;
  Dims q, k, v, o;
  // The keys a query sees: up to its diagonal + right_bound, from its diagonal - left_bound (-1: that side open);
  // bottom_right: the diagonal moved by Sk - Sq.
  std::int64_t right_bound = -1, left_bound = -1;
  bool bottom_right = false, deterministic = false;
  bool padding = false;  // per-batch lengths: each batch element's valid queries and keys
  auto operator<=>(const Key&) const = default;
};

bool padded(const Problem& p) { return p.q_lengths || p.kv_lengths; }

Key key_of(DType dtype, const Problem& p, bool backward, int device) {
  const std::optional<Dims> q = strides_of(p.q);
  return {.backward = backward, .device = device, .dtype = dtype, .batch = p.batch, .q_heads = p.q_heads,
          .kv_heads = p.kv_heads, .Sq = p.Sq, .Sk = p.Sk, .D = p.D, .Dv = p.Dv, .q = q ? *q : gathered_q(p),
          .k = *strides_of(p.k), .v = *strides_of(p.v), .o = *strides_of(p.o),
          .right_bound = p.causal ? 0 : p.window_right, .left_bound = p.window_left,
          .bottom_right = p.bottom_right && (p.Sq != p.Sk || padded(p)), .deterministic = backward && p.deterministic,
          .padding = padded(p)};
}

bool rows_on_16_bytes(const RowStrides& r, bool gathered) {
  const std::optional<Dims> s = strides_of(r);
  if (gathered && !s) return true;  // read by the gather, whose copy is aligned
  return s && r.offset % 8 == 0 && (*s)[0] % 8 == 0 && (*s)[1] % 8 == 0 && (*s)[2] % 8 == 0;
}

// Why cuDNN's graphs cannot express the problem (before asking cuDNN itself); empty when they can.
std::string unexpressible(DType dtype, const Problem& p, bool backward) {
  if (!cudnn::api()) return detail::concat("cuDNN could not be loaded: ", cudnn::unavailable());
  if (dtype != DType::bf16 && dtype != DType::f16) return detail::concat("dtype ", dtype_name(dtype));
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
  if (!rows_on_16_bytes(p.q, true) || !rows_on_16_bytes(p.k, false) || !rows_on_16_bytes(p.v, false) ||
      !rows_on_16_bytes(p.o, false)) {
    return "rows that do not start on 16 bytes";
  }
  return {};
}

cudnnDataType_t io_type(DType dtype) { return dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

Dims transposed(const Dims& s) { return {s[0], s[1], s[3], s[2]}; }

// The dims and strides of the scores [B, Hq, Sq, Sk], their transpose, and the rows' statistics [B, Hq, Sq, 1].
struct Sizes {
  Dims scores, scores_strides, transposed, transposed_strides, rows, row_strides;
  explicit Sizes(const Key& k)
      : scores{k.batch, k.q_heads, k.Sq, k.Sk},
        scores_strides{k.q_heads * k.Sq * k.Sk, k.Sq * k.Sk, k.Sk, 1},
        transposed{k.batch, k.q_heads, k.Sk, k.Sq},
        transposed_strides{k.q_heads * k.Sq * k.Sk, k.Sq * k.Sk, 1, k.Sk},
        rows{k.batch, k.q_heads, k.Sq, 1},
        row_strides{k.q_heads * k.Sq, k.Sq, 1, 1} {}
};

// Each batch element's valid queries (or keys) as the graph reads them: a [batch] tensor when padded, else Sq (Sk) by
// value.
TensorRef lengths(Graph& g, const Key& key, bool keys) {
  if (!key.padding) return g.scalar(keys ? kv_length_uid : q_length_uid, CUDNN_DATA_INT32);
  return g.tensor(keys ? kv_lengths_uid : q_lengths_uid, CUDNN_DATA_INT32, {key.batch, 1, 1, 1}, {1, 1, 1, 1});
}

// What a product's M, N or K override reads: the lengths when padded, nothing otherwise.
TensorRef per_batch(Graph& g, const Key& key, bool keys) { return key.padding ? lengths(g, key, keys) : nullptr; }

// The scores' row (axis 2) or column (axis 3) indices.
TensorRef indices(Graph& g, TensorRef s, const Sizes& z, std::int64_t axis, cudnnDataType_t precision) {
  const TensorRef i = g.virtual_tensor(CUDNN_DATA_INT32, z.scores, z.scores_strides);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, i, precision, axis);
  return i;
}

// s where `keep`, -inf elsewhere.
TensorRef select(Graph& g, TensorRef s, TensorRef keep, const Sizes& z) {
  const TensorRef masked = g.virtual_tensor(f32, z.scores, z.scores_strides);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, g.scalar(minus_inf_uid, f32), keep, masked);
  return masked;
}

// The keys a query sees, as cudnn-frontend spells its masks. Padding (per-batch lengths): s where the row is below
// its batch's queries and the column below its keys. The band (its CompositeDiagonalBandMaskNode, one per side): s
// where the row index (moved by Sk - Sq to the bottom-right diagonal, plus the right bound) is at least the column's,
// then where the column plus the left bound + 1 (moved likewise) exceeds the row's.
TensorRef padding_mask(Graph& g, const Key& key, TensorRef s, const Sizes& z) {
  const auto below = [&](TensorRef index, TensorRef limit) {
    const TensorRef y = g.virtual_tensor(CUDNN_DATA_BOOLEAN, z.scores, z.scores_strides);
    g.pointwise(CUDNN_POINTWISE_CMP_LT, index, limit, nullptr, y, CUDNN_DATA_BOOLEAN);
    return y;
  };
  // (both indices before the comparisons, the frontend's order of operations)
  const TensorRef row = indices(g, s, z, 2, CUDNN_DATA_INT32), column = indices(g, s, z, 3, CUDNN_DATA_INT32);
  const TensorRef rows = below(row, lengths(g, key, false)), columns = below(column, lengths(g, key, true));
  const TensorRef keep = g.virtual_tensor(CUDNN_DATA_BOOLEAN, z.scores, z.scores_strides);
  g.pointwise(CUDNN_POINTWISE_LOGICAL_AND, rows, columns, nullptr, keep, CUDNN_DATA_BOOLEAN);
  return select(g, s, keep, z);
}

TensorRef band_side(Graph& g, const Key& key, TensorRef s, const Sizes& z, bool right) {
  const auto shifted = [&](cudnnPointwiseMode_t mode, TensorRef x, TensorRef by, cudnnDataType_t type) {
    const TensorRef y = g.virtual_tensor(type, z.scores, z.scores_strides);
    g.pointwise(mode, x, by, nullptr, y, type, 3);
    return y;
  };
  constexpr cudnnDataType_t i32 = CUDNN_DATA_INT32;
  TensorRef row = indices(g, s, z, 2, f32), column = indices(g, s, z, 3, f32);
  const TensorRef keep = g.virtual_tensor(CUDNN_DATA_BOOLEAN, z.scores, z.scores_strides);
  if (right) {
    if (key.bottom_right) {
      row = shifted(CUDNN_POINTWISE_ADD, row, lengths(g, key, true), i32);
      row = shifted(CUDNN_POINTWISE_SUB, row, lengths(g, key, false), i32);
    }
    if (key.right_bound > 0) row = shifted(CUDNN_POINTWISE_ADD, row, g.scalar(right_bound_uid, i32), i32);
    g.pointwise(CUDNN_POINTWISE_CMP_GE, row, column, nullptr, keep, CUDNN_DATA_BOOLEAN);
  } else if (key.bottom_right && key.padding) {  // the shift per batch element
    column = shifted(CUDNN_POINTWISE_ADD, column, g.scalar(left_window_uid, i32), i32);
    column = shifted(CUDNN_POINTWISE_SUB, column, lengths(g, key, true), i32);
    column = shifted(CUDNN_POINTWISE_ADD, column, lengths(g, key, false), i32);
    g.pointwise(CUDNN_POINTWISE_CMP_GT, column, row, nullptr, keep, CUDNN_DATA_BOOLEAN);
  } else {  // a fixed shift, folded into the bound
    column = shifted(CUDNN_POINTWISE_ADD, column, g.scalar(left_bound_uid, f32), f32);
    g.pointwise(CUDNN_POINTWISE_CMP_GT, column, row, nullptr, keep, CUDNN_DATA_BOOLEAN);
  }
  return select(g, s, keep, z);
}

TensorRef band_mask(Graph& g, const Key& key, TensorRef s, const Sizes& z) {
  if (key.right_bound >= 0) s = band_side(g, key, s, z, true);
  if (key.left_bound >= 0) s = band_side(g, key, s, z, false);
  return s;
}

Graph forward_graph(const Key& key) {
  Graph g;
  const Sizes z(key);
  const cudnnDataType_t io = io_type(key.dtype);
  const TensorRef q = g.tensor(q_uid, io, {key.batch, key.q_heads, key.Sq, key.D}, key.q);
  const TensorRef k_t = g.tensor(k_uid, io, {key.batch, key.kv_heads, key.D, key.Sk}, transposed(key.k));
  const TensorRef v = g.tensor(v_uid, io, {key.batch, key.kv_heads, key.Sk, key.Dv}, key.v);
  const TensorRef o = g.tensor(o_uid, io, {key.batch, key.q_heads, key.Sq, key.Dv}, key.o);
  const TensorRef stats = g.tensor(stats_uid, f32, z.rows, z.row_strides);
  const TensorRef scale = g.scalar(scale_uid, f32);

  TensorRef s = g.virtual_tensor(f32, z.scores, z.scores_strides);
  g.matmul(q, k_t, s, per_batch(g, key, false), per_batch(g, key, true));
  s = g.pointwise(CUDNN_POINTWISE_MUL, s, scale, z.scores, z.scores_strides);
  if (key.padding) s = padding_mask(g, key, s, z);
  s = band_mask(g, key, s, z);
  const TensorRef max = g.virtual_tensor(f32, z.rows, z.row_strides);
  g.reduce(CUDNN_REDUCE_TENSOR_MAX, s, max);
  const TensorRef shifted = g.pointwise(CUDNN_POINTWISE_SUB, s, max, z.scores, z.scores_strides);
  const TensorRef exps = g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, z.scores, z.scores_strides);
  const TensorRef sum = g.virtual_tensor(f32, z.rows, z.row_strides);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, exps, sum);
  const TensorRef log_sum = g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, z.rows, z.row_strides);
  g.pointwise(CUDNN_POINTWISE_ADD, max, log_sum, nullptr, stats);
  const TensorRef probabilities = g.virtual_tensor(io, z.scores, z.scores_strides);  // the I/O type, as the
  g.pointwise(CUDNN_POINTWISE_DIV, exps, sum, nullptr, probabilities);                 // product's A must be
  g.matmul(probabilities, v, o, per_batch(g, key, false), nullptr, per_batch(g, key, true));
  return g;
}

// out [B, Hkv, Sk, width] = a·b [B, Hq, Sk, width] (a: the transposed scores) summed over each kv head's group of
// q heads.
void product_over_groups(Graph& g, const Key& key, TensorRef a, TensorRef b, TensorRef out, std::int64_t width) {
  const TensorRef keys = per_batch(g, key, true), queries = per_batch(g, key, false);
  if (key.q_heads == key.kv_heads) {
    g.matmul(a, b, out, keys, nullptr, queries);
    return;
  }
  const TensorRef per_head = g.virtual_tensor(io_type(key.dtype), {key.batch, key.q_heads, key.Sk, width},
                                              {key.q_heads * key.Sk * width, key.Sk * width, width, 1});
  g.matmul(a, b, per_head, keys, nullptr, queries);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, per_head, out);
}

Graph backward_graph(const Key& key) {
  Graph g;
  const Sizes z(key);
  const cudnnDataType_t io = io_type(key.dtype);
  const Dims q_dims{key.batch, key.q_heads, key.Sq, key.D}, o_dims{key.batch, key.q_heads, key.Sq, key.Dv};
  const TensorRef q = g.tensor(q_uid, io, q_dims, key.q);
  const TensorRef k_t = g.tensor(k_uid, io, {key.batch, key.kv_heads, key.D, key.Sk}, transposed(key.k));
  const TensorRef v_t = g.tensor(v_uid, io, {key.batch, key.kv_heads, key.Dv, key.Sk}, transposed(key.v));
  const TensorRef o = g.tensor(o_uid, io, o_dims, key.o);
  const TensorRef dout = g.tensor(dout_uid, io, o_dims, key.o);
  const TensorRef stats = g.tensor(stats_uid, f32, z.rows, z.row_strides);
  const TensorRef dq = g.tensor(dq_uid, io, q_dims, key.q);
  const TensorRef dk = g.tensor(dk_uid, io, {key.batch, key.kv_heads, key.Sk, key.D}, key.k);
  const TensorRef dv = g.tensor(dv_uid, io, {key.batch, key.kv_heads, key.Sk, key.Dv}, key.v);
  const TensorRef scale = g.scalar(scale_uid, f32);
  const TensorRef one = g.scalar(one_uid, f32);

  // Each row's Σ dout·o (FlashAttention's δ), kept in the caller's scratch. The frontend's strides for the product.
  const TensorRef products = g.pointwise(CUDNN_POINTWISE_MUL, dout, o, o_dims,
                                         {key.q_heads * key.Sq * key.Dv, key.Sq * key.Dv, key.q_heads * key.Dv, 1});
  const TensorRef row_sums = g.virtual_tensor(f32, z.rows, z.row_strides);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, products, row_sums);
  const TensorRef delta = g.tensor(softmax_sum_uid, f32, z.rows, z.row_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, row_sums, one, nullptr, delta);

  // The probabilities again, from the scores and the forward's log-sum-exp (the mask after the subtraction).
  TensorRef s = g.virtual_tensor(f32, z.scores, z.scores_strides);
  g.matmul(q, k_t, s, per_batch(g, key, false), per_batch(g, key, true));
  s = g.pointwise(CUDNN_POINTWISE_MUL, s, scale, z.scores, z.scores_strides);
  if (key.padding) s = padding_mask(g, key, s, z);
  s = g.pointwise(CUDNN_POINTWISE_SUB, s, stats, z.scores, z.scores_strides);
  s = band_mask(g, key, s, z);
  const TensorRef probabilities = g.pointwise(CUDNN_POINTWISE_EXP, s, nullptr, z.scores, z.scores_strides);

  // dv = Pᵀ·dout
  const TensorRef probabilities_t = g.virtual_tensor(io, z.transposed, z.transposed_strides);
  g.reshape(probabilities, probabilities_t);
  product_over_groups(g, key, probabilities_t, dout, dv, key.Dv);

  // dS = scale · P ∘ (dout·vᵀ − δ)
  const TensorRef dp = g.virtual_tensor(f32, z.scores, z.scores_strides);
  g.matmul(dout, v_t, dp, per_batch(g, key, false), per_batch(g, key, true));
  const TensorRef centered = g.pointwise(CUDNN_POINTWISE_SUB, dp, delta, z.scores, z.scores_strides);
  const TensorRef weighted = g.pointwise(CUDNN_POINTWISE_MUL, centered, probabilities, z.scores, z.scores_strides);
  const TensorRef ds = g.pointwise(CUDNN_POINTWISE_MUL, weighted, scale, z.scores, z.scores_strides);

  // dk = dSᵀ·q
  const TensorRef ds_t = g.virtual_tensor(io, z.transposed, z.transposed_strides);
  g.reshape(ds, ds_t);
  product_over_groups(g, key, ds_t, q, dk, key.D);

  // dq = dS·k: straight into dq when deterministic, else through an f32 sum in scratch (cuDNN's faster way, whose
  // order of additions varies).
  const TensorRef k = g.virtual_tensor(io, {key.batch, key.kv_heads, key.Sk, key.D}, key.k);
  g.reshape(k_t, k);
  if (key.deterministic) {
    g.matmul(ds, k, dq, per_batch(g, key, false), nullptr, per_batch(g, key, true));
  } else {
    const TensorRef dq_sum =
        g.tensor(dq_sum_uid, f32, q_dims, {key.q_heads * key.Sq * key.D, key.Sq * key.D, key.D, 1});
    g.matmul(ds, k, dq_sum, per_batch(g, key, false), nullptr, per_batch(g, key, true));
    g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_sum, nullptr, nullptr, dq);
  }
  return g;
}

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
      at->second.plan = std::make_unique<cudnn::Plan>(key.backward ? backward_graph(key) : forward_graph(key),
                                                      cudnn::handle(key.device));
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
const cudnn::Plan* plan_for(DType dtype, const Problem& p, bool backward, int device, std::string& refusal) {
  refusal = unexpressible(dtype, p, backward);
  if (!refusal.empty()) return nullptr;
  const Entry& e = entry(key_of(dtype, p, backward, device));
  refusal = e.refusal;
  return e.plan.get();
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

// Runs a plan on the device's current stream. The handle is shared by the threads: its stream is set and used
// under a lock.
void run(const cudnn::Plan& plan, int device, const std::vector<cudnn::Binding>& bindings) {
  const OnDevice on(device);
  const Scratch workspace(static_cast<std::size_t>(plan.workspace_bytes()), device);
  static std::mutex mutex;
  const std::lock_guard lock(mutex);
  const cudnnHandle_t handle = cudnn::handle(device);
  if (const cudnnStatus_t status = cudnn::api()->set_stream(handle, current_stream(device));
      status != CUDNN_STATUS_SUCCESS) {
    throw Error(detail::concat("cudnnSetStream on cuda:", device, ": ", cudnn::describe(status)));
  }
  plan.execute(handle, bindings, workspace.data());
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
        queries_(static_cast<std::int32_t>(p.Sq)),
        keys_(static_cast<std::int32_t>(p.Sk)),
        right_bound_(static_cast<std::int32_t>(p.window_right)),
        // keys j with j + left_bound > the query's row: the diagonal's shift folded in, as the frontend does
        left_bound_(static_cast<float>(p.window_left + 1 - (p.bottom_right ? p.Sk - p.Sq : 0))),
        left_window_(static_cast<std::int32_t>(p.window_left + 1)),
        q_copy_(gathered ? q_bytes(dtype, p) : 0, device),
        lengths_(padded(p) ? 2 * static_cast<std::size_t>(p.batch) * sizeof(std::int32_t) : 0, device) {
    if (gathered) strided_copy(dtype, at(q, p.q, dtype), q_copy_.data(), group_axes(p, true), device);
    if (padded(p)) attention_lengths_int32(p, static_cast<std::int32_t*>(lengths_.data()), device);
    bindings = {{scale_uid, &scale_},
                {minus_inf_uid, &minus_inf_},
                {one_uid, &one_},
                {q_length_uid, &queries_},
                {kv_length_uid, &keys_},
                {right_bound_uid, &right_bound_},
                {left_bound_uid, &left_bound_},
                {left_window_uid, &left_window_},
                {q_lengths_uid, lengths_.data()},
                {kv_lengths_uid, static_cast<std::int32_t*>(lengths_.data()) + p.batch},
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
  std::int32_t queries_, keys_, right_bound_;
  float left_bound_;
  std::int32_t left_window_;
  Scratch q_copy_, lengths_;  // lengths_: with padding, each batch element's queries then keys, as int32
};

}  // namespace

std::string cudnn_attention_refusal(DType dtype, const Problem& p, bool backward, int device) {
  std::string refusal;
  plan_for(dtype, p, backward, device, refusal);
  return refusal;
}

bool cudnn_attention_forward(DType dtype, const Problem& p, const void* q, const void* k, const void* v, void* o,
                             void* log_sums, int device) {
  std::string refusal;
  const cudnn::Plan* plan = plan_for(dtype, p, false, device, refusal);
  if (!plan) return false;
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
  if (!plan) return false;
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

}  // namespace tapegrad::cuda
