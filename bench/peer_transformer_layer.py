"""One training step of a pre-norm transformer layer in PyTorch eager, torch.compile and JAX jit: the peers of
tapegrad_bench gpu_transformer_layer (nn::TransformerLayer), the same math, shapes and dtype.

    y = x + out(attention(qkv(LN1(x))))    causal attention over `heads` heads of H / heads features; qkv's output
                                           features are the q heads, then the k heads, then the v heads, as
                                           tapegrad's fused projection's columns
    out = y + MLP(LN2(y))                  peer_bench.py's ln_gelu block: LN, linear, GELU (tanh), linear

Biases everywhere, LayerNorm epsilon 1e-5, bf16 parameters and compute, B*S = 8192 tokens. The attention is
F.scaled_dot_product_attention (PyTorch's choice of backend) and jax.nn.dot_product_attention(implementation=
'cudnn'). A step is the forward and the backward into every parameter and x (JAX: jit of the vjp, the output
returned too). One JSON line per (config, system): median ms (CUDA events; JAX: wall time until ready), TFLOP/s on
gpu_transformer_layer's count, peak extra MiB (torch); "error" where a system fails. "floor_products_attention":
the step's twelve GEMMs and cuDNN's attention alone, what no layer can go below at those kernels' rates. A
"forward" line per config: what PyTorch eager's forward holds for the backward (held_after_forward_mib).

usage: peer_transformer_layer.py [torch] [jax] [config names]    (none named: all; as peer_attention.py, torch and
       jax are best run in separate processes)
"""
import json
import os
import sys

# JAX otherwise takes 75 % of the GPU when it starts, before torch's cases in the same process.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from peer_attention import attention_flops  # noqa: E402
from peer_bench import (EPS, autograd_step, cuda_time, cuda_time_and_peak, jax_block, jax_norm, jax_step,  # noqa: E402
                        jax_time, make_inputs, print_record, split_frameworks, to_jax, torch_block)

CONFIGS = [
    # name, B, S, H, heads, F: tapegrad_bench gpu_transformer_layer's (bench/gpu_transformer_layer.cpp)
    ("layer_4k", 4, 2048, 4096, 32, 16384),
    ("layer_1k", 4, 2048, 1024, 16, 4096),
]


def step_flops(B, S, H, heads, Fd):
    """Forward GEMMs 2*tokens*(4*H^2 + 2*H*F) (qkv, out, the MLP's two), tripled by the backward; the attention's."""
    return 3 * 2 * B * S * (4 * H * H + 2 * H * Fd) + attention_flops(B, S, heads, H // heads, True, "forward_backward")


def make_layer_inputs(B, S, H, Fd):
    """x [B, S, H], the output's gradient, and the parameters: LN1's, qkv's and out's (F.linear's layout, with
    peer_bench.py's scales), then peer_bench.py's ln_gelu block's."""
    x, dy, *mlp = make_inputs(B * S, H, Fd, "ln_gelu")
    g = torch.Generator(device="cuda").manual_seed(1)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
    attention = [1 + 0.1 * r(H), 0.1 * r(H), r(3 * H, H) / H ** 0.5, 0.1 * r(3 * H), r(H, H) / H ** 0.5, 0.1 * r(H)]
    return x.view(B, S, H), dy.view(B, S, H), [t.to(torch.bfloat16) for t in attention] + mlp


def torch_layer(heads):
    mlp = torch_block("ln_gelu")

    def f(x, gamma1, beta1, w_qkv, b_qkv, w_out, b_out, *mlp_params):
        B, S, H = x.shape
        h = F.layer_norm(x, (H,), gamma1, beta1, EPS)
        q, k, v = F.linear(h, w_qkv, b_qkv).view(B, S, 3, heads, H // heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, heads, S, D]
        y = x + F.linear(a.transpose(1, 2).reshape(B, S, H), w_out, b_out)
        return y + mlp(y, *mlp_params)
    return f


def jax_layer(heads):
    import jax
    mlp = jax_block("ln_gelu")

    def f(x, gamma1, beta1, w_qkv, b_qkv, w_out, b_out, *mlp_params):
        B, S, H = x.shape
        qkv = (jax_norm("ln", x, gamma1, beta1) @ w_qkv.T + b_qkv).reshape(B, S, 3, heads, H // heads)
        a = jax.nn.dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], is_causal=True,
                                         implementation="cudnn")  # [B, S, heads, D]
        y = x + a.reshape(B, S, H) @ w_out.T + b_out
        return y + mlp(y, *mlp_params)
    return f


def bench_torch(B, S, H, heads, Fd, compiled):
    x, dy, params = make_layer_inputs(B, S, H, Fd)
    f = torch_layer(heads)
    return cuda_time_and_peak(autograd_step(torch.compile(f) if compiled else f, [x] + params, dy))


def torch_held_after_forward(B, S, H, heads, Fd):
    """What PyTorch eager's forward holds for the backward (y included), in MiB, as gpu_transformer_layer's
    held_after_forward_mib."""
    x, dy, params = make_layer_inputs(B, S, H, Fd)
    for t in [x] + params:
        t.requires_grad_(True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    y = torch_layer(heads)(x, *params)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    y.backward(dy)
    return round(held / 2**20, 1)


def bench_jax(B, S, H, heads, Fd):
    x, dy, params = make_layer_inputs(B, S, H, Fd)
    x, dy, *params = to_jax([x, dy] + params)
    torch.cuda.empty_cache()  # the torch copies are gone: give their memory to JAX
    return (*jax_time(jax_step(jax_layer(heads)), x, *params, dy), None)


def bench_floor(B, S, H, heads, Fd):
    """The step's floor: its twelve products (the four linears' forward, input-gradient and weight-gradient GEMMs,
    torch.matmul) and cuDNN's fused attention forward + backward alone, back to back."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    M, D = B * S, H // heads
    r = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    linears = [(r(M, H), r(3 * H, H), r(M, 3 * H)), (r(M, H), r(H, H), r(M, H)),  # (input, weight, output gradient)
               (r(M, H), r(Fd, H), r(M, Fd)), (r(M, Fd), r(H, Fd), r(M, H))]     # qkv, out, the MLP's two
    q, k, v = (r(B, heads, S, D).requires_grad_(True) for _ in range(3))
    do = r(B, heads, S, D)

    def step():
        for x, w, dy in linears:
            torch.matmul(x, w.t())
            torch.matmul(dy, w)
            torch.matmul(dy.t(), x)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(o, (q, k, v), do)

    med, lo, hi = cuda_time(step)
    return med, lo, hi, None


def main(argv):
    frameworks, only = split_frameworks(argv)
    for name, *config in CONFIGS:
        if only and name not in only:
            continue
        systems = []
        if "torch" in frameworks:
            systems += [("torch_eager", lambda: bench_torch(*config, False)),
                        ("torch_compile", lambda: bench_torch(*config, True)),
                        ("floor_products_attention", lambda: bench_floor(*config))]
        if "jax" in frameworks:
            systems += [("jax_jit", lambda: bench_jax(*config))]
        for system, bench in systems:
            print_record(dict(config=name, b_s_h_heads_f=config, dtype="bf16", system=system, mode="forward_backward"),
                         bench, step_flops(*config))
        if "torch" in frameworks:
            print(json.dumps(dict(config=name, b_s_h_heads_f=config, dtype="bf16", system="torch_eager", mode="forward",
                                  held_after_forward_mib=torch_held_after_forward(*config))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
