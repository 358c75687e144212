#include "tapegrad/ops/detail/element_layout.hpp"

#include <cstdint>

#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad {

cuda::ElementLayout element_layout(const Shape& output, const std::vector<Shape>& inputs, const std::string& what) {
  const int n_inputs = static_cast<int>(inputs.size());
  check(n_inputs <= cuda::max_element_inputs, what, "a GPU program takes at most ", cuda::max_element_inputs,
        " inputs, this expression has ", n_inputs, ": evaluate a part of it first with .eval()");
  const int rank = output.rank();
  // Each input's strides in output coordinates: its own contiguous strides, 0 where it is broadcast.
  std::vector<std::vector<std::int64_t>> strides(inputs.size(), std::vector<std::int64_t>(rank, 0));
  cuda::ElementLayout layout;
  for (int k = 0; k < n_inputs; ++k) {
    const Shape& s = inputs[k];
    layout.flat = layout.flat && s == output;
    std::int64_t stride = 1;
    for (int d = s.rank() - 1; d >= 0; --d) {
      const int od = d + rank - s.rank();
      strides[k][od] = s.dim(d) == 1 && output.dim(od) != 1 ? 0 : stride;
      stride *= s.dim(d);
    }
  }
  // Merge axis d into the one before it when every input steps over both as over one longer axis.
  std::vector<std::int64_t> dims;
  std::vector<std::vector<std::int64_t>> merged(inputs.size());
  for (int d = 0; d < rank; ++d) {
    if (output.dim(d) == 1) continue;  // a unit axis moves nothing
    bool joins = !dims.empty();
    for (int k = 0; k < n_inputs && joins; ++k) joins = merged[k].back() == strides[k][d] * output.dim(d);
    if (joins) {
      dims.back() *= output.dim(d);
      for (int k = 0; k < n_inputs; ++k) merged[k].back() = strides[k][d];
    } else {
      dims.push_back(output.dim(d));
      for (int k = 0; k < n_inputs; ++k) merged[k].push_back(strides[k][d]);
    }
  }
  if (dims.empty()) {  // a single element
    dims.push_back(1);
    for (auto& m : merged) m.push_back(0);
  }
  check(static_cast<int>(dims.size()) <= cuda::max_element_rank, what, "the broadcast pattern of shapes ",
        output, " needs ", dims.size(), " axes after merging; a GPU program takes at most ",
        cuda::max_element_rank);
  layout.rank = static_cast<int>(dims.size());
  for (int d = 0; d < layout.rank; ++d) {
    layout.dims[d] = dims[static_cast<std::size_t>(d)];
    for (int k = 0; k < n_inputs; ++k) layout.strides[k][d] = merged[k][static_cast<std::size_t>(d)];
  }
  return layout;
}

}  // namespace tapegrad
