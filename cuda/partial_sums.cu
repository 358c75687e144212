#include "cuda/partial_sums.hpp"

#include "cuda/launch.cuh"

namespace tapegrad::cuda {

namespace {

// A block takes 32 columns at a time; each of its 8 warps adds one fixed slice of the partial rows (in order,
// neighbouring threads on neighbouring columns: coalesced), then one warp adds the 8 slice sums in order. A thread
// loads `in_flight` rows before adding them, still in order (the same bits): one at a time, each load waited for the
// one before (a sum of 1024 partial rows of 4096 took 19 µs, 0.9 TB/s).
constexpr int tile_columns = 32, slices = 8, in_flight = 8;

template <class S>
__global__ void __launch_bounds__(tile_columns * slices)
    sum_partials_kernel(const compute_of<S>* partials, std::int64_t blocks, std::int64_t width, S* out) {
  using C = compute_of<S>;
  __shared__ C slice_sums[slices][tile_columns];
  const int column = static_cast<int>(threadIdx.x) % tile_columns, slice = static_cast<int>(threadIdx.x) / tile_columns;
  const std::int64_t begin = blocks * slice / slices, end = blocks * (slice + 1) / slices;
  for (std::int64_t tile = blockIdx.x; tile * tile_columns < width; tile += gridDim.x) {  // the same for the block
    const std::int64_t j = tile * tile_columns + column;
    C total = 0;
    if (j < width) {
      for (std::int64_t b = begin; b < end; b += in_flight) {
        C rows[in_flight];
#pragma unroll
        for (int k = 0; k < in_flight; ++k) {
          if (b + k < end) rows[k] = partials[(b + k) * width + j];
        }
#pragma unroll
        for (int k = 0; k < in_flight; ++k) {
          if (b + k < end) total += rows[k];
        }
      }
    }
    slice_sums[slice][column] = total;
    __syncthreads();
    if (slice == 0 && j < width) {
      C sum = slice_sums[0][column];
      for (int s = 1; s < slices; ++s) sum += slice_sums[s][column];
      out[j] = from_compute<S>(sum);
    }
    __syncthreads();  // the slice sums are read before the next tile overwrites them
  }
}

}  // namespace

void sum_partials(DType dtype, const void* partials, std::int64_t blocks, std::int64_t width, void* out, int device) {
  if (width == 0) return;
  Launch launch(device);
  dispatch_float(dtype, "sum_partials", [&](auto tag) {
    using S = decltype(tag);
    constexpr int threads = tile_columns * slices;
    const int grid = launch.blocks_for(width * slices, threads);
    sum_partials_kernel<S><<<grid, threads, 0, launch.stream()>>>(static_cast<const compute_of<S>*>(partials),
                                                                   blocks, width, static_cast<S*>(out));
    TAPEGRAD_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace tapegrad::cuda
