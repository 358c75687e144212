// What a dot_product_attention call computes (ops/attention.cpp): the problem the kernels solve
// (cuda/attention_problem.hpp) from the operands' shapes, the layout and the options, with the checks that name what
// does not fit.
#pragma once

#include <cstdint>
#include <vector>

#include "tapegrad/cuda/attention_problem.hpp"
#include "tapegrad/ops/attention.hpp"
#include "tapegrad/tensor/shape.hpp"

namespace tapegrad::nn::detail {

inline constexpr const char* op_name = "dot_product_attention";

// The problem's sizes and strides (its length pointers unset), where the inputs are, and the output's shape.
struct Geometry {
  attention::Problem problem;
  bool packed = false;  // one qkv input
  QkvPacking packing = QkvPacking::blocks;
  AttentionLayout layout = AttentionLayout::bhsd;
  Shape out_shape;
};

// q, k and v apart, in `layout`; or one projection qkv packed as `packing` says.
Geometry separate_geometry(const Shape& q, const Shape& k, const Shape& v, AttentionLayout layout);
Geometry packed_geometry(const Shape& qkv, std::int64_t q_heads, std::int64_t kv_heads, QkvPacking packing);
// The options' parts (checked), and the bias's shape's.
void apply_options(Geometry& g, const AttentionOptions& options);
void apply_bias(Geometry& g, const Shape& bias);

// p with its length pointers at these host vectors (null where one is empty).
attention::Problem with_host_lengths(attention::Problem p, const std::vector<std::int64_t>& q_lengths,
                                     const std::vector<std::int64_t>& kv_lengths);

}  // namespace tapegrad::nn::detail
