// The process-wide choices of the GPU kernels that users may set: TF32 for f32 products, GEMM autotuning, where fp8
// products run, which kernel runs an elementwise program, and attention's kernels. Each takes effect for the work queued after it.
#pragma once

#include <cstdint>

namespace tapegrad::cuda {

// Whether f32 products may use TF32 tensor cores (process-wide; off by default). Like PyTorch's
// torch.backends.cuda.matmul.allow_tf32: typically several times faster, with relative errors near 1e-3 instead of
// 1e-6. Products already running are not affected.
void set_allow_tf32(bool allow);
bool allow_tf32();

// Whether a problem's algorithm is chosen by timing (process-wide; off by default). On: the first call of each problem
// times cuBLASLt's first 8 candidates (three rounds of 3 runs each, on the problem's own inputs, into scratch; before
// each run a read of scratch twice the L2's size, so that the run finds its operands in memory, as in a training step)
// and keeps the fastest, as XLA's autotuner or cuDNN's benchmark mode do. That first call waits for the timings; every
// later call of the problem runs the kept algorithm and gives the same bits, but two processes may keep different
// algorithms (timings vary), so results can differ between processes in the last bits. Off: cuBLASLt's heuristic first
// choice, the same in every process. A problem first seen while its stream is being captured into a CUDA graph gets the
// heuristic choice either way.
void set_gemm_autotune(bool enable);
bool gemm_autotune();

// Whether an op asked for fp8 products (layernorm_mlp's options.fp8, fp8_dense) quantizes them on a GPU
// (process-wide). where_it_pays, the default: where ops/fp8/gpu_dispatch.hpp's model predicts that the FP8 tensor
// cores save more than the quantization's passes and launches cost, for the op's recipe, shape and weight cache (the
// model and its measured accuracy: docs/fp8.md); elsewhere the op runs its products unquantized in its compute
// dtype, as without fp8, and leaves delayed scaling's state as it is. always: every size quantized. No effect on the
// CPU, where the products are always quantized, nor under tensor parallelism (an amax group), whose ranks must all
// quantize or none. A create_graph backward refuses fp8 at every size.
enum class Fp8Dispatch { where_it_pays, always };
void set_fp8_dispatch(Fp8Dispatch dispatch);
Fp8Dispatch fp8_dispatch();

// Which kernel runs an elementwise program (cuda/elementwise.hpp): one made for it (cuda/element_jit.hpp: compiled by NVRTC once per program shape, then
// kept; straight-line code, near the card's bandwidth) or the one kernel that interprets every program (no
// compilation, but about half the bandwidth in bf16/f16). Both give the same bits. By default a run of at least
// element_compilation_threshold elements gets a made kernel, smaller ones (launch-bound anyway) are interpreted.
enum class ElementCompilation { large_runs, always, never };
inline constexpr std::int64_t element_compilation_threshold = std::int64_t{1} << 16;
void set_element_compilation(ElementCompilation mode);
ElementCompilation element_compilation();

// Which kernels run nn::dot_product_attention on a GPU: cuDNN's fused flash attention for the problems it takes (bf16
// and f16 without dropout or a bias: docs/attention.md) and tapegrad's own for the
// rest, the default; or tapegrad's own for all (to compare the two). cuDNN is loaded at run time; without it every
// problem runs on tapegrad's kernels.
enum class AttentionKernels { cudnn_where_it_applies, tapegrad };
void set_attention_kernels(AttentionKernels kernels);
AttentionKernels attention_kernels();

// Whether cuDNN's attention plan for a problem is chosen by timing (process-wide; off by default), as
// set_gemm_autotune does for products: a problem first seen while it is on compiles up to 4 of cuDNN's heuristic
// choices, and its first call runs each on its own inputs (once, then three timed runs) and keeps the fastest for
// the process. Choices after the first are skipped where they need over 256 MiB more workspace than it, or, for a
// deterministic backward, where cuDNN notes that their results vary. Later calls run the kept plan: the same bits
// for the forward and the deterministic backward (the default backward's sums vary run to run anyway); two
// processes may keep different plans. Off: cuDNN's first choice that compiles (what PyTorch and JAX run). A problem
// first called while its stream is captured takes the first.
void set_attention_autotune(bool enable);
bool attention_autotune();

}  // namespace tapegrad::cuda
