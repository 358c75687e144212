// dot_product_attention's geometry (ops/detail/attention_geometry.hpp): layouts as row strides, the checks.
#include "tapegrad/ops/detail/attention_geometry.hpp"

#include <cmath>
#include <string>

#include "tapegrad/ops/detail/head_layout.hpp"
#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad::nn::detail {

namespace {

std::vector<std::int64_t> joined(std::vector<std::int64_t> dims, std::initializer_list<std::int64_t> tail) {
  dims.insert(dims.end(), tail);
  return dims;
}

// The row strides of a tensor read in its layout.
attention::RowStrides row_strides(const tapegrad::detail::HeadLayout& x) {
  return {0, x.batch_stride, x.head_stride, x.row_stride};
}

void check_heads(std::int64_t q_heads, std::int64_t kv_heads, const std::string& what) {
  check(q_heads > 0 && kv_heads > 0 && q_heads % kv_heads == 0, op_name, "the kv heads (", kv_heads,
        ") must divide the q heads (", q_heads, ")", what);
}

// Whether a query within its batch's length sees no key under p's masks (p's lengths on the host).
bool some_query_sees_no_key(const attention::Problem& p) {
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t queries = p.q_lengths ? p.q_lengths[b] : p.Sq;
    for (std::int64_t i = 0; i < queries; ++i) {
      std::int64_t begin, end;
      p.key_range(b, i, begin, end);
      if (end <= begin) return true;
    }
  }
  return false;
}

}  // namespace

Geometry separate_geometry(const Shape& qs, const Shape& ks, const Shape& vs, AttentionLayout layout) {
  const char* form = tapegrad::detail::layout_form(layout);
  check(qs.rank() >= tapegrad::detail::min_rank(layout) && ks.rank() == qs.rank() && vs.rank() == qs.rank(), op_name,
        "q ", qs, ", k ", ks, " and v ", vs, " should all be ", form);
  using tapegrad::detail::head_layout;
  const auto q = head_layout(qs, layout), k = head_layout(ks, layout), v = head_layout(vs, layout);
  check(q.lead == k.lead && q.lead == v.lead && k.heads == v.heads && k.S == v.S && q.D == k.D && q.D > 0 && v.D > 0,
        op_name, "q ", qs, ", k ", ks, " and v ", vs, " should be ", form,
        " with one batch, k and v the same heads and length, q and k the same D > 0");
  check_heads(q.heads, k.heads, tapegrad::detail::concat(": q ", qs, ", k ", ks));
  const bool heads_first = layout == AttentionLayout::bhsd;
  const std::vector<std::int64_t> out =
      heads_first ? joined(q.lead, {q.heads, q.S, v.D}) : joined(q.lead, {q.S, q.heads, v.D});
  return {.problem = {.batch = q.batch, .q_heads = q.heads, .kv_heads = k.heads, .Sq = q.S, .Sk = k.S, .D = q.D,
                      .Dv = v.D, .q = row_strides(q), .k = row_strides(k), .v = row_strides(v),
                      .o = row_strides(head_layout(
                          heads_first ? Shape{1, q.heads, q.S, v.D} : Shape{1, q.S, q.heads, v.D}, layout))},
          .layout = layout,
          .out_shape = Shape(qs.rank() >= 3 ? out : std::vector<std::int64_t>{q.S, v.D})};
}

Geometry packed_geometry(const Shape& shape, std::int64_t q_heads, std::int64_t kv_heads, QkvPacking packing) {
  check(shape.rank() >= 2, op_name, "qkv ", shape, " should be [..., S, (q_heads + 2·kv_heads)·D]");
  check_heads(q_heads, kv_heads, tapegrad::detail::concat(" of qkv ", shape));
  const std::int64_t S = shape.dim(-2), width = shape.dim(-1), columns = q_heads + 2 * kv_heads;
  check(width > 0 && width % columns == 0, op_name, "qkv ", shape, " should be [..., S, (q_heads + 2·kv_heads)·D] ",
        "with ", q_heads, " q heads and ", kv_heads, " kv heads: ", width, " is not a positive multiple of ", columns);
  const std::int64_t D = width / columns;
  std::vector<std::int64_t> lead = shape.to_vector();
  lead.resize(lead.size() - 2);
  std::int64_t batch = 1;
  for (std::int64_t d : lead) batch *= d;
  // Blocks: all q heads, all k heads, all v heads. Groups: kv group by kv group, its G q heads, its k, its v.
  const std::int64_t G = q_heads / kv_heads, group_width = (G + 2) * D;
  const bool blocks = packing == QkvPacking::blocks;
  const attention::RowStrides q = blocks ? attention::RowStrides{0, S * width, D, width}
                                         : attention::RowStrides{0, S * width, D, width, G, 2 * D};
  const attention::RowStrides k = blocks ? attention::RowStrides{q_heads * D, S * width, D, width}
                                         : attention::RowStrides{G * D, S * width, group_width, width};
  const attention::RowStrides v = blocks ? attention::RowStrides{(q_heads + kv_heads) * D, S * width, D, width}
                                         : attention::RowStrides{(G + 1) * D, S * width, group_width, width};
  return {.problem = {.batch = batch, .q_heads = q_heads, .kv_heads = kv_heads, .Sq = S, .Sk = S, .D = D, .Dv = D,
                      .q = q, .k = k, .v = v, .o = {0, S * q_heads * D, D, q_heads * D}},
          .packed = true,
          .packing = packing,
          .out_shape = Shape(joined(lead, {S, q_heads * D}))};
}

// p with its length pointers at these host vectors (null where one is empty).
attention::Problem with_host_lengths(attention::Problem p, const std::vector<std::int64_t>& q_lengths,
                                     const std::vector<std::int64_t>& kv_lengths) {
  p.q_lengths = q_lengths.empty() ? nullptr : q_lengths.data();
  p.kv_lengths = kv_lengths.empty() ? nullptr : kv_lengths.data();
  return p;
}

void apply_options(Geometry& g, const AttentionOptions& o) {
  attention::Problem& p = g.problem;
  const double scale = o.scale.value_or(1.0 / std::sqrt(static_cast<double>(p.D)));
  check(std::isfinite(scale), op_name, "the scale must be finite, got ", scale);
  check(o.dropout >= 0 && o.dropout < 1, op_name, "dropout must be in [0, 1), got ", o.dropout);
  check(o.window_left >= -1 && o.window_right >= -1, op_name, "a window side must be >= 0 or -1 (open), got ",
        o.window_left, " and ", o.window_right);
  const auto check_lengths = [&](const std::vector<std::int64_t>& lengths, const char* name, std::int64_t S) {
    if (lengths.empty()) return;
    check(static_cast<std::int64_t>(lengths.size()) == p.batch, op_name, name, " has ", lengths.size(),
          " entries but the batch has ", p.batch);
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      check(lengths[b] >= 0 && lengths[b] <= S, op_name, name, "[", b, "] = ", lengths[b], " is outside [0, ", S, "]");
    }
  };
  check_lengths(o.q_lengths, "q_lengths", p.Sq);
  check_lengths(o.kv_lengths, "kv_lengths", p.Sk);
  p.scale = scale;
  p.causal = o.causal;
  p.bottom_right = o.bottom_right;
  p.window_left = o.window_left;
  p.window_right = o.window_right;
  p.dropout = o.dropout;
  p.dropout_seed = o.dropout_seed;
  p.deterministic = o.deterministic;
  p.queries_without_keys = some_query_sees_no_key(with_host_lengths(p, o.q_lengths, o.kv_lengths));
}

void apply_bias(Geometry& g, const Shape& bias) {
  attention::Problem& p = g.problem;
  const bool square = bias.rank() == 2, full = bias.rank() == 4;
  const std::int64_t Bb = full ? bias.dim(0) : 1, Hb = full ? bias.dim(1) : 1;
  check((square || full) && bias.dim(-2) == p.Sq && bias.dim(-1) == p.Sk && (Bb == 1 || Bb == p.batch) &&
            (Hb == 1 || Hb == p.q_heads),
        op_name, "bias ", bias, " should be [", p.Sq, ", ", p.Sk, "] or [", p.batch, " or 1, ", p.q_heads, " or 1, ",
        p.Sq, ", ", p.Sk, "]");
  p.has_bias = true;
  p.bias_batch = Bb == 1 ? 0 : Hb * p.Sq * p.Sk;
  p.bias_head = Hb == 1 ? 0 : p.Sq * p.Sk;
}


}  // namespace tapegrad::nn::detail
