"""Fused attention in PyTorch and JAX, the peers of tapegrad_bench gpu_attention: the same shapes, dtype (bf16) and
FLOP count (forward 4*B*Hq*S^2*D, forward + backward 3.5x that, causal half), causal and not.

Systems: torch_flash, torch_cudnn, torch_efficient (F.scaled_dot_product_attention with that one backend forced by
sdpa_kernel), jax_cudnn, jax_xla (jax.nn.dot_product_attention with that implementation, under jax.jit). Modes:
forward (torch: inputs requiring gradients, as in training) and forward_backward (the output and the gradients of
q, k and v; JAX returns the output too, as a training step needs it). Layouts: torch [B, heads, S, D] (SDPA's),
JAX [B, S, heads, D] (its own, and tapegrad's bshd). PyTorch's is_causal is top-left aligned, JAX's and tapegrad's
bottom-right: the same mask here, where Sq = Sk.

One JSON line per (config, causal, system, mode): median ms of CUDA-event timings (torch) or of wall time until the
results are ready (JAX), TFLOP/s, peak extra MiB (torch); a backend that refuses a case, or runs out of memory,
prints the line with "error" instead.

usage: peer_attention.py [torch] [jax] [config names]    (none named: all; run torch and jax in separate processes,
       so that neither framework's cached memory crowds the other's)
"""
import os
import sys

# JAX otherwise takes 75 % of the GPU when it starts, before torch's cases in the same process.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from peer_bench import (autograd_step, cuda_time_and_peak, jax_step, jax_time, print_record,  # noqa: E402
                        split_frameworks, to_jax)

SHAPES = [
    # name, B, S, Hq, Hkv, D: tapegrad_bench gpu_attention's (bench/gpu_attention.cpp)
    ("b4_s4k_h32_d128", 4, 4096, 32, 32, 128),
    ("b2_s8k_h32_d128", 2, 8192, 32, 32, 128),
    ("b16_s1k_h16_d64", 16, 1024, 16, 16, 64),
    ("b1_s16k_h8_d128", 1, 16384, 8, 8, 128),
    ("gqa_b4_s4k_h32_kv8_d128", 4, 4096, 32, 8, 128),
]
MODES = ("forward", "forward_backward")
BACKWARD_OVER_FORWARD = 2.5  # the backward's five products against the forward's two, as FlashAttention counts
TORCH_BACKENDS = {"torch_flash": "FLASH_ATTENTION", "torch_cudnn": "CUDNN_ATTENTION",
                  "torch_efficient": "EFFICIENT_ATTENTION"}
JAX_IMPLEMENTATIONS = {"jax_cudnn": "cudnn", "jax_xla": "xla"}


def attention_flops(B, S, Hq, D, causal, mode="forward"):
    """The forward's two products, q.k^T and p.v (causal skips half of them), and the backward's if mode says so."""
    forward = 4 * B * Hq * S * S * D / (2 if causal else 1)
    return forward * (1 + BACKWARD_OVER_FORWARD) if mode == "forward_backward" else forward


def make_inputs(B, S, Hq, Hkv, D, seed=0):
    """q, k, v and the output's gradient, [B, S, heads, D], bf16, unit normal."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, device="cuda", generator=g).to(torch.bfloat16)  # noqa: E731
    return r(B, S, Hq, D), r(B, S, Hkv, D), r(B, S, Hkv, D), r(B, S, Hq, D)


def bench_torch(system, shape, causal, mode):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v, dy = (t.transpose(1, 2).contiguous() for t in make_inputs(*shape))
    gqa = q.shape[1] != k.shape[1]
    attend = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)  # noqa: E731
    step = autograd_step(attend, [q, k, v], dy)
    with sdpa_kernel(getattr(SDPBackend, TORCH_BACKENDS[system])):
        return cuda_time_and_peak(step if mode == "forward_backward" else lambda: attend(q, k, v))


def bench_jax(system, shape, causal, mode):
    import jax
    q, k, v, dy = to_jax(make_inputs(*shape))
    torch.cuda.empty_cache()  # the torch copies of the inputs are gone: give their memory to JAX

    def attend(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=JAX_IMPLEMENTATIONS[system])
    if mode == "forward_backward":
        return (*jax_time(jax_step(attend), q, k, v, dy), None)
    return (*jax_time(jax.jit(attend), q, k, v), None)


def main(argv):
    frameworks, only = split_frameworks(argv)
    systems = [(s, bench_torch) for s in TORCH_BACKENDS if "torch" in frameworks]
    systems += [(s, bench_jax) for s in JAX_IMPLEMENTATIONS if "jax" in frameworks]
    for name, *shape in SHAPES:
        if only and name not in only:
            continue
        B, S, Hq, Hkv, D = shape
        for causal in (False, True):
            for system, bench in systems:
                for mode in MODES:  # a backend that refuses a case prints its error
                    print_record(dict(config=name, b_s_hq_hkv_d=shape, causal=int(causal), dtype="bf16",
                                      system=system, mode=mode),
                                 lambda: bench(system, shape, causal, mode), attention_flops(B, S, Hq, D, causal, mode))


if __name__ == "__main__":
    main(sys.argv[1:])
