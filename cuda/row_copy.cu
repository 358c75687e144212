// The row copy on the GPU. Block (x, y) takes rows y, y + gridDim.y, ... and in each of them one stretch of the
// destination: its threads gather 8 elements each (zero bits past the source's row or rows), all loads in flight
// before the stores. Where the destination's rows are whole 16-byte packs a thread's elements are contiguous and go
// out as one pack; otherwise they lie a block apart (coalesced) and go out one by one. The source's rows are read
// element by element: their length is what is being padded, so they are rarely aligned. The grid maps onto rows
// and columns (no index divisions), with enough rows per block that blocks are not mostly launch overhead (one row
// of 1021 bf16 per block moved 0.6 TB/s).
#include "cuda/row_copy.hpp"

#include <algorithm>
#include <cstdint>

#include "cuda/launch.cuh"

namespace tapegrad::cuda {

namespace {

template <class E> struct RowCopy {
  const E* src;
  E* dst;
  std::int64_t rows, cols, dst_rows, dst_cols;
};

constexpr int threads = 256, per_thread = 8;
constexpr std::int64_t span = threads * per_thread;  // the elements of one block in one row

// Packed: a thread's elements are one pack of V = per_thread (16 bytes for 2-byte elements) or per_thread / V packs.
template <class E, bool Packed> __global__ void __launch_bounds__(threads) copy_rows_kernel(RowCopy<E> c) {
  wait_for_prior_kernels();
  constexpr int V = Packed ? 16 / sizeof(E) : 1;
  static_assert(per_thread % V == 0);
  for (std::int64_t r = blockIdx.y; r < c.dst_rows; r += gridDim.y) {
    const bool inside = r < c.rows;
    const E* in = c.src + r * c.cols;
    E* out = c.dst + r * c.dst_cols;
    for (std::int64_t first = blockIdx.x * span; first < c.dst_cols; first += std::int64_t{gridDim.x} * span) {
      // Element k of the thread's: packs of V contiguous elements, consecutive threads on consecutive packs.
      const auto column = [&](int k) { return first + (std::int64_t{k / V} * threads + threadIdx.x) * V + k % V; };
      E v[per_thread];
#pragma unroll
      for (int k = 0; k < per_thread; ++k) {
        const std::int64_t col = column(k);
        v[k] = inside && col < c.cols ? in[col] : E{};
      }
#pragma unroll
      for (int p = 0; p < per_thread / V; ++p) {
        const std::int64_t col = column(p * V);
        if (col >= c.dst_cols) break;
        Pack<E, V> pack;
#pragma unroll
        for (int k = 0; k < V; ++k) pack.v[k] = v[p * V + k];
        *reinterpret_cast<Pack<E, V>*>(out + col) = pack;
      }
    }
  }
}

}  // namespace

void copy_rows(DType dtype, const void* src, std::int64_t rows, std::int64_t cols, void* dst, std::int64_t dst_rows,
               std::int64_t dst_cols, int device) {
  check(rows >= 0 && cols >= 0 && dst_rows >= 0 && dst_cols >= 0, "copy_rows", "negative sizes: [", rows, ", ", cols,
        "] into [", dst_rows, ", ", dst_cols, "]");
  if (dst_rows == 0 || dst_cols == 0) return;
  Launch launch(device);
  dispatch_size(dtype_size(dtype), "copy_rows", [&](auto unit) {
    using E = decltype(unit);
    const RowCopy<E> c{static_cast<const E*>(src), static_cast<E*>(dst), rows, cols, dst_rows, dst_cols};
    const bool packed = dst_cols % (16 / sizeof(E)) == 0 && aligned_16(dst);
    // A row's stretches on x; rows on y, about one wave of blocks in all (8 per SM), each block then taking several
    // rows (at most the hardware's 65535 on y).
    const std::int64_t x = std::min<std::int64_t>((dst_cols + span - 1) / span, launch.blocks_for(dst_cols, threads));
    const std::int64_t wave = std::int64_t{multiprocessor_count(device)} * 8;
    const std::int64_t y = std::min<std::int64_t>({dst_rows, std::max<std::int64_t>(1, wave / x), 65535});
    const dim3 grid(static_cast<unsigned>(x), static_cast<unsigned>(y));
    launch_overlapped(launch, packed ? copy_rows_kernel<E, true> : copy_rows_kernel<E, false>, grid, threads, 0, c);
  });
}

}  // namespace tapegrad::cuda
