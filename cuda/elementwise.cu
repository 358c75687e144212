// The elementwise program interpreter (see elementwise.hpp), and the dispatch between it and the kernels made per
// program (cuda/element_jit.hpp, for large runs). The interpreter runs the whole program for a group of adjacent
// elements per thread: the registers are C r[R][W] held in machine registers (every index into them is a
// compile-time constant after the switches below), so a program costs one uniform branch per instruction and W
// arithmetic operations. The program, layout and pointers are __grid_constant__ kernel parameters: indexed at run
// time, they are read from the constant bank instead of being copied to each thread's local memory.
//
// Those registers make the kernel heavy (about 80 machine registers: a third of the SM's threads), and an input is
// needed only when its instruction comes, so loading it there leaves one load in flight per thread: half the
// card's bandwidth. The main (staged) kernel therefore copies the inputs of the next few groups into shared
// memory with cp.async while it interprets the current one: a program reads its inputs from shared memory, and
// the bytes in flight are set by the number of stages, not by the registers.
#include "tapegrad/cuda/elementwise.hpp"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <optional>

#include "tapegrad/cuda/async_copy.cuh"
#include "tapegrad/cuda/element_arithmetic.hpp"
#include "tapegrad/cuda/element_jit.hpp"
#include "tapegrad/tensor/gpu/detail/launch.cuh"

namespace tapegrad::cuda {

namespace {

constexpr int threads_per_block = 256;

#define TAPEGRAD_BINARY_CASE(name) \
  case ElementOp::name: return element_arithmetic<ElementOp::name>(x, y, C(0));
template <class C> __device__ __forceinline__ C binary_op(ElementOp op, C x, C y) {
  switch (op) {
    TAPEGRAD_BINARY_ELEMENT_OPS(TAPEGRAD_BINARY_CASE)
    default: __builtin_unreachable();
  }
}
#undef TAPEGRAD_BINARY_CASE

#define TAPEGRAD_UNARY_CASE(name) \
  case ElementOp::name: return element_arithmetic<ElementOp::name, C, Fast>(x, C(0), s);
template <bool Fast, class C> __device__ __forceinline__ C unary_op(ElementOp op, C x, C s) {
  switch (op) {
    TAPEGRAD_UNARY_ELEMENT_OPS(TAPEGRAD_UNARY_CASE)
    default: __builtin_unreachable();
  }
}
#undef TAPEGRAD_UNARY_CASE

// The register file: R registers of V values. read/write switch over the register index so that each case names
// registers by constants; a program that needs at most 4 registers runs with R = 4 (shallower switches, and room
// for wider groups).
template <class C, int V, int R> struct Registers {
  static_assert(R == 4 || R == element_registers);
  C r[R][V];

  __device__ __forceinline__ void read(int k, C (&x)[V]) const {
    switch (k) {
#define TAPEGRAD_READ_REGISTER(K)                                      \
  case K:                                                              \
    if constexpr (K < R) {                                             \
      _Pragma("unroll") for (int v = 0; v < V; ++v) x[v] = r[K][v];    \
    }                                                                  \
    break;
      TAPEGRAD_READ_REGISTER(0) TAPEGRAD_READ_REGISTER(1) TAPEGRAD_READ_REGISTER(2) TAPEGRAD_READ_REGISTER(3)
      TAPEGRAD_READ_REGISTER(4) TAPEGRAD_READ_REGISTER(5) TAPEGRAD_READ_REGISTER(6) TAPEGRAD_READ_REGISTER(7)
#undef TAPEGRAD_READ_REGISTER
    }
  }
  __device__ __forceinline__ void write(int k, const C (&x)[V]) {
    switch (k) {
#define TAPEGRAD_WRITE_REGISTER(K)                                     \
  case K:                                                              \
    if constexpr (K < R) {                                             \
      _Pragma("unroll") for (int v = 0; v < V; ++v) r[K][v] = x[v];    \
    }                                                                  \
    break;
      TAPEGRAD_WRITE_REGISTER(0) TAPEGRAD_WRITE_REGISTER(1) TAPEGRAD_WRITE_REGISTER(2) TAPEGRAD_WRITE_REGISTER(3)
      TAPEGRAD_WRITE_REGISTER(4) TAPEGRAD_WRITE_REGISTER(5) TAPEGRAD_WRITE_REGISTER(6) TAPEGRAD_WRITE_REGISTER(7)
#undef TAPEGRAD_WRITE_REGISTER
    }
  }
};
static_assert(element_registers == 8, "Registers::read/write name eight registers");

// Which inputs the staged kernel copies ahead into shared memory, and how many groups ahead.
struct ElementStaging {
  int count = 0;                               // staged inputs
  int stages = 1;                              // groups in flight per thread, the current one included
  std::int8_t input[max_element_inputs] = {};  // the staged inputs, in slot order
  std::int8_t slot[max_element_inputs] = {};   // input k's slot, -1 when it is not staged
};

// Runs the program on one group of V elements with R registers: load(k, x) fetches input k, store(j, x) writes
// output j. Fast: the program's dtype is 16-bit (element_arithmetic).
template <class C, int V, int R, bool Fast, class Load, class Store>
__device__ __forceinline__ void interpret(const ElementProgram& program, Load&& load, Store&& store) {
  Registers<C, V, R> regs;
  for (int pc = 0; pc < program.size; ++pc) {
    const ElementInstruction in = program.code[pc];
    C x[V];
    switch (in.op) {
      case ElementOp::input:
        load(in.a, x);
        break;
      case ElementOp::constant:
#pragma unroll
        for (int v = 0; v < V; ++v) x[v] = C(in.scalar);
        break;
      case ElementOp::store:
        regs.read(in.a, x);
        store(in.dst, x);
        continue;
      case ElementOp::add:
      case ElementOp::sub:
      case ElementOp::mul:
      case ElementOp::div:
      case ElementOp::pow: {
        C y[V];
        regs.read(in.a, x);
        regs.read(in.b, y);
#pragma unroll
        for (int v = 0; v < V; ++v) x[v] = binary_op(in.op, x[v], y[v]);
        break;
      }
      default:
        regs.read(in.a, x);
#pragma unroll
        for (int v = 0; v < V; ++v) x[v] = unary_op<Fast>(in.op, x[v], C(in.scalar));
    }
    regs.write(in.dst, x);
  }
}

// Element `e` of the output index space: its coordinates along the layout's axes.
__device__ __forceinline__ void coordinates(const ElementLayout& layout, std::int64_t e,
                                            std::int64_t (&coord)[max_element_rank]) {
#pragma unroll
  for (int d = max_element_rank - 1; d > 0; --d) {
    coord[d] = 0;
    if (d < layout.rank) {
      coord[d] = e % layout.dims[d];
      e /= layout.dims[d];
    }
  }
  coord[0] = e;
}

__device__ __forceinline__ std::int64_t input_offset(const ElementLayout& layout, int k,
                                                     const std::int64_t (&coord)[max_element_rank]) {
  std::int64_t offset = 0;
#pragma unroll
  for (int d = 0; d < max_element_rank; ++d) offset += coord[d] * layout.strides[k][d];
  return offset;
}

// Writes V values of output j at element `base`: in S, or in C where the output is wide; V values at a time (16
// bytes, or 8 for the halves of a 16-bit group: the staged kernel, whose pointers the host checked for alignment).
template <class S, int V>
__device__ __forceinline__ void store_output(const ElementBuffers& buffers, int j, std::int64_t base,
                                             const compute_of<S> (&x)[V]) {
  using C = compute_of<S>;
  if (buffers.wide[j]) {
    constexpr int per_pack = V * sizeof(C) % 16 == 0 ? 16 / sizeof(C) : 1;  // wide values, 16 bytes at a time
    Pack<C, per_pack>* out = reinterpret_cast<Pack<C, per_pack>*>(static_cast<C*>(buffers.outputs[j]) + base);
#pragma unroll
    for (int p = 0; p < V / per_pack; ++p) {
      Pack<C, per_pack> pack;
#pragma unroll
      for (int v = 0; v < per_pack; ++v) pack.v[v] = x[p * per_pack + v];
      out[p] = pack;
    }
  } else {
    Pack<S, V> pack;
#pragma unroll
    for (int v = 0; v < V; ++v) pack.v[v] = from_compute<S>(x[v]);
    *reinterpret_cast<Pack<S, V>*>(static_cast<S*>(buffers.outputs[j]) + base) = pack;
  }
}

// One element per step, inputs read where their instruction comes: for what the staged kernel does not take (a
// flat run's last n % V elements, unaligned pointers, rows whose length is not a multiple of V).
template <class S, bool Flat>
__global__ void __launch_bounds__(threads_per_block)
    direct_kernel(const __grid_constant__ ElementProgram program, const __grid_constant__ ElementLayout layout,
                  const __grid_constant__ ElementBuffers buffers, std::int64_t first, std::int64_t n) {
  using C = compute_of<S>;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t e = first + i;
    std::int64_t coord[max_element_rank];
    if constexpr (!Flat) coordinates(layout, e, coord);
    interpret<C, 1, element_registers, sizeof(S) == 2>(
        program,
        [&](int k, C(&x)[1]) {
          const S* in = static_cast<const S*>(buffers.inputs[k]);
          x[0] = to_compute<C>(in[Flat ? e : input_offset(layout, k, coord)]);
        },
        [&](int j, const C(&x)[1]) { store_output<S, 1>(buffers, j, e, x); });
  }
}

// Waits for all but the newest stages - 1 groups of copies: the oldest one in flight, the current group's, is in.
__device__ __forceinline__ void wait_for_oldest_stage(int stages) {
  switch (stages) {
    case 1: wait_async_copies<0>(); break;
    case 2: wait_async_copies<1>(); break;
    case 3: wait_async_copies<2>(); break;
    default: wait_async_copies<3>(); break;  // max_stages
  }
}

// The two shapes of the staged kernel. A group is V adjacent elements, interpreted W at a time in R registers.
// Compact: programs of at most 4 registers, 32-byte groups of 32/64-bit types (16 of 16-bit ones) interpreted
// whole: each instruction's decoding and register switches serve 8 elements (4 in f64). Full: any program, 16-byte
// groups, 16-bit types in halves: 8 registers of 4 values keep the register count that of the compact shape.
template <class S, bool Compact> struct GroupShape {
  static constexpr int R = Compact ? 4 : element_registers;
  static constexpr int V = Compact ? (sizeof(S) == 8 ? 4 : 8) : 16 / sizeof(S);
  static constexpr int W = Compact ? V : (V < 4 ? V : 4);
  static constexpr int bytes = V * sizeof(S);  // a group's bytes, a multiple of 16
};

// Groups of V elements, `chunks` of them from element 0. Each thread walks its groups with a grid stride and keeps
// the staged inputs of its next stages - 1 groups in flight in shared memory (one slot of a group's bytes per staged
// input, stage and thread). Flat: every input is laid out like the output. Otherwise the groups lie in rows (the
// innermost axis, a multiple of V long): an input with stride 1 along it is staged; one with stride 0 (broadcast
// along the row, like a bias) is read at its instruction, one value for the whole group.
template <class S, bool Flat, class Shape>
__global__ void __launch_bounds__(threads_per_block, 3)
    staged_kernel(const __grid_constant__ ElementProgram program, const __grid_constant__ ElementLayout layout,
                  const __grid_constant__ ElementBuffers buffers, const __grid_constant__ ElementStaging staging,
                  std::int64_t chunks) {
  using C = compute_of<S>;
  constexpr int V = Shape::V, W = Shape::W, packs = Shape::bytes / 16;
  extern __shared__ uint4 slots[];
  const auto slot = [&](int stage, int s) {
    return &slots[((stage * staging.count + s) * blockDim.x + threadIdx.x) * packs];
  };
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  const auto issue = [&](std::int64_t chunk, int stage) {
    if (chunk < chunks) {
      const std::int64_t base = chunk * V;
      std::int64_t coord[max_element_rank];
      if constexpr (!Flat) coordinates(layout, base, coord);
      for (int s = 0; s < staging.count; ++s) {
        const int k = staging.input[s];
        const S* in = static_cast<const S*>(buffers.inputs[k]) + (Flat ? base : input_offset(layout, k, coord));
#pragma unroll
        for (int p = 0; p < packs; ++p) copy_16_async(slot(stage, s) + p, in + p * (16 / sizeof(S)));
      }
    }
    commit_async_copies();
  };

  const std::int64_t first = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  for (int stage = 0; stage + 1 < staging.stages; ++stage) issue(first + stage * stride, stage);
  int stage = 0;
  for (std::int64_t chunk = first; chunk < chunks; chunk += stride) {
    issue(chunk + (staging.stages - 1) * stride, stage == 0 ? staging.stages - 1 : stage - 1);
    wait_for_oldest_stage(staging.stages);
    const std::int64_t base = chunk * V;
#pragma unroll 1
    for (int part = 0; part < V / W; ++part) {
      interpret<C, W, Shape::R, sizeof(S) == 2>(
          program,
          [&](int k, C(&x)[W]) {
            const int s = staging.slot[k];
            if (Flat || s >= 0) {
              const Pack<S, W> pack = reinterpret_cast<const Pack<S, W>*>(slot(stage, s))[part];
#pragma unroll
              for (int v = 0; v < W; ++v) x[v] = to_compute<C>(pack.v[v]);
            } else {  // its coordinates found here, not held in registers through the program
              std::int64_t coord[max_element_rank];
              coordinates(layout, base, coord);
              const S* in = static_cast<const S*>(buffers.inputs[k]);
              const C value = to_compute<C>(in[input_offset(layout, k, coord)]);
#pragma unroll
              for (int v = 0; v < W; ++v) x[v] = value;
            }
          },
          [&](int j, const C(&x)[W]) { store_output<S, W>(buffers, j, base + part * W, x); });
    }
    stage = stage + 1 == staging.stages ? 0 : stage + 1;
  }
}

// How the staged kernel runs `program` in groups of V elements, or nothing when it cannot: every output and
// staged input 16-byte aligned, and for a broadcast layout, rows a multiple of V long whose staged inputs start
// each row on a 16-byte boundary.
std::optional<ElementStaging> plan_staging(const ElementProgram& program, const ElementLayout& layout,
                                           const ElementBuffers& buffers, int V) {
  ElementStaging staging;
  std::fill(std::begin(staging.slot), std::end(staging.slot), std::int8_t{-1});
  const int inner = layout.rank - 1;
  if (!layout.flat && layout.dims[inner] % V != 0) return std::nullopt;
  for (int pc = 0; pc < program.size; ++pc) {
    const ElementInstruction& in = program.code[pc];
    if (in.op == ElementOp::store && !aligned_16(buffers.outputs[in.dst])) return std::nullopt;
    if (in.op != ElementOp::input || staging.slot[in.a] >= 0) continue;
    const std::int64_t(&strides)[max_element_rank] = layout.strides[in.a];
    if (!layout.flat && strides[inner] == 0) continue;  // read at its instruction
    if (!aligned_16(buffers.inputs[in.a])) return std::nullopt;
    if (!layout.flat) {
      if (strides[inner] != 1) return std::nullopt;
      for (int d = 0; d < inner; ++d) {
        if (strides[d] % V != 0) return std::nullopt;
      }
    }
    staging.slot[in.a] = static_cast<std::int8_t>(staging.count);
    staging.input[staging.count++] = in.a;
  }
  return staging;
}

template <class S, bool Flat, class Shape>
void launch_staged(const Launch& launch, const ElementProgram& program, const ElementLayout& layout,
                   const ElementBuffers& buffers, ElementStaging staging, std::int64_t chunks) {
  if (chunks == 0) return;
  // Shared memory within the default 48 KB: fewer threads per block and fewer stages for many staged inputs.
  constexpr int max_shared = 48 * 1024, max_stages = 4;
  const int threads = staging.count * threads_per_block * Shape::bytes > max_shared ? threads_per_block / 2
                                                                                    : threads_per_block;
  const int per_stage = std::max(staging.count, 1) * threads * Shape::bytes;
  staging.stages = std::clamp(max_shared / per_stage, 1, max_stages);
  const std::size_t shared = std::size_t{static_cast<unsigned>(staging.stages * staging.count)} * threads * Shape::bytes;
  // At most the blocks the SMs hold at once (small runs, the interpreter's usual work, skip the occupancy query).
  const auto kernel = staged_kernel<S, Flat, Shape>;
  const std::int64_t blocks = launch.resident_blocks(kernel, launch.blocks_for(chunks, threads), threads, shared);
  kernel<<<static_cast<int>(blocks), threads, shared, launch.stream()>>>(program, layout, buffers, staging, chunks);
  TAPEGRAD_CUDA_CHECK_LAUNCH();
}

template <class S, bool Flat>
void launch_direct(const Launch& launch, const ElementProgram& program, const ElementLayout& layout,
                   const ElementBuffers& buffers, std::int64_t first, std::int64_t n) {
  if (n == 0) return;
  direct_kernel<S, Flat><<<launch.blocks_for(n, threads_per_block), threads_per_block, 0, launch.stream()>>>(
      program, layout, buffers, first, n);
  TAPEGRAD_CUDA_CHECK_LAUNCH();
}

// The registers a program uses.
int registers_used(const ElementProgram& program) {
  int used = 0;
  for (int pc = 0; pc < program.size; ++pc) {
    const ElementInstruction& in = program.code[pc];
    used = std::max(used, (in.op == ElementOp::store ? in.a : in.dst) + 1);
  }
  return used;
}

// Runs the program with the staged kernel in the given shape where its plan allows; false where it does not.
template <class S, class Shape>
bool run_staged(const Launch& launch, const ElementProgram& program, const ElementLayout& layout,
                const ElementBuffers& buffers, std::int64_t n) {
  const std::optional<ElementStaging> staging = plan_staging(program, layout, buffers, Shape::V);
  if (!staging) return false;
  const std::int64_t chunks = n / Shape::V;
  if (layout.flat) {
    launch_staged<S, true, Shape>(launch, program, layout, buffers, *staging, chunks);
    launch_direct<S, true>(launch, program, layout, buffers, chunks * Shape::V, n - chunks * Shape::V);
  } else {
    launch_staged<S, false, Shape>(launch, program, layout, buffers, *staging, chunks);
  }
  return true;
}

// Made kernels index in 32 bits up to here: far below 2^31, so that a step past the last group cannot overflow.
constexpr std::int64_t narrow_limit = std::int64_t{1} << 30;

// The largest element offset input k is read at in a rows (broadcast) layout.
std::int64_t largest_offset(const ElementLayout& layout, int k) {
  std::int64_t offset = 0;
  for (int d = 0; d < layout.rank; ++d) offset += (layout.dims[d] - 1) * layout.strides[k][d];
  return offset;
}

// Runs the program in a kernel made for it, in groups of element_kernel_group values, where the layout allows (as
// for the staged kernel); false where it does not.
template <class S>
bool run_made(const Launch& launch, DType dtype, const ElementProgram& program, const ElementLayout& layout,
              const ElementBuffers& buffers, std::int64_t n) {
  const int V = element_kernel_group(dtype);
  const std::optional<ElementStaging> staging = plan_staging(program, layout, buffers, V);
  if (!staging) return false;
  ElementKernelForm form{
      .dtype = dtype, .flat = layout.flat, .rank = layout.flat ? 0 : layout.rank, .narrow = n <= narrow_limit};
  ElementScalars scalars;
  for (int pc = 0; pc < program.size; ++pc) {
    const ElementInstruction& in = program.code[pc];
    scalars.value[pc] = in.scalar;
    if (in.op == ElementOp::input) {
      form.inputs[in.a] = staging->slot[in.a] >= 0 ? InputRead::vector : InputRead::broadcast;
      form.narrow = form.narrow && (layout.flat || largest_offset(layout, in.a) <= narrow_limit);
    }
    if (in.op == ElementOp::store) form.wide[in.dst] = buffers.wide[in.dst];
  }
  const void* kernel = element_kernel(program, form, launch.device());
  if (kernel == nullptr) return false;
  long long groups = n / V;
  if (groups > 0) {
    void* args[] = {const_cast<ElementLayout*>(&layout), const_cast<ElementBuffers*>(&buffers), &scalars, &groups};
    TAPEGRAD_CUDA_CHECK(cudaLaunchKernel(kernel, launch.blocks_for(groups, threads_per_block), threads_per_block, args,
                                         0, launch.stream()));
  }
  if (layout.flat) launch_direct<S, true>(launch, program, layout, buffers, groups * V, n - groups * V);
  return true;
}

std::atomic<ElementCompilation> compilation{ElementCompilation::large_runs};

}  // namespace

void set_element_compilation(ElementCompilation mode) { compilation = mode; }
ElementCompilation element_compilation() { return compilation; }

void run_element_program(DType dtype, int device, const ElementProgram& program, const ElementLayout& layout,
                         const ElementBuffers& buffers, std::int64_t n) {
  if (n == 0) return;
  Launch launch_on(device);
  const ElementCompilation mode = compilation;
  const bool made = mode == ElementCompilation::always ||
                    (mode == ElementCompilation::large_runs && n >= element_compilation_threshold);
  dispatch_float(dtype, "elementwise", [&](auto tag) {
    using S = decltype(tag);
    if (made && run_made<S>(launch_on, dtype, program, layout, buffers, n)) return;
    if (registers_used(program) <= GroupShape<S, true>::R &&
        run_staged<S, GroupShape<S, true>>(launch_on, program, layout, buffers, n)) {
      return;
    }
    if (run_staged<S, GroupShape<S, false>>(launch_on, program, layout, buffers, n)) return;
    if (layout.flat) launch_direct<S, true>(launch_on, program, layout, buffers, 0, n);
    else launch_direct<S, false>(launch_on, program, layout, buffers, 0, n);
  });
}

}  // namespace tapegrad::cuda
