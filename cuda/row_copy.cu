// The row copy on the GPU. Block (x, y) takes rows y, y + gridDim.y, ... and in each of them a stretch of
// destination packs: a thread gathers V elements (zero bits past the source's row or rows) and stores them as one
// 16-byte pack where the destination's rows are whole packs. The source's rows are read element by element: their
// length is what is being padded, so they are rarely aligned. No index divisions: the grid maps onto rows and columns.
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

template <class E, int V> __global__ void copy_rows_kernel(RowCopy<E> c) {
  const std::int64_t packs = (c.dst_cols + V - 1) / V;  // whole packs where V > 1
  for (std::int64_t r = blockIdx.y; r < c.dst_rows; r += gridDim.y) {
    const bool inside = r < c.rows;
    const E* in = c.src + r * c.cols;
    Pack<E, V>* out = reinterpret_cast<Pack<E, V>*>(c.dst + r * c.dst_cols);
    for (std::int64_t p = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; p < packs;
         p += std::int64_t{gridDim.x} * blockDim.x) {
      Pack<E, V> pack;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const std::int64_t col = p * V + k;
        pack.v[k] = inside && col < c.cols ? in[col] : E{};
      }
      out[p] = pack;
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
    constexpr int wide = 16 / sizeof(E), threads = 256;
    const RowCopy<E> c{static_cast<const E*>(src), static_cast<E*>(dst), rows, cols, dst_rows, dst_cols};
    const bool packs = dst_cols % wide == 0 && reinterpret_cast<std::uintptr_t>(dst) % 16 == 0;
    const std::int64_t per_row = packs ? dst_cols / wide : dst_cols;
    // A row's packs on x, rows on y (up to the hardware's 65535; the loop takes the rest).
    const dim3 grid(static_cast<unsigned>(launch.blocks_for(per_row, threads)),
                    static_cast<unsigned>(std::min<std::int64_t>(dst_rows, 65535)));
    if (packs) copy_rows_kernel<E, wide><<<grid, threads, 0, launch.stream()>>>(c);
    else copy_rows_kernel<E, 1><<<grid, threads, 0, launch.stream()>>>(c);
    TAPEGRAD_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace tapegrad::cuda
