// The strided copy on the GPU. The host first simplifies the index space: size-1 axes dropped, neighbours that step
// alike on both sides merged (a broadcast axis next to another merges too: 0 = 0 · dim). What is left picks one of:
//   - one contiguous run: cudaMemcpyAsync;
//   - a transpose (the destination's innermost axis is strided in the source, and another axis is the source's
//     contiguous one): 32×32 tiles through shared memory, so that reads run along the source's contiguous axis
//     and writes along the destination's;
//   - anything else: one thread per element, which finds its source and destination offsets by dividing its
//     linear index through the axes (in 32-bit arithmetic when every offset fits). When the innermost axis is
//     contiguous on both sides, elements are moved in 4-, 8- or 16-byte units where sizes and alignment allow.
// A copy moves bits, so kernels are instantiated per element size, not per dtype.
#include "tapegrad/cuda/strided_copy.hpp"

#include <cstdint>
#include <limits>

#include "tapegrad/tensor/gpu/detail/launch.cuh"

namespace tapegrad::cuda {

namespace {

constexpr int max_axes = 8;

// The index space as kernels take it (by value, as a launch parameter).
struct Axes {
  int rank = 0;
  std::int64_t dim[max_axes]{}, src[max_axes]{}, dst[max_axes]{};
};

Axes to_axes(const std::vector<CopyAxis>& axes) {
  Axes a;
  a.rank = static_cast<int>(axes.size());
  for (int i = 0; i < a.rank; ++i) {
    const CopyAxis& x = axes[static_cast<std::size_t>(i)];
    a.dim[i] = x.dim;
    a.src[i] = x.src_stride;
    a.dst[i] = x.dst_stride;
  }
  return a;
}

// dst[offset(i) in dst] = src[offset(i) in src] for each linear index i < n, with I wide enough for every offset.
template <class E, class I> __global__ void strided_copy_kernel(const E* src, E* dst, I n, Axes axes) {
  for (I i = blockIdx.x * I{blockDim.x} + threadIdx.x; i < n; i += I{gridDim.x} * blockDim.x) {
    I rest = i, s = 0, d = 0;
    for (int a = axes.rank - 1; a >= 0; --a) {
      const I dim = static_cast<I>(axes.dim[a]);
      const I idx = rest % dim;
      rest /= dim;
      s += idx * static_cast<I>(axes.src[a]);
      d += idx * static_cast<I>(axes.dst[a]);
    }
    dst[d] = src[s];
  }
}

// A batch of 2-D transposes: `rows` is contiguous in the source (stride 1), `cols` in the destination.
struct Transpose {
  Axes batch;  // the other axes
  std::int64_t rows, cols;
  std::int64_t row_dst_stride, col_src_stride;
  std::int64_t row_tiles, col_tiles;
};

constexpr int tile = 32, tile_rows = 8;  // a block of 32×8 threads moves a 32×32 tile

template <class E> __global__ void transpose_kernel(const E* src, E* dst, Transpose t, std::int64_t tiles) {
  __shared__ E buffer[tile][tile + 1];  // [col][row]; the padding keeps the column reads free of bank conflicts
  for (std::int64_t b = blockIdx.x; b < tiles; b += gridDim.x) {
    const std::int64_t c0 = b % t.col_tiles * tile, r0 = b / t.col_tiles % t.row_tiles * tile;
    std::int64_t rest = b / t.col_tiles / t.row_tiles, s = 0, d = 0;
    for (int a = t.batch.rank - 1; a >= 0; --a) {
      const std::int64_t idx = rest % t.batch.dim[a];
      rest /= t.batch.dim[a];
      s += idx * t.batch.src[a];
      d += idx * t.batch.dst[a];
    }
    for (int y = threadIdx.y; y < tile; y += tile_rows) {  // reads along rows
      const std::int64_t r = r0 + threadIdx.x, c = c0 + y;
      if (r < t.rows && c < t.cols) buffer[y][threadIdx.x] = src[s + r + c * t.col_src_stride];
    }
    __syncthreads();
    for (int y = threadIdx.y; y < tile; y += tile_rows) {  // writes along cols
      const std::int64_t r = r0 + y, c = c0 + threadIdx.x;
      if (r < t.rows && c < t.cols) dst[d + r * t.row_dst_stride + c] = buffer[threadIdx.x][y];
    }
    __syncthreads();  // the next tile reuses the buffer
  }
}

// Size-1 axes dropped, neighbours merged where the outer one steps exactly over the inner one on both sides.
// Empty when the space has no element or a single one (check the element count first).
std::vector<CopyAxis> simplified(const std::vector<CopyAxis>& axes) {
  std::vector<CopyAxis> out;
  for (const CopyAxis& a : axes) {
    if (a.dim == 1) continue;
    if (!out.empty()) {
      CopyAxis& outer = out.back();
      if (outer.src_stride == a.src_stride * a.dim && outer.dst_stride == a.dst_stride * a.dim) {
        outer = {outer.dim * a.dim, a.src_stride, a.dst_stride};
        continue;
      }
    }
    out.push_back(a);
  }
  return out;
}

bool aligned(const void* p, std::size_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

// When the innermost axis is contiguous on both sides: the widest unit (16, 8 or 4 bytes) that divides it, every
// other stride and both pointers, with `axes` rescaled to count such units. Returns the unit's size in bytes.
std::size_t widen(std::vector<CopyAxis>& axes, std::size_t element, const void* src, const void* dst) {
  CopyAxis& last = axes.back();
  if (last.src_stride != 1 || last.dst_stride != 1) return element;
  for (const std::size_t unit : {16, 8, 4}) {
    if (unit <= element) break;
    const auto k = static_cast<std::int64_t>(unit / element);
    bool fits = last.dim % k == 0 && aligned(src, unit) && aligned(dst, unit);
    for (std::size_t a = 0; fits && a + 1 < axes.size(); ++a) fits = axes[a].src_stride % k == 0 && axes[a].dst_stride % k == 0;
    if (!fits) continue;
    last.dim /= k;
    for (std::size_t a = 0; a + 1 < axes.size(); ++a) {
      axes[a].src_stride /= k;
      axes[a].dst_stride /= k;
    }
    return unit;
  }
  return element;
}

// The largest offset the index space reaches on each side.
std::int64_t max_offset(const std::vector<CopyAxis>& axes, bool source) {
  std::int64_t m = 0;
  for (const CopyAxis& a : axes) m += (a.dim - 1) * (source ? a.src_stride : a.dst_stride);
  return m;
}

// dispatch_size's element types, and bytes (fp8 codes).
template <class Fn> void dispatch_element(std::size_t bytes, Fn&& fn) {
  if (bytes == 1) return fn(std::uint8_t{});
  dispatch_size(bytes, "strided_copy", fn);
}

void copy_elementwise(const Launch& launch, std::size_t element, const void* src, void* dst,
                      const std::vector<CopyAxis>& axes) {
  std::int64_t n = 1;
  for (const CopyAxis& a : axes) n *= a.dim;
  constexpr int threads = 256;
  constexpr std::int64_t narrow = std::numeric_limits<std::int32_t>::max();
  const bool fits_32 = n <= narrow && max_offset(axes, true) <= narrow && max_offset(axes, false) <= narrow;
  const Axes a = to_axes(axes);
  dispatch_element(element, [&](auto unit) {
    using E = decltype(unit);
    const int blocks = launch.blocks_for(n, threads);
    if (fits_32) {
      strided_copy_kernel<E, std::uint32_t><<<blocks, threads, 0, launch.stream()>>>(
          static_cast<const E*>(src), static_cast<E*>(dst), static_cast<std::uint32_t>(n), a);
    } else {
      strided_copy_kernel<E, std::int64_t><<<blocks, threads, 0, launch.stream()>>>(static_cast<const E*>(src),
                                                                                     static_cast<E*>(dst), n, a);
    }
    TAPEGRAD_CUDA_CHECK_LAUNCH();
  });
}

// The axis that is contiguous in the source, when the copy is a transpose worth tiling (both sides of the 2-D
// transpose at least a tile's half, so that tiles are mostly full); else -1.
int transposed_axis(const std::vector<CopyAxis>& axes) {
  const CopyAxis& last = axes.back();  // `axes` is not empty
  if (last.dst_stride != 1 || last.src_stride <= 1 || last.dim < tile / 2) return -1;
  for (std::size_t a = 0; a + 1 < axes.size(); ++a) {
    if (axes[a].src_stride == 1 && axes[a].dim >= tile / 2) return static_cast<int>(a);
  }
  return -1;
}

void copy_transposed(const Launch& launch, std::size_t element, const void* src, void* dst,
                     const std::vector<CopyAxis>& axes, int row_axis) {
  const CopyAxis& rows = axes[static_cast<std::size_t>(row_axis)];
  const CopyAxis& cols = axes.back();
  std::vector<CopyAxis> batch;
  std::int64_t batch_count = 1;
  for (std::size_t a = 0; a + 1 < axes.size(); ++a) {
    if (static_cast<int>(a) == row_axis) continue;
    batch.push_back(axes[a]);
    batch_count *= axes[a].dim;
  }
  Transpose t{to_axes(batch), rows.dim, cols.dim, rows.dst_stride, cols.src_stride,
              (rows.dim + tile - 1) / tile, (cols.dim + tile - 1) / tile};
  const std::int64_t tiles = batch_count * t.row_tiles * t.col_tiles;
  const int blocks = launch.blocks_for(tiles * tile * tile_rows, tile * tile_rows);
  dispatch_element(element, [&](auto unit) {
    using E = decltype(unit);
    transpose_kernel<E><<<blocks, dim3(tile, tile_rows), 0, launch.stream()>>>(static_cast<const E*>(src),
                                                                               static_cast<E*>(dst), t, tiles);
    TAPEGRAD_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void strided_copy(DType dtype, const void* src, void* dst, const std::vector<CopyAxis>& axes, int device) {
  check(axes.size() <= static_cast<std::size_t>(max_axes), "strided_copy", "an index space of ", axes.size(),
        " axes exceeds the maximum of ", max_axes);
  std::int64_t n = 1;
  for (const CopyAxis& a : axes) n *= a.dim;
  if (n == 0) return;
  const std::size_t element = dtype_size(dtype);
  std::vector<CopyAxis> simple = simplified(axes);
  Launch launch(device);
  if (simple.empty() || (simple.size() == 1 && simple[0].src_stride == 1 && simple[0].dst_stride == 1)) {
    TAPEGRAD_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * element, cudaMemcpyDeviceToDevice,
                                        launch.stream()));
    return;
  }
  if (const int row_axis = transposed_axis(simple); row_axis >= 0) {
    copy_transposed(launch, element, src, dst, simple, row_axis);
    return;
  }
  const std::size_t unit = widen(simple, element, src, dst);
  copy_elementwise(launch, unit, src, dst, simple);
}

}  // namespace tapegrad::cuda
