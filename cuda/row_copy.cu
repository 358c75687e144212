// The row copies on the GPU, one launch for all of them: the blocks of the 1-D grid are dealt out to the copies in
// turn (copy j takes blocks first_block[j] ... first_block[j + 1] - 1, laid out on a grid of its own). Block (x, y)
// of a copy takes rows y, y + grid_y, ... and in each of them one stretch of the destination: its threads gather 8
// elements each (zero bits past the source's row or rows), all loads in flight before the stores. Where the
// destination's rows are whole 16-byte packs a thread's elements are contiguous and go out as one pack; otherwise
// they lie a block apart (coalesced) and go out one by one. The source's rows are read element by element: their
// length is what is being padded, so they are rarely aligned. The grids map onto rows and columns (no index
// divisions in the loops), with enough rows per block that blocks are not mostly launch overhead (one row of 1021
// bf16 per block moved 0.6 TB/s).
#include "tapegrad/cuda/row_copy.hpp"

#include <algorithm>
#include <cstdint>

#include "tapegrad/tensor/gpu/detail/launch.cuh"

namespace tapegrad::cuda {

namespace {

template <class E> struct Copy {
  const E* src;
  E* dst;
  std::int64_t rows, cols, dst_rows, dst_cols;
  unsigned grid_x, grid_y;  // the copy's blocks: grid_x stretches of a row, grid_y rows at a time
  bool packed;              // the destination's rows are whole 16-byte packs
};

template <class E> struct Copies {
  Copy<E> copy[max_row_copies];
  unsigned first_block[max_row_copies + 1];  // copy j's blocks begin at first_block[j]
  int count;
};

constexpr int threads = 256, per_thread = 8;
constexpr std::int64_t span = threads * per_thread;  // the elements of one block in one row

// Block (bx, by) of copy c. Packed: a thread's elements are one pack of V = per_thread (16 bytes for 2-byte
// elements) or per_thread / V packs.
template <class E, bool Packed> __device__ void copy_stretches(const Copy<E>& c, unsigned bx, unsigned by) {
  constexpr int V = Packed ? 16 / sizeof(E) : 1;
  static_assert(per_thread % V == 0);
  for (std::int64_t r = by; r < c.dst_rows; r += c.grid_y) {
    const bool inside = r < c.rows;
    const E* in = c.src + r * c.cols;
    E* out = c.dst + r * c.dst_cols;
    for (std::int64_t first = bx * span; first < c.dst_cols; first += std::int64_t{c.grid_x} * span) {
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

template <class E> __global__ void __launch_bounds__(threads) copy_rows_kernel(const Copies<E> copies) {
  wait_for_prior_kernels();
  int j = 0;
  while (j + 1 < copies.count && blockIdx.x >= copies.first_block[j + 1]) ++j;
  const Copy<E>& c = copies.copy[j];
  const unsigned block = blockIdx.x - copies.first_block[j];
  if (c.packed) copy_stretches<E, true>(c, block % c.grid_x, block / c.grid_x);
  else copy_stretches<E, false>(c, block % c.grid_x, block / c.grid_x);
}

}  // namespace

void copy_rows(DType dtype, std::span<const RowCopy> copies, int device) {
  check(copies.size() <= max_row_copies, "copy_rows", copies.size(), " copies in one launch (at most ",
        max_row_copies, ")");
  std::int64_t total = 0;
  for (const RowCopy& c : copies) {
    check(c.rows >= 0 && c.cols >= 0 && c.dst_rows >= 0 && c.dst_cols >= 0, "copy_rows", "negative sizes: [",
          c.rows, ", ", c.cols, "] into [", c.dst_rows, ", ", c.dst_cols, "]");
    total += c.dst_rows * c.dst_cols;
  }
  if (total == 0) return;
  Launch launch(device);
  dispatch_size(dtype_size(dtype), "copy_rows", [&](auto unit) {
    using E = decltype(unit);
    // About one wave of blocks in all (8 per SM), shared by size; each copy's on x over a row's stretches and on y
    // over rows, each block then taking several rows.
    const std::int64_t wave = std::int64_t{multiprocessor_count(device)} * 8;
    Copies<E> batch{};
    unsigned blocks = 0;
    for (const RowCopy& c : copies) {
      if (c.dst_rows == 0 || c.dst_cols == 0) continue;
      const std::int64_t share = std::max<std::int64_t>(1, wave * (c.dst_rows * c.dst_cols) / total);
      const std::int64_t x =
          std::min<std::int64_t>((c.dst_cols + span - 1) / span, launch.blocks_for(c.dst_cols, threads));
      const std::int64_t y = std::min(c.dst_rows, std::max<std::int64_t>(1, share / x));
      batch.copy[batch.count] = {static_cast<const E*>(c.src), static_cast<E*>(c.dst), c.rows, c.cols,
                                 c.dst_rows, c.dst_cols, static_cast<unsigned>(x), static_cast<unsigned>(y),
                                 c.dst_cols % (16 / sizeof(E)) == 0 && aligned_16(c.dst)};
      batch.first_block[batch.count++] = blocks;
      blocks += static_cast<unsigned>(x * y);
    }
    batch.first_block[batch.count] = blocks;
    launch_overlapped(launch, copy_rows_kernel<E>, blocks, threads, 0, batch);
  });
}

}  // namespace tapegrad::cuda
