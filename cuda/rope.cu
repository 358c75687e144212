// Rotary position embeddings on the GPU: one thread per slot of a row (a pair it turns, or two features it copies;
// cuda/rope.hpp), consecutive threads on consecutive slots of a row, over a grid-stride loop. The angle's cosine and
// sine are computed in double per pair, by the same formula as the CPU's, and rounded to the compute type.
#include "tapegrad/cuda/rope.hpp"

#include "tapegrad/tensor/gpu/detail/launch.cuh"

namespace tapegrad::cuda {

namespace {

constexpr int threads = 256;

template <class S> __global__ void __launch_bounds__(threads) rope_kernel(const RopeProblem p, const S* x, S* out) {
  using C = compute_of<S>;
  wait_for_prior_kernels();
  const std::int64_t slots = (p.D + 1) / 2, total = p.batch * p.heads * p.S * slots;
  for (std::int64_t t = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; t < total;
       t += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t j = t % slots, row = t / slots, s = row % p.S, h = (row / p.S) % p.heads,
                       b = row / (p.S * p.heads);
    const std::int64_t at = p.row_at(b, h, s);
    std::int64_t first, second;
    if (p.slot(h, j, first, second)) {
      double cosine, sine;
      p.rotation(s, j, cosine, sine);
      C a, c;
      rotate_pair(to_compute<C>(x[at + first]), to_compute<C>(x[at + second]), static_cast<C>(cosine),
                  static_cast<C>(sine), a, c);
      out[at + first] = from_compute<S>(a);
      out[at + second] = from_compute<S>(c);
    } else {
      out[at + first] = x[at + first];
      if (second < p.D) out[at + second] = x[at + second];
    }
  }
}

}  // namespace

void rope(DType dtype, const RopeProblem& problem, const void* x, void* out, int device) {
  const std::int64_t work = problem.batch * problem.heads * problem.S * ((problem.D + 1) / 2);
  if (work == 0) return;
  Launch launch(device);
  dispatch_float(dtype, "rope", [&](auto unit) {
    using S = decltype(unit);
    launch_overlapped(launch, rope_kernel<S>, launch.blocks_for(work, threads), threads, 0, problem,
                      static_cast<const S*>(x), static_cast<S*>(out));
  });
}

}  // namespace tapegrad::cuda
