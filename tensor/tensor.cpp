#include "tapegrad/tensor/tensor.hpp"

#include "tapegrad/tensor/core/detail/op_scope.hpp"

namespace tapegrad::detail {

std::size_t tensor_bytes(const Shape& shape, DType dtype) {
  const auto size = static_cast<std::int64_t>(dtype_size(dtype));
  std::int64_t bytes = 0;
  if (__builtin_mul_overflow(shape.numel(), size, &bytes)) {
    throw Error(concat(current_op("Tensor"), ": a tensor of shape ", shape, " and dtype ", dtype_name(dtype),
                       " would take ", shape.numel(), " × ", size,
                       " bytes, more than the 2^63 - 1 bytes that memory can address"));
  }
  return static_cast<std::size_t>(bytes);
}

void throw_flat_index(std::int64_t index, const Shape& shape) {
  throw Error(concat("flat: index ", index, " is out of range for a tensor of shape ", shape, " (", shape.numel(),
                     " elements)"));
}

void throw_undefined_tensor(std::string_view op, std::string_view what) {
  throw Error(concat(op, ": ", what, " is undefined (a default-constructed Tensor, with no storage)"));
}

}  // namespace tapegrad::detail
