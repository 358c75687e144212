// The fp8 copies of an op's weights kept from one forward for the next ones (TransformerEngine's
// is_first_microbatch): with gradient accumulation a step runs several micro-batches through the same weights, and
// only the first forward needs to quantize them.
//
//   Fp8Quantization q = fp8_quantization(fp8::CurrentScaling{});
//   q.weight_cache = std::make_shared<fp8::WeightCache>();
//   for (auto& micro_batch : batches) { ... }  // the first forward quantizes the weights, the others reuse the copies
//   optimizer.step();
//   q.weight_cache->clear();                   // the weights changed in place: the next forward quantizes them again
//
// A copy is reused while the op gets the same tensor in that role (the same storage, offset and shape, and the same
// layout of the copy); another tensor there is quantized and replaces it. A change of a weight's values in place
// (an optimizer's step, load_state_dict) does not show: clear() the cache then. A reused copy keeps the scale it was
// made with, and delayed scaling records no amax for a weight it did not quantize (as TransformerEngine).
#pragma once

#include <any>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "tapegrad/ops/fp8/roles.hpp"
#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad::fp8 {

class WeightCache {
 public:
  // Drops every copy: the next forwards quantize their weights again.
  void clear() { entries_ = {}; }
  // How many copies the cache has made, over its life.
  std::int64_t copies_made() const { return copies_made_; }

  // Internal (the ops' quantization): the copy of weight `w` in `role`, laid out as `layout` says (the shape the op
  // quantized it in), made by make() unless the cache holds one made from w in that layout.
  template <class Copy, class P, class Make>
  Copy copy(Role role, const Tensor<P>& w, const Shape& layout, Make&& make) {
    Entry& entry = entries_[static_cast<std::size_t>(role)];
    const auto* source = std::any_cast<Tensor<P>>(&entry.source);
    const auto* held = std::any_cast<Copy>(&entry.copy);
    if (held && source && source->shares_storage_with(w) && source->data() == w.data() &&
        source->shape() == w.shape() && entry.layout == layout) {
      return *held;
    }
    Copy made = std::forward<Make>(make)();
    entry = {w, layout, made};
    ++copies_made_;
    return made;
  }

 private:
  struct Entry {
    std::any source;  // the weight (which keeps its storage, so that no other tensor takes its address)
    Shape layout;
    std::any copy;
  };
  std::array<Entry, role_count> entries_{};
  std::int64_t copies_made_ = 0;
};

}  // namespace tapegrad::fp8
