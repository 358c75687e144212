#include "tapegrad/cuda/element_source.hpp"

#include <algorithm>
#include <sstream>

#include "tapegrad/tensor/core/error.hpp"

namespace tapegrad::cuda {

namespace {

const char* op_name(ElementOp op) {
  switch (op) {
#define TAPEGRAD_OP_NAME(name) \
  case ElementOp::name: return #name;
    TAPEGRAD_BINARY_ELEMENT_OPS(TAPEGRAD_OP_NAME) TAPEGRAD_UNARY_ELEMENT_OPS(TAPEGRAD_OP_NAME)
#undef TAPEGRAD_OP_NAME
    default: check(false, "elementwise", "instruction ", static_cast<int>(op), " has no arithmetic"); return "";
  }
}

bool is_binary(ElementOp op) {
  switch (op) {
#define TAPEGRAD_BINARY(name) case ElementOp::name:
    TAPEGRAD_BINARY_ELEMENT_OPS(TAPEGRAD_BINARY) return true;
#undef TAPEGRAD_BINARY
    default: return false;
  }
}

// Storage and compute types and the conversions between them: bf16 and f16 are their bits, converted by the
// instructions CUDA's __bfloat162float, __float2bfloat16_rn, __half2float and __float2half_rn use.
std::string type_prelude(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "typedef float S;\ntypedef float C;\n"
             "__device__ __forceinline__ C to_compute(S v) { return v; }\n"
             "__device__ __forceinline__ S to_storage(C v) { return v; }\n";
    case DType::f64:
      return "typedef double S;\ntypedef double C;\n"
             "__device__ __forceinline__ C to_compute(S v) { return v; }\n"
             "__device__ __forceinline__ S to_storage(C v) { return v; }\n";
    case DType::bf16:
      return "typedef unsigned short S;\ntypedef float C;\n"
             "__device__ __forceinline__ C to_compute(S v) { return __uint_as_float(static_cast<unsigned>(v) << 16); }\n"
             "__device__ __forceinline__ S to_storage(C v) {\n"
             "  S s;\n  asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(s) : \"f\"(v));\n  return s;\n}\n";
    case DType::f16:
      return "typedef unsigned short S;\ntypedef float C;\n"
             "__device__ __forceinline__ C to_compute(S v) {\n"
             "  C c;\n  asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(c) : \"h\"(v));\n  return c;\n}\n"
             "__device__ __forceinline__ S to_storage(C v) {\n"
             "  S s;\n  asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(s) : \"f\"(v));\n  return s;\n}\n";
    default: check(false, "elementwise", "no GPU kernel for dtype ", dtype_name(dtype)); return "";
  }
}

// The parameter structs, laid out as ElementLayout, ElementBuffers and ElementScalars (the sizes are checked).
std::string parameter_structs() {
  std::ostringstream s;
  s << "struct Layout {\n  int rank;\n  long long dims[" << max_element_rank << "];\n  long long strides["
    << max_element_inputs << "][" << max_element_rank << "];\n  bool flat;\n};\n"
    << "struct Buffers {\n  const void* inputs[" << max_element_inputs << "];\n  void* outputs["
    << max_element_outputs << "];\n  bool wide[" << max_element_outputs << "];\n};\n"
    << "struct Scalars {\n  double value[" << max_element_program << "];\n};\n"
    << "static_assert(sizeof(Layout) == " << sizeof(ElementLayout) << " && sizeof(Buffers) == "
    << sizeof(ElementBuffers) << " && sizeof(Scalars) == " << sizeof(ElementScalars)
    << ", \"the host's parameter structs\");\n"
    << "template <class T, int N> struct alignas(16) Pack {\n  T v[N];\n};\n";
  return s.str();
}

// Whether an instruction is a few machine instructions (no call into CUDA's math library).
bool is_cheap(ElementOp op) {
  switch (op) {
    case ElementOp::add:
    case ElementOp::sub:
    case ElementOp::mul:
    case ElementOp::neg:
    case ElementOp::square:
    case ElementOp::abs:
    case ElementOp::sign:
    case ElementOp::relu:
    case ElementOp::relu_grad: return true;
    default: return false;
  }
}

// The values a thread computes per step (a multiple of the 16-byte group V). A program of cheap instructions over
// at most two inputs takes four groups (64 bytes of each input in flight per thread: bf16 `x * 2` went from 74 % of
// the card's bandwidth to 92 % on the H200); others 16 values, which keeps a computing program's temporaries in
// registers (bf16 gelu_tanh at 32 values: 80 % → 69 %; f32 at 8 values is no faster).
int values_per_step(const ElementProgram& program, int V) {
  int inputs = 0;
  bool cheap = true;
  for (int pc = 0; pc < program.size; ++pc) {
    const ElementOp op = program.code[pc].op;
    if (op == ElementOp::input) {
      ++inputs;
    } else if (op != ElementOp::constant && op != ElementOp::store) {
      cheap = cheap && is_cheap(op);
    }
  }
  return cheap && inputs <= 2 ? std::max(4 * V, 16) : 16;
}

}  // namespace

std::string element_kernel_source(const ElementProgram& program, const ElementKernelForm& form) {
  check(form.flat || (form.rank >= 1 && form.rank <= max_element_rank), "elementwise",
        "a made kernel for rows needs a rank from 1 to ", max_element_rank, ", not ", form.rank);
  const int V = element_kernel_group(form.dtype);
  const bool wide_differs = form.dtype == DType::bf16 || form.dtype == DType::f16;  // wide values are f32
  std::ostringstream s;
  // A thread takes U groups per step, g and g + stride (each warp's accesses stay contiguous, every 32-byte sector
  // written whole by one store instruction), and loads them all before any arithmetic: U · inputs loads of 16 bytes
  // in flight per thread. Values are arrays of N = U · V. Indices are 32-bit where the form allows (cheaper
  // division for broadcast rows, fewer registers).
  s << "#include \"tapegrad/cuda/element_arithmetic.hpp\"\n"
    << "using tapegrad::cuda::ElementOp;\nusing tapegrad::cuda::element_arithmetic;\n"
    << type_prelude(form.dtype) << parameter_structs() << "constexpr int V = " << V
    << ", U = " << values_per_step(program, V) / V << ", N = U * V;\nusing I = " << (form.narrow ? "int" : "long long")
    << ";\n"
    << "extern \"C\" __global__ void __launch_bounds__(256) " << element_kernel_name
    << "(const __grid_constant__ Layout layout, const __grid_constant__ Buffers buffers,\n"
    << "    const __grid_constant__ Scalars scalars, long long groups) {\n"
    << "  const I stride = static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);\n"
    << "  for (I first = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);\n"
    << "       first < groups; first += U * stride) {\n"
    << "    I base[U];\n    bool valid[U];\n"
    << "#pragma unroll\n    for (int u = 0; u < U; ++u) {\n"
    << "      valid[u] = first + u * stride < groups;\n      base[u] = (first + u * stride) * V;\n    }\n";
  if (!form.flat) {  // each group's coordinates, for the form's rank (no loop over unused axes)
    s << "    I coord[U][" << form.rank << "];\n"
      << "#pragma unroll\n    for (int u = 0; u < U; ++u) {\n      I e = base[u];\n";
    for (int d = form.rank - 1; d > 0; --d) {
      s << "      coord[u][" << d << "] = e % static_cast<I>(layout.dims[" << d << "]);\n"
        << "      e /= static_cast<I>(layout.dims[" << d << "]);\n";
    }
    s << "      coord[u][0] = e;\n    }\n";
  }
  // Every input read once, before any arithmetic: all its loads in flight together.
  for (int k = 0; k < max_element_inputs; ++k) {
    const InputRead read = form.inputs[static_cast<std::size_t>(k)];
    if (read == InputRead::unused) continue;
    std::ostringstream at;
    if (form.flat) {
      at << "base[u]";
    } else {
      at << "(0";
      for (int d = 0; d < form.rank; ++d) {
        at << " + coord[u][" << d << "] * static_cast<I>(layout.strides[" << k << "][" << d << "])";
      }
      at << ")";
    }
    s << "    C in" << k << "[N] = {};\n#pragma unroll\n    for (int u = 0; u < U; ++u) {\n      if (!valid[u]) continue;\n"
      << "      const S* from = static_cast<const S*>(buffers.inputs[" << k << "]) + " << at.str() << ";\n";
    if (read == InputRead::vector) {
      s << "      const Pack<S, V> p = *reinterpret_cast<const Pack<S, V>*>(from);\n"
        << "#pragma unroll\n      for (int v = 0; v < V; ++v) in" << k << "[u * V + v] = to_compute(p.v[v]);\n";
    } else {
      s << "      const C x = to_compute(*from);\n"
        << "#pragma unroll\n      for (int v = 0; v < V; ++v) in" << k << "[u * V + v] = x;\n";
    }
    s << "    }\n";
  }
  // Each instruction's value gets a name of its own; `value[r]` names what register r holds.
  std::string value[element_registers];
  for (int pc = 0; pc < program.size; ++pc) {
    const ElementInstruction& in = program.code[pc];
    const std::string r = std::string(1, 'r').append(std::to_string(pc));
    switch (in.op) {
      case ElementOp::input:
        check(form.inputs[in.a] != InputRead::unused, "elementwise", "a made kernel reads input ", int{in.a},
              " that its form leaves unused");
        value[in.dst] = "in" + std::to_string(in.a);
        continue;
      case ElementOp::constant:
        s << "    C " << r << "[N];\n    {\n      const C c = C(scalars.value[" << pc << "]);\n"
          << "#pragma unroll\n      for (int i = 0; i < N; ++i) " << r << "[i] = c;\n    }\n";
        break;
      case ElementOp::store: {
        const std::string j = std::to_string(in.dst);
        s << "#pragma unroll\n    for (int u = 0; u < U; ++u) {\n      if (!valid[u]) continue;\n";
        if (form.wide[in.dst] && wide_differs) {  // V f32 values, 16 bytes at a time
          s << "      Pack<C, 4>* to = reinterpret_cast<Pack<C, 4>*>(static_cast<C*>(buffers.outputs[" << j
            << "]) + base[u]);\n#pragma unroll\n      for (int h = 0; h < V / 4; ++h) {\n        Pack<C, 4> p;\n"
            << "#pragma unroll\n        for (int v = 0; v < 4; ++v) p.v[v] = " << value[in.a]
            << "[u * V + 4 * h + v];\n        to[h] = p;\n      }\n";
        } else {
          s << "      Pack<S, V> p;\n#pragma unroll\n      for (int v = 0; v < V; ++v) p.v[v] = to_storage("
            << value[in.a] << "[u * V + v]);\n      *reinterpret_cast<Pack<S, V>*>(static_cast<S*>(buffers.outputs["
            << j << "]) + base[u]) = p;\n";
        }
        s << "    }\n";
        continue;
      }
      default: {
        const std::string call = std::string("element_arithmetic<ElementOp::") + op_name(in.op) + ", C, " +
                                 (wide_differs ? "true" : "false") + ">(";  // Fast for 16-bit dtypes, as interpreted
        const std::string args = is_binary(in.op)
                                     ? value[in.a] + "[i], " + value[in.b] + "[i], C(0)"
                                     : value[in.a] + "[i], C(0), C(scalars.value[" + std::to_string(pc) + "])";
        s << "    C " << r << "[N];\n#pragma unroll\n    for (int i = 0; i < N; ++i) " << r << "[i] = " << call
          << args << ");\n";
      }
    }
    value[in.dst] = r;
  }
  s << "  }\n}\n";
  return s.str();
}

}  // namespace tapegrad::cuda
