// The layout ops, expand_to and dtype casts on a GPU: permute/transpose, reshape, slice and concat forward and
// backward against the CPU in double; expand_to, the strided copy (integer elements too) and the row copy against
// the CPU's bits; casts between the floating dtypes bitwise equal to the CPU's, special values and rounding ties
// included.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <type_traits>
#include <vector>

#include "tapegrad/cuda/row_copy.hpp"
#include "tapegrad/cuda/strided_copy.hpp"
#include "gpu_reference.hpp"
#include "tapegrad/ops/detail/broadcast.hpp"
#include "support.hpp"
#include "tapegrad/tapegrad.hpp"

using namespace tapegrad;
using test::bitwise_equal;
using test::check_against_cpu;
using test::gpu;
using test::GpuInput;

namespace {

const Device host = Device::cpu();

// Layout ops move values without arithmetic: on the same rounded inputs the GPU in T and the CPU in double agree
// exactly, forward and backward.
constexpr test::Tolerance exact{0.0, 0.0};

// Calls f.template operator()<T>() for each floating dtype.
template <class F> void for_each_dtype(F&& f) {
  f.template operator()<float>();
  f.template operator()<double>();
  f.template operator()<bf16>();
  f.template operator()<f16>();
}

}  // namespace

// ---- permute, transpose, reshape ---------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("permute on the GPU matches the CPU for ranks 1 to 6, forward and backward",
                   T, TAPEGRAD_GPU_DTYPES) {
  const std::vector<std::pair<Shape, std::vector<int>>> cases = {
      {{7}, {0}},                                     // rank 1: no element moves
      {{5, 7, 3}, {0, 1, 2}},                         // identity
      {{33, 70}, {1, 0}},                             // a 2-D transpose in ragged 32×32 tiles
      {{5, 7, 3}, {2, 0, 1}},                         // small: one thread per element
      {{65, 129, 33}, {2, 0, 1}},                     // a batch of tiled transposes
      {{3, 33, 8}, {1, 0, 2}},                        // the innermost axis stays: rows in 16-byte units
      {{4, 1, 5, 3}, {2, 1, 3, 0}},                   // size-1 axes drop out
      {{2, 3, 2, 5, 3}, {4, 2, 0, 3, 1}},             // rank 5
      {{2, 3, 1, 5, 4, 3}, {5, 3, 0, 4, 2, 1}},       // rank 6
      {{3, 0, 5}, {2, 1, 0}},                         // empty
  };
  std::uint64_t seed = 1;
  for (const auto& [shape, dims] : cases) {
    CAPTURE(shape);
    check_against_cpu<T>(
        "permute", [&dims](const auto& v) { return permute(v[0], dims); }, {GpuInput(shape)}, exact, ++seed);
  }
}

TEST_CASE_TEMPLATE("transpose on the GPU matches the CPU, default and named axes", T, TAPEGRAD_GPU_DTYPES) {
  check_against_cpu<T>("transpose()", [](const auto& v) { return transpose(v[0]); }, {GpuInput({2, 64, 41})}, exact,
                       3);
  check_against_cpu<T>("transpose(0, 2)", [](const auto& v) { return transpose(v[0], 0, 2); },
                       {GpuInput({7, 5, 3})}, exact, 4);
  check_against_cpu<T>("transpose(-1, -3)", [](const auto& v) { return transpose(v[0], -1, -3); },
                       {GpuInput({17, 9, 40})}, exact, 5);
}

TEST_CASE("a tensor-level permute that moves no data is a view on the GPU too") {
  const Tensor<float> x = randn<float>({4, 1, 5}, 2).to(gpu);
  const Tensor<float> y = permute(x, {1, 0, 2});
  CHECK(y.shares_storage_with(x));
  CHECK(y.shape() == Shape{1, 4, 5});
}

TEST_CASE_TEMPLATE("the tensor-level permute on the GPU gives the CPU's bits", T, TAPEGRAD_GPU_DTYPES) {
  const Tensor<T> x = randn<T>({6, 35, 3, 19}, 9);
  const std::vector<std::vector<int>> permutations = {{3, 2, 1, 0}, {0, 3, 1, 2}, {1, 0, 3, 2}};
  for (const std::vector<int>& dims : permutations) {
    CHECK(bitwise_equal(permute(x.to(gpu), dims).to(host), permute(x, dims)));
  }
}

TEST_CASE_TEMPLATE("reshape on the GPU is a view, with the gradient in the input's shape", T, TAPEGRAD_GPU_DTYPES) {
  check_against_cpu<T>("reshape", [](const auto& v) { return reshape(v[0], {-1, 7}); }, {GpuInput({3, 5, 7})}, exact,
                       6);
  const Tensor<T> x = randn<T>({3, 5, 7}, 7).to(gpu);
  const Var<T> y = reshape(constant(x), {15, 7});
  CHECK(y.device() == gpu);
  CHECK(y.value().shares_storage_with(x));
}

// ---- slice and concat --------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("slice on the GPU matches the CPU: steps, negative bounds, clamping, empty results",
                   T, TAPEGRAD_GPU_DTYPES) {
  struct Slice {
    int axis;
    std::int64_t start, stop, step;
  };
  const std::vector<Slice> slices = {
      {0, 1, 6, 2},       // outer axis, a step
      {1, -30, -2, 3},    // negative bounds
      {-1, 0, 8, 1},      // the whole axis: one contiguous run
      {2, 1, 100, 1},     // stop clamped
      {0, -100, 100, 4},  // both clamped
      {1, 5, 2, 1},       // empty: stop before start
      {1, 32, 33, 1},     // the last row
  };
  std::uint64_t seed = 10;
  for (const Slice& s : slices) {
    CAPTURE(s.axis);
    CAPTURE(s.start);
    CAPTURE(s.stop);
    CAPTURE(s.step);
    check_against_cpu<T>(
        "slice", [&s](const auto& v) { return slice(v[0], s.axis, s.start, s.stop, s.step); },
        {GpuInput({7, 33, 8})}, exact, ++seed);
  }
}

TEST_CASE_TEMPLATE("concat on the GPU matches the CPU along every axis, with an empty input among several",
                   T, TAPEGRAD_GPU_DTYPES) {
  const auto joined = [](int axis) {
    return [axis](const auto& v) { return concat(v, axis); };
  };
  check_against_cpu<T>("concat axis 1", joined(1), {GpuInput({3, 4, 5}), GpuInput({3, 0, 5}), GpuInput({3, 7, 5})},
                       exact, 20);
  check_against_cpu<T>("concat axis 0",
                       joined(0), {GpuInput({2, 33}), GpuInput({0, 33}), GpuInput({5, 33}), GpuInput({1, 33})}, exact,
                       21);
  check_against_cpu<T>("concat axis -1", joined(-1), {GpuInput({4, 3}), GpuInput({4, 8}), GpuInput({4, 0})}, exact, 22);
  check_against_cpu<T>("concat of one input", joined(0), {GpuInput({6, 7})}, exact, 23);
}

TEST_CASE("concat of tensors on different devices throws naming both devices") {
  const Var<float> on_gpu = constant(randn<float>({2, 3}, 1).to(gpu));
  const Var<float> on_host = constant(randn<float>({2, 3}, 2));
  CHECK_THROWS_WITH_AS(concat(std::vector<Var<float>>{on_gpu, on_host}, 0),
                       doctest::Contains("concat: input 0 is on cuda:0 but input 1 is on cpu"), Error);
}

TEST_CASE("layout errors on the GPU are the CPU's") {
  const Var<float> x = constant(randn<float>({2, 3, 4}, 3).to(gpu));
  CHECK_THROWS_WITH_AS(permute(x, {0, 1}), doctest::Contains("permute: dims [0, 1] have 2 entries but shape [2, 3, 4]"),
                       Error);
  CHECK_THROWS_WITH_AS(slice(x, 1, 0, 2, 0), doctest::Contains("slice: step must be at least 1, got 0"), Error);
  CHECK_THROWS_WITH_AS(reshape(x, {5, -1}), doctest::Contains("reshape: cannot reshape [2, 3, 4]"), Error);
  CHECK_THROWS_WITH_AS(concat(std::vector<Var<float>>{x, constant(randn<float>({2, 5, 5}, 4).to(gpu))}, 1),
                       doctest::Contains("input 1 has [2, 5, 5]"), Error);
}

// ---- expand_to and the strided copy --------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("expand_to on the GPU gives the CPU's bits", T, TAPEGRAD_GPU_DTYPES) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3, 1, 5}, {2, 3, 7, 5}},  // leading and middle axes
      {{1}, {4, 6}},
      {{}, {3}},                  // a scalar
      {{33}, {1000, 33}},         // rows, moved in wide units where they fit
      {{7, 1}, {7, 9}},           // the innermost axis broadcasts
      {{5}, {0, 5}},              // empty
      {{2, 3}, {2, 3}},           // nothing to expand
  };
  std::uint64_t seed = 30;
  for (const auto& [from, to] : cases) {
    CAPTURE(from);
    CAPTURE(to);
    const Tensor<T> x = randn<T>(from, ++seed);
    const Tensor<T> expanded = expand_to(x.to(gpu), to);
    CHECK(expanded.device() == gpu);
    CHECK(bitwise_equal(expanded.to(host), expand_to(x, to)));
  }
  CHECK_THROWS_WITH_AS(expand_to(randn<T>({3}, 1).to(gpu), Shape{4, 2}), doctest::Contains("expand_to"), Error);
}

TEST_CASE_TEMPLATE("the strided copy moves integer elements like any others", I, std::int32_t, std::int64_t) {
  using cuda::CopyAxis;
  const Tensor<I> x = rand_int<I>({33, 70}, 5, -100000, 100000);
  const Tensor<I> on_gpu = x.to(gpu);
  // Each case: the destination's size and the index space, in the destination's row-major order.
  const std::vector<std::pair<std::int64_t, std::vector<CopyAxis>>> cases = {
      {70 * 33, {{70, 1, 33}, {33, 70, 1}}},           // a transpose, tiled
      {5 * 70, {{5, 0, 70}, {70, 1, 1}}},              // the first row broadcast 5 times
      {11 * 7, {{11, 3 * 70, 7}, {7, 10, 1}}},         // every 3rd row, every 10th column
      {33 * 70, {{33, 70, 70}, {70, 1, 1}}},           // contiguous: one run
      {1, {}},                                         // a single element
      {3 * 4 * 2, {{3, 70, 8}, {4, 2, 2}, {2, 1, 1}}},  // short strided runs
  };
  for (const auto& [size, axes] : cases) {
    CAPTURE(axes.size());
    Tensor<I> out({size}, gpu);
    cuda::strided_copy(dtype_v<I>, on_gpu.data(), out.data(), axes, gpu.index);
    Tensor<I> want({size});
    std::vector<std::int64_t> idx(axes.size(), 0);
    for (std::int64_t n = 0; n < size; ++n) {
      std::int64_t src = 0, dst = 0;
      for (std::int64_t rest = n, a = static_cast<std::int64_t>(axes.size()) - 1; a >= 0; --a) {
        const CopyAxis& axis = axes[static_cast<std::size_t>(a)];
        src += rest % axis.dim * axis.src_stride;
        dst += rest % axis.dim * axis.dst_stride;
        rest /= axis.dim;
      }
      want.flat(dst) = x.flat(src);
    }
    CHECK(bitwise_equal(out.to(host), want));
  }
}

namespace {

struct RowCopyCase {
  std::int64_t rows, cols, dst_rows, dst_cols;
};

// x [rows, cols] copied as copy_rows does: x's element where the destination has it, zero bits elsewhere.
template <class T> Tensor<T> copied_rows(const Tensor<T>& x, const RowCopyCase& c) {
  Tensor<T> want({c.dst_rows, c.dst_cols});
  for (std::int64_t r = 0; r < c.dst_rows; ++r) {
    for (std::int64_t j = 0; j < c.dst_cols; ++j) {
      want.flat(r * c.dst_cols + j) = r < c.rows && j < c.cols ? x.flat(r * c.cols + j) : convert<T>(0.0);
    }
  }
  return want;
}

}  // namespace

TEST_CASE_TEMPLATE("copy_rows pads with zero bits and crops, rows and columns, in one pass", T, TAPEGRAD_GPU_DTYPES) {
  // Whole 16-byte packs per destination row or not, growing and shrinking on either axis, rows longer than a
  // block's 2048 elements, one row, empty sides.
  const RowCopyCase cases[] = {{33, 70, 40, 72},   {33, 69, 33, 75},   {40, 72, 33, 70}, {33, 70, 35, 64},
                               {3, 5000, 2, 4999}, {2, 4000, 3, 4104}, {1, 1021, 1, 1024}, {0, 0, 3, 8},
                               {5, 7, 0, 7}};
  for (const RowCopyCase& c : cases) {
    CAPTURE(c.rows);
    CAPTURE(c.cols);
    CAPTURE(c.dst_rows);
    CAPTURE(c.dst_cols);
    const Tensor<T> x = randn<T>({c.rows, c.cols}, 11);
    Tensor<T> out = randn<T>({c.dst_rows, c.dst_cols}, 12, 0, 1, gpu);  // every element must be written
    const Tensor<T> x_gpu = x.to(gpu);
    const cuda::RowCopy copy{x_gpu.data(), c.rows, c.cols, out.data(), c.dst_rows, c.dst_cols};
    cuda::copy_rows(dtype_v<T>, std::span(&copy, 1), gpu.index);
    CHECK(bitwise_equal(out.to(host), copied_rows(x, c)));
  }
}

TEST_CASE_TEMPLATE("copy_rows does several copies of very different sizes in one launch", T, TAPEGRAD_GPU_DTYPES) {
  // A large padding beside small ones (their share of the blocks is one), a crop, packed and element-wise
  // destinations, an empty copy among them: layernorm_mlp's x, W1, W2, b1, b2 of an odd hidden size.
  const std::vector<RowCopyCase> cases = {
      {300, 1021, 304, 1024}, {1021, 4093, 1024, 4096}, {1, 5, 1, 8}, {0, 0, 0, 0}, {17, 3, 17, 3}, {9, 33, 7, 30}};
  std::vector<Tensor<T>> inputs, outputs;
  std::vector<cuda::RowCopy> copies;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const RowCopyCase& c = cases[i];
    inputs.push_back(randn<T>({c.rows, c.cols}, 20 + i).to(gpu));
    outputs.push_back(randn<T>({c.dst_rows, c.dst_cols}, 40 + i, 0, 1, gpu));
    copies.push_back({inputs[i].data(), c.rows, c.cols, outputs[i].data(), c.dst_rows, c.dst_cols});
  }
  cuda::copy_rows(dtype_v<T>, copies, gpu.index);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(i);
    CHECK(bitwise_equal(outputs[i].to(host), copied_rows(inputs[i].to(host), cases[i])));
  }
  copies.resize(cuda::max_row_copies + 1, copies.front());
  CHECK_THROWS_WITH_AS(cuda::copy_rows(dtype_v<T>, copies, gpu.index), "copy_rows: 9 copies in one launch (at most 8)",
                       Error);
}

// ---- casts -------------------------------------------------------------------------------------------------------

namespace {

template <class T>
using Bits = std::conditional_t<sizeof(T) == 2, std::uint16_t,
                                std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>;

// The fields of T's encoding.
template <class T> struct Encoding {
  static constexpr int mantissa_bits = std::numeric_limits<T>::digits - 1;
  static constexpr Bits<T> mantissa = static_cast<Bits<T>>((Bits<T>{1} << mantissa_bits) - 1);
  static constexpr Bits<T> sign = static_cast<Bits<T>>(Bits<T>{1} << (8 * sizeof(T) - 1));
  static constexpr Bits<T> exponent = static_cast<Bits<T>>(~(sign | mantissa));
  static constexpr Bits<T> quiet = static_cast<Bits<T>>(Bits<T>{1} << (mantissa_bits - 1));
};

template <class T> T from_bits(Bits<T> bits) { return std::bit_cast<T>(bits); }
template <class T> Bits<T> bits_of(T value) { return std::bit_cast<Bits<T>>(value); }

// Random bits of T with NaNs replaced by the quiet NaN of their sign (the NaNs every CPU converts alike).
template <class T> T random_value(std::mt19937_64& rng) {
  using E = Encoding<T>;
  const auto bits = static_cast<Bits<T>>(rng());
  const bool nan = (bits & E::exponent) == E::exponent && (bits & E::mantissa) != 0;
  return from_bits<T>(nan ? static_cast<Bits<T>>((bits & E::sign) | E::exponent | E::quiet) : bits);
}

// Values of From that test its conversion to To: zeros, infinities and NaNs of both signs, the extremes and
// subnormals of both types, random encodings, and for random pairs of neighbours a and b in To (normal and
// subnormal), their midpoint in From and From's neighbours of it: the ties that round to even, and the values just
// beside them that must not.
template <class From, class To> Tensor<From> conversion_cases(std::uint64_t seed) {
  std::vector<From> v;
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (double d : {0.0, 1.0, inf, nan, 1.0 / 3.0, 65504.0, 65520.0, 1e-40, 1e300}) {
    v.push_back(convert<From>(d));
    v.push_back(convert<From>(-d));
  }
  for (From f : {std::numeric_limits<From>::denorm_min(), std::numeric_limits<From>::min(),
                 std::numeric_limits<From>::max(), convert<From>(std::numeric_limits<To>::denorm_min()),
                 convert<From>(std::numeric_limits<To>::min()), convert<From>(std::numeric_limits<To>::max())}) {
    v.push_back(f);
    v.push_back(convert<From>(-convert<double>(f)));
  }
  std::mt19937_64 rng(seed);
  for (int k = 0; k < 4096; ++k) v.push_back(random_value<From>(rng));
  using E = Encoding<To>;
  for (int k = 0; k < 4096; ++k) {
    auto a = static_cast<Bits<To>>(rng() & static_cast<Bits<To>>(E::exponent | E::mantissa));
    if (k % 4 == 0) a = static_cast<Bits<To>>(a & E::mantissa);  // a subnormal
    if ((a & E::exponent) == E::exponent) continue;             // not finite
    const double low = convert<double>(from_bits<To>(a));
    const double high = convert<double>(from_bits<To>(static_cast<Bits<To>>(a + 1)));
    const From mid = convert<From>((low + high) / 2);
    const Bits<From> m = bits_of(mid);
    for (const Bits<From> b : {m, static_cast<Bits<From>>(m - 1), static_cast<Bits<From>>(m + 1)}) {
      const From f = from_bits<From>(b);
      if (std::isnan(convert<double>(f))) continue;
      v.push_back(f);
      v.push_back(convert<From>(-convert<double>(f)));
    }
  }
  return from_vector<From>(v, {static_cast<std::int64_t>(v.size())});
}

}  // namespace

TEST_CASE_TEMPLATE("casts on the GPU give the CPU's bits for every pair of dtypes", From, TAPEGRAD_GPU_DTYPES) {
  for_each_dtype([]<class To>() {
    if constexpr (!std::is_same_v<From, To>) {
      INFO("cast from ", dtype_name(dtype_v<From>), " to ", dtype_name(dtype_v<To>));
      const Tensor<From> x = conversion_cases<From, To>(77);
      const Tensor<To> got = cast<To>(x.to(gpu));
      CHECK(got.device() == gpu);
      const Tensor<To> back = got.to(host);
      const Tensor<To> want = cast<To>(x);
      std::int64_t mismatches = 0, first = -1;
      for (std::int64_t i = 0; i < x.numel(); ++i) {
        if (bits_of(back.flat(i)) == bits_of(want.flat(i))) continue;
        if (mismatches++ == 0) first = i;
      }
      INFO("first mismatch at ", first, " of ", x.numel(), ": from ", first < 0 ? 0.0 : convert<double>(x.flat(first)));
      CHECK(mismatches == 0);
    }
  });
}

TEST_CASE_TEMPLATE("the cast op on the GPU rounds forward and back like the CPU, bit for bit",
                   From, TAPEGRAD_GPU_DTYPES) {
  for_each_dtype([]<class To>() {
    if constexpr (!std::is_same_v<From, To>) {
      INFO("cast from ", dtype_name(dtype_v<From>), " to ", dtype_name(dtype_v<To>));
      const Tensor<From> x = randn<From>({7, 33}, 41, 0.0, 100.0);
      const Tensor<To> dy = randn<To>({7, 33}, 42, 0.0, 100.0);
      Tape tape;
      TapeScope scope(tape);
      const Var<From> p = param(x.to(gpu));
      const Var<To> y = cast<To>(p);
      CHECK(y.device() == gpu);
      backward(y, dy.to(gpu));
      CHECK(bitwise_equal(y.value().to(host), cast<To>(x)));
      CHECK(bitwise_equal(p.grad().to(host), cast<From>(dy)));
    }
  });
}

TEST_CASE("casts to or from an integer dtype on the GPU throw naming the device") {
  const Tensor<float> x = randn<float>({3}, 1).to(gpu);
  CHECK_THROWS_WITH_AS(cast<std::int32_t>(x), doctest::Contains("cast: input 0 is on cuda:0"), Error);
}
