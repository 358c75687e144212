// The elementwise program interpreter (see elementwise.hpp). Each thread runs the whole program for V adjacent
// elements at a time: the registers are C r[8][V] held in machine registers (every index into them is a
// compile-time constant after the switches below), so a program costs one uniform branch per instruction and
// V arithmetic operations. The program, layout and pointers are __grid_constant__ kernel parameters: indexed at
// run time, they are read from the constant bank instead of being copied to each thread's local memory.
#include "cuda/elementwise.hpp"

#include <cstring>

#include "cuda/activation_math.hpp"
#include "cuda/launch.cuh"

namespace tapegrad::cuda {

namespace {

constexpr int threads_per_block = 256;

template <class C> __device__ __forceinline__ C binary_op(ElementOp op, C x, C y) {
  switch (op) {
    case ElementOp::add: return x + y;
    case ElementOp::sub: return x - y;
    case ElementOp::mul: return x * y;
    case ElementOp::div: return x / y;
    default: return pow(x, y);  // ElementOp::pow
  }
}

template <class C> __device__ __forceinline__ C unary_op(ElementOp op, C x, C s) {
  namespace act = tapegrad::activation;
  C grad{};
  switch (op) {
    case ElementOp::neg: return -x;
    case ElementOp::exp: return exp(x);
    case ElementOp::log: return log(x);
    case ElementOp::sqrt: return sqrt(x);
    case ElementOp::rsqrt: return C(1) / sqrt(x);
    case ElementOp::square: return x * x;
    case ElementOp::abs: return fabs(x);
    case ElementOp::sign: return x > C(0) ? C(1) : (x < C(0) ? C(-1) : x);
    case ElementOp::tanh: return tanh(x);
    case ElementOp::sigmoid: return act::sigmoid(x);
    case ElementOp::relu: return act::relu<C>(x, nullptr);
    case ElementOp::relu_grad: act::relu(x, &grad); return grad;
    case ElementOp::squared_relu: return act::squared_relu<C>(x, nullptr);
    case ElementOp::squared_relu_grad: act::squared_relu(x, &grad); return grad;
    case ElementOp::swish: return act::swish<C>(x, s, nullptr);
    case ElementOp::swish_grad: act::swish(x, s, &grad); return grad;
    case ElementOp::gelu_tanh: return act::gelu_tanh<C>(x, nullptr);
    case ElementOp::gelu_tanh_grad: act::gelu_tanh(x, &grad); return grad;
    case ElementOp::gelu_erf: return act::gelu_erf<C>(x, nullptr);
    default: act::gelu_erf(x, &grad); return grad;  // ElementOp::gelu_erf_grad
  }
}

// The register file. read/write switch over the register index so that each case names registers by constants.
template <class C, int V> struct Registers {
  C r[element_registers][V];

  __device__ __forceinline__ void read(int k, C (&x)[V]) const {
    switch (k) {
#define TAPEGRAD_READ_REGISTER(K)             \
  case K:                                     \
    _Pragma("unroll") for (int v = 0; v < V; ++v) x[v] = r[K][v]; \
    break;
      TAPEGRAD_READ_REGISTER(0) TAPEGRAD_READ_REGISTER(1) TAPEGRAD_READ_REGISTER(2) TAPEGRAD_READ_REGISTER(3)
      TAPEGRAD_READ_REGISTER(4) TAPEGRAD_READ_REGISTER(5) TAPEGRAD_READ_REGISTER(6) TAPEGRAD_READ_REGISTER(7)
#undef TAPEGRAD_READ_REGISTER
    }
  }
  __device__ __forceinline__ void write(int k, const C (&x)[V]) {
    switch (k) {
#define TAPEGRAD_WRITE_REGISTER(K)            \
  case K:                                     \
    _Pragma("unroll") for (int v = 0; v < V; ++v) r[K][v] = x[v]; \
    break;
      TAPEGRAD_WRITE_REGISTER(0) TAPEGRAD_WRITE_REGISTER(1) TAPEGRAD_WRITE_REGISTER(2) TAPEGRAD_WRITE_REGISTER(3)
      TAPEGRAD_WRITE_REGISTER(4) TAPEGRAD_WRITE_REGISTER(5) TAPEGRAD_WRITE_REGISTER(6) TAPEGRAD_WRITE_REGISTER(7)
#undef TAPEGRAD_WRITE_REGISTER
    }
  }
};
static_assert(element_registers == 8, "Registers::read/write name eight registers");

// V contiguous values of S, moved as one 16-byte access when V·sizeof(S) == 16.
template <class S, int V> struct alignas(sizeof(S) * V) Pack {
  S v[V];
};

template <class S, int V, bool Flat>
__device__ __forceinline__ void load_input(const ElementLayout& layout, const ElementBuffers& buffers, int k,
                                           std::int64_t base, const std::int64_t (&coord)[max_element_rank],
                                           compute_of<S> (&x)[V]) {
  using C = compute_of<S>;
  const S* in = static_cast<const S*>(buffers.inputs[k]);
  if constexpr (Flat) {
    const Pack<S, V> pack = *reinterpret_cast<const Pack<S, V>*>(in + base);
#pragma unroll
    for (int v = 0; v < V; ++v) x[v] = to_compute<C>(pack.v[v]);
  } else {
    static_assert(V == 1, "broadcast layouts run one element per step");
    std::int64_t offset = 0;
#pragma unroll
    for (int d = 0; d < max_element_rank; ++d) offset += coord[d] * layout.strides[k][d];
    x[0] = to_compute<C>(in[offset]);
  }
}

template <class S, int V>
__device__ __forceinline__ void store_output(const ElementBuffers& buffers, int j, std::int64_t base,
                                             const compute_of<S> (&x)[V]) {
  using C = compute_of<S>;
  if (buffers.wide[j]) {
    C* out = static_cast<C*>(buffers.outputs[j]) + base;
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = x[v];
  } else {
    Pack<S, V> pack;
#pragma unroll
    for (int v = 0; v < V; ++v) pack.v[v] = from_compute<S>(x[v]);
    *reinterpret_cast<Pack<S, V>*>(static_cast<S*>(buffers.outputs[j]) + base) = pack;
  }
}

// Runs the program on `chunks` groups of V elements starting at element `first`.
template <class S, int V, bool Flat>
__global__ void __launch_bounds__(threads_per_block)
    element_kernel(const __grid_constant__ ElementProgram program, const __grid_constant__ ElementLayout layout,
                   const __grid_constant__ ElementBuffers buffers, std::int64_t first, std::int64_t chunks) {
  using C = compute_of<S>;
  for (std::int64_t chunk = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; chunk < chunks;
       chunk += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t base = first + chunk * V;
    std::int64_t coord[max_element_rank] = {};
    if constexpr (!Flat) {
      std::int64_t rest = base;
#pragma unroll
      for (int d = max_element_rank - 1; d >= 0; --d) {
        if (d < layout.rank) {
          coord[d] = rest % layout.dims[d];
          rest /= layout.dims[d];
        }
      }
    }
    Registers<C, V> regs;
    for (int pc = 0; pc < program.size; ++pc) {
      const ElementInstruction in = program.code[pc];
      C x[V];
      switch (in.op) {
        case ElementOp::input:
          load_input<S, V, Flat>(layout, buffers, in.a, base, coord, x);
          break;
        case ElementOp::constant:
#pragma unroll
          for (int v = 0; v < V; ++v) x[v] = C(in.scalar);
          break;
        case ElementOp::store:
          regs.read(in.a, x);
          store_output<S, V>(buffers, in.dst, base, x);
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
          for (int v = 0; v < V; ++v) x[v] = unary_op(in.op, x[v], C(in.scalar));
      }
      regs.write(in.dst, x);
    }
  }
}

template <class S, int V, bool Flat>
void launch(const Launch& launch, const ElementProgram& program, const ElementLayout& layout,
            const ElementBuffers& buffers, std::int64_t first, std::int64_t chunks) {
  if (chunks == 0) return;
  element_kernel<S, V, Flat><<<launch.blocks_for(chunks, threads_per_block), threads_per_block, 0, launch.stream()>>>(
      program, layout, buffers, first, chunks);
  TAPEGRAD_CUDA_CHECK_LAUNCH();
}

bool aligned_16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Every pointer the vector path reads or writes 16 bytes at a time sits on a 16-byte boundary.
bool vector_aligned(const ElementProgram& program, const ElementBuffers& buffers) {
  for (int pc = 0; pc < program.size; ++pc) {
    const ElementInstruction& in = program.code[pc];
    if (in.op == ElementOp::input && !aligned_16(buffers.inputs[in.a])) return false;
    if (in.op == ElementOp::store && !aligned_16(buffers.outputs[in.dst])) return false;
  }
  return true;
}

}  // namespace

void run_element_program(DType dtype, int device, const ElementProgram& program, const ElementLayout& layout,
                         const ElementBuffers& buffers, std::int64_t n) {
  if (n == 0) return;
  Launch launch_on(device);
  dispatch_float(dtype, "elementwise", [&](auto tag) {
    using S = decltype(tag);
    constexpr int V = 16 / sizeof(S);
    if (!layout.flat) {
      launch<S, 1, false>(launch_on, program, layout, buffers, 0, n);
    } else if (vector_aligned(program, buffers)) {
      const std::int64_t vectors = n / V;
      launch<S, V, true>(launch_on, program, layout, buffers, 0, vectors);
      launch<S, 1, true>(launch_on, program, layout, buffers, vectors * V, n - vectors * V);
    } else {
      launch<S, 1, true>(launch_on, program, layout, buffers, 0, n);
    }
  });
}

void add(DType dtype, int device, const void* a, const void* b, void* out, std::int64_t n) {
  ElementProgram program;
  program.size = 4;
  program.code[0] = {ElementOp::input, 0, 0, 0, 0.0};
  program.code[1] = {ElementOp::input, 1, 1, 0, 0.0};
  program.code[2] = {ElementOp::add, 0, 0, 1, 0.0};
  program.code[3] = {ElementOp::store, 0, 0, 0, 0.0};
  ElementLayout layout;
  layout.dims[0] = n;
  ElementBuffers buffers;
  buffers.inputs[0] = a;
  buffers.inputs[1] = b;
  buffers.outputs[0] = out;
  run_element_program(dtype, device, program, layout, buffers, n);
}

}  // namespace tapegrad::cuda
