// Printing tensors in PyTorch's layout (torch/_tensor_str.py): `std::cout << t`, or `to_string(t, {.precision = 2})`.
//
//   tensor([[ 0.1234, -1.5000],
//           [ 2.0000,  3.0000]], dtype=bf16)
//
// Nested brackets per axis, one column width for the whole tensor, rows wrapped at `linewidth` columns. A tensor of
// more than `threshold` elements is summarised: each axis longer than 2·edgeitems shows its first and last
// `edgeitems` entries with `...` between. Floating values (the 16-bit and fp8 ones read as double) print in one
// notation for the whole tensor, chosen as PyTorch does from the shown values that are finite and not zero:
// - whole ("2.", "-3.") when all of them are whole numbers;
// - scientific ("1.2346e+09") when the largest magnitude exceeds 1e8 or 1000 times the smallest, or (values not all
//   whole) the smallest is below 1e-4;
// - fixed ("0.1235") otherwise.
// nan, inf and -inf print as such; integer tensors print their values exactly.
// The values are followed by `device=cuda:N` off the cpu (a device tensor is copied to the cpu to be printed),
// `size=[...]` when the values do not show the shape (empty other than rank 1, or summarised), and always
// `dtype=...` with tapegrad's names (f32, bf16, i64, f8e4m3, ...). Rank 0 prints as `tensor(1.5000, dtype=f32)`, an
// undefined tensor as `tensor(undefined)`.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>

#include "tapegrad/tensor/tensor.hpp"

namespace tapegrad {

// PyTorch's defaults. to_string throws naming the option when precision or edgeitems is negative.
struct PrintOptions {
  int precision = 4;              // digits after the decimal point
  std::int64_t threshold = 1000;  // summarise tensors of more elements than this
  std::int64_t edgeitems = 3;     // entries shown at each end of a summarised axis
  int linewidth = 80;             // columns a row of values may take before it wraps
};

template <class T> std::string to_string(const Tensor<T>& t, const PrintOptions& options = {});
template <class T> std::ostream& operator<<(std::ostream& out, const Tensor<T>& t);

namespace detail {
// to_string with `last_suffix` (such as "requires_grad=true") after the dtype, where not empty.
template <class T>
std::string tensor_to_string(const Tensor<T>& t, const PrintOptions& options, std::string_view last_suffix);
}  // namespace detail

}  // namespace tapegrad
