#include "tapegrad/tensor/print.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <ostream>
#include <type_traits>
#include <vector>

namespace tapegrad {

namespace {

constexpr std::string_view prefix = "tensor(";

enum class Notation { whole, fixed, scientific };

// `v` in `notation` with `precision` digits after the point; nan, inf and -inf as such (also for a negative nan).
std::string format_value(double v, Notation notation, int precision) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  const bool whole = notation == Notation::whole;
  const auto format = notation == Notation::scientific ? std::chars_format::scientific : std::chars_format::fixed;
  std::string s(static_cast<std::size_t>(precision) + 330, '\0');  // room for any finite double in fixed notation
  const std::to_chars_result r = std::to_chars(s.data(), s.data() + s.size(), v, format, whole ? 0 : precision);
  s.resize(static_cast<std::size_t>(r.ptr - s.data()));
  return whole ? s + "." : s;  // the point says that the tensor is a floating one
}

// The notation PyTorch's _Formatter picks for floating values, from the nonzero finite ones shown.
Notation float_notation(const std::vector<double>& values) {
  double min = std::numeric_limits<double>::infinity(), max = 0;
  bool whole = true;
  for (double v : values) {
    if (v == 0 || !std::isfinite(v)) continue;
    min = std::min(min, std::abs(v));
    max = std::max(max, std::abs(v));
    whole = whole && v == std::ceil(v);
  }
  if (max == 0) return Notation::whole;
  const bool scientific = max / min > 1000.0 || max > 1.0e8 || (!whole && min < 1.0e-4);
  return scientific ? Notation::scientific : whole ? Notation::whole : Notation::fixed;
}

template <class T> class Printer {
 public:
  Printer(const Tensor<T>& t, const PrintOptions& options)
      : options_(options), summarize_(t.numel() > options.threshold), shape_(t.shape()) {
    const Tensor<T> host = t.to(Device::cpu());
    std::vector<std::int64_t> shown;
    collect(0, 0, shape_.strides(), shown);
    cells_.reserve(shown.size());
    if constexpr (std::is_integral_v<T>) {
      for (std::int64_t i : shown) cells_.push_back(std::to_string(host.data()[i]));
      for (const std::string& cell : cells_) width_ = std::max(width_, cell.size());
    } else {
      std::vector<double> values;
      values.reserve(shown.size());
      for (std::int64_t i : shown) values.push_back(convert<double>(host.data()[i]));
      const Notation notation = float_notation(values);
      for (double v : values) {
        cells_.push_back(format_value(v, notation, options.precision));
        // As in PyTorch, zeros and non-finite values do not widen the columns (and may stick out of them).
        if (v != 0 && std::isfinite(v)) width_ = std::max(width_, cells_.back().size());
      }
    }
    for (std::string& cell : cells_) cell.insert(0, width_ - std::min(width_, cell.size()), ' ');
  }

  // Whether summarising hides entries, so that the values do not show the shape.
  bool cuts() const {
    const auto dims = shape_.dims();
    return std::any_of(dims.begin(), dims.end(), [&](std::int64_t n) { return cut(n); });
  }

  // The values in brackets, continuation lines indented by `indent` + 1 columns.
  std::string str(int indent) const {
    if (shape_.rank() == 0) return cells_[0];
    std::string out;
    std::size_t next = 0;
    append(0, indent, next, out);
    return out;
  }

 private:
  bool cut(std::int64_t n) const { return summarize_ && n > 2 * options_.edgeitems; }

  // The positions shown along an axis of size n, with -1 for the `...` that stands for the middle of a cut axis.
  std::vector<std::int64_t> positions(std::int64_t n) const {
    const std::int64_t head = cut(n) ? options_.edgeitems : n;
    std::vector<std::int64_t> p;
    for (std::int64_t i = 0; i < head; ++i) p.push_back(i);
    if (head == n) return p;
    p.push_back(-1);
    for (std::int64_t i = n - options_.edgeitems; i < n; ++i) p.push_back(i);
    return p;
  }

  // The flat indices of the shown elements, in the order they print.
  void collect(int axis, std::int64_t offset, const std::array<std::int64_t, Shape::max_rank>& strides,
               std::vector<std::int64_t>& shown) const {
    if (axis == shape_.rank()) {
      shown.push_back(offset);
      return;
    }
    for (std::int64_t i : positions(shape_[axis])) {
      if (i >= 0) collect(axis + 1, offset + i * strides[static_cast<std::size_t>(axis)], strides, shown);
    }
  }

  // PyTorch's _tensor_str_with_formatter and _vector_str: the sub-tensors of `axis` on, taking the cells from `next`.
  void append(int axis, int indent, std::size_t& next, std::string& out) const {
    const std::vector<std::int64_t> shown = positions(shape_[axis]);
    out += '[';
    if (axis + 1 == shape_.rank()) {
      const std::size_t per_line =
          static_cast<std::size_t>(std::max<std::int64_t>(1, (options_.linewidth - indent) /
                                                                 static_cast<std::int64_t>(width_ + 2)));
      for (std::size_t k = 0; k < shown.size(); ++k) {
        if (k > 0) out += k % per_line == 0 ? ",\n" + std::string(static_cast<std::size_t>(indent) + 1, ' ') : ", ";
        out += shown[k] < 0 ? " ..." : cells_[next++];
      }
    } else {
      const std::string separator = "," + std::string(static_cast<std::size_t>(shape_.rank() - axis - 1), '\n') +
                                    std::string(static_cast<std::size_t>(indent) + 1, ' ');
      for (std::size_t k = 0; k < shown.size(); ++k) {
        if (k > 0) out += separator;
        if (shown[k] < 0) {
          out += "...";
        } else {
          append(axis + 1, indent + 1, next, out);
        }
      }
    }
    out += ']';
  }

  PrintOptions options_;
  bool summarize_;
  Shape shape_;
  std::vector<std::string> cells_;  // the shown values, right-aligned to width_
  std::size_t width_ = 1;
};

// PyTorch's _add_suffixes: ", suffix" on the last line, or on a new line indented under the values when the line
// would pass `linewidth` (measured as PyTorch does, the last line's length plus 2).
std::string with_suffixes(std::string text, const std::vector<std::string>& suffixes, int linewidth) {
  const std::size_t newline = text.rfind('\n');
  std::size_t line = (newline == std::string::npos ? text.size() : text.size() - newline - 1) + 2;
  for (const std::string& suffix : suffixes) {
    if (static_cast<std::int64_t>(line + suffix.size() + 2) > linewidth) {
      text += ",\n" + std::string(prefix.size(), ' ') + suffix;
      line = prefix.size() + suffix.size();
    } else {
      text += ", " + suffix;
      line += suffix.size() + 2;
    }
  }
  return text + ")";
}

}  // namespace

namespace detail {
template <class T>
std::string tensor_to_string(const Tensor<T>& t, const PrintOptions& options, std::string_view last_suffix) {
  check(options.precision >= 0, "to_string", "precision is ", options.precision, "; it must be 0 or more");
  check(options.edgeitems >= 0, "to_string", "edgeitems is ", options.edgeitems, "; it must be 0 or more");
  if (!t.defined()) return "tensor(undefined)";
  std::vector<std::string> suffixes;
  if (!t.device().is_cpu()) suffixes.push_back("device=" + t.device().str());
  std::string text(prefix);
  if (t.numel() == 0) {
    text += "[]";
    if (t.rank() != 1) suffixes.push_back("size=" + t.shape().str());
  } else {
    const Printer<T> printer(t, options);
    text += printer.str(static_cast<int>(prefix.size()));
    if (printer.cuts()) suffixes.push_back("size=" + t.shape().str());
  }
  suffixes.push_back("dtype=" + std::string(dtype_name(t.dtype())));
  if (!last_suffix.empty()) suffixes.emplace_back(last_suffix);
  return with_suffixes(std::move(text), suffixes, options.linewidth);
}
}  // namespace detail

template <class T> std::string to_string(const Tensor<T>& t, const PrintOptions& options) {
  return detail::tensor_to_string(t, options, {});
}

template <class T> std::ostream& operator<<(std::ostream& out, const Tensor<T>& t) { return out << to_string(t); }

// Every dtype a tensor can hold.
#define TAPEGRAD_INSTANTIATE_PRINT(T)                                                                         \
  template std::string detail::tensor_to_string<T>(const Tensor<T>&, const PrintOptions&, std::string_view); \
  template std::string to_string<T>(const Tensor<T>&, const PrintOptions&);                                 \
  template std::ostream& operator<< <T>(std::ostream&, const Tensor<T>&);
TAPEGRAD_FOR_EACH_FLOAT(TAPEGRAD_INSTANTIATE_PRINT)
TAPEGRAD_INSTANTIATE_PRINT(f8e4m3)
TAPEGRAD_INSTANTIATE_PRINT(f8e5m2)
TAPEGRAD_INSTANTIATE_PRINT(std::int32_t)
TAPEGRAD_INSTANTIATE_PRINT(std::int64_t)

}  // namespace tapegrad
