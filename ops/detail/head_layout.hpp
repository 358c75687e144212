// How attention-shaped tensors lay out their heads: [..., heads, S, D] (bhsd; rank 2 is one head) or
// [..., S, heads, D] (bshd), the leading axes the batch. Shared by dot_product_attention and rope.
#pragma once

#include <cstdint>
#include <vector>

#include "tapegrad/ops/attention.hpp"
#include "tapegrad/tensor/shape.hpp"

namespace tapegrad::detail {

// A tensor's batch axes, heads, sequence and head size, with the element strides of its batch, head and sequence
// axes (D is contiguous).
struct HeadLayout {
  std::vector<std::int64_t> lead;
  std::int64_t batch = 1, heads = 1, S = 0, D = 0;
  std::int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
};

inline int min_rank(nn::AttentionLayout layout) { return layout == nn::AttentionLayout::bhsd ? 2 : 3; }
inline const char* layout_form(nn::AttentionLayout layout) {
  return layout == nn::AttentionLayout::bhsd ? "[..., heads, S, D]" : "[..., S, heads, D]";
}

// The shape read in `layout` (its rank at least min_rank(layout)).
inline HeadLayout head_layout(const Shape& shape, nn::AttentionLayout layout) {
  HeadLayout x;
  const bool heads_first = layout == nn::AttentionLayout::bhsd;
  const int trailing = heads_first && shape.rank() == 2 ? 2 : 3;
  x.lead = shape.to_vector();
  x.lead.resize(x.lead.size() - static_cast<std::size_t>(trailing));
  for (std::int64_t d : x.lead) x.batch *= d;
  x.D = shape.dim(-1);
  if (heads_first) {
    x.S = shape.dim(-2);
    x.heads = trailing == 3 ? shape.dim(-3) : 1;
    x.head_stride = x.S * x.D;
    x.row_stride = x.D;
  } else {
    x.S = shape.dim(-3);
    x.heads = shape.dim(-2);
    x.head_stride = x.D;
    x.row_stride = x.heads * x.D;
  }
  x.batch_stride = x.heads * x.S * x.D;
  return x;
}

}  // namespace tapegrad::detail
