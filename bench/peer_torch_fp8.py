#!/usr/bin/env python3
"""PyTorch eager with FP8 GEMMs: the fp8 peer of the layernorm_mlp node, system "torch_fp8_eager".

The block of ../shared/gpu/peer_bench.py (LayerNorm + GELU with biases, RMSNorm + SwiGLU without; bf16 everywhere
else), its two linear layers an autograd Function whose products are torch._scaled_mm (cuBLASLt's FP8 kernels) on
tensors quantized with current scaling by separate PyTorch ops: scale = max / amax of each tensor, e4m3 for the
forward's inputs and weights, e5m2 for the gradients (TransformerEngine's HYBRID format), the K-major copies that
Hopper's FP8 products need made by .t().contiguous(). The forward's products use fast accumulation, the backward's
not (TransformerEngine's choice). Timed, on the same inputs, as peer_bench.py times its systems.

usage: peer_torch_fp8.py <path of peer_bench.py> [config names]   (one JSON line per config, as peer_bench.py's)
"""
import importlib.util
import json
import sys

import torch
import torch.nn.functional as F

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def load(path):
    spec = importlib.util.spec_from_file_location("peer_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def quantize(t, dtype):
    """t's fp8 codes and the scale_inv a product multiplies them by (current scaling)."""
    amax = t.abs().amax().float().clamp(min=1e-12)
    scale = torch.finfo(dtype).max / amax
    return (t.float() * scale).clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).to(dtype), scale.reciprocal()


def scaled_mm(a, a_inv, b_t, b_inv, bias=None, fast=False):
    """a [m, k] row-major times b_t [n, k] row-major, transposed (the column-major [k, n] _scaled_mm takes)."""
    return torch._scaled_mm(a, b_t.t(), scale_a=a_inv, scale_b=b_inv, bias=bias, out_dtype=torch.bfloat16,
                            use_fast_accum=fast)


class Fp8Linear(torch.autograd.Function):
    """y = x · wᵀ + b with x [M, K], w [N, K] in bf16, every product in fp8."""

    @staticmethod
    def forward(ctx, x, w, b):
        x8, x_inv = quantize(x, E4M3)
        w8, w_inv = quantize(w, E4M3)
        y = scaled_mm(x8, x_inv, w8, w_inv, b, fast=True)
        ctx.save_for_backward(x8, x_inv, w8, w_inv)
        ctx.has_bias = b is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x8, x_inv, w8, w_inv = ctx.saved_tensors
        dy8, dy_inv = quantize(dy, E5M2)
        dx = scaled_mm(dy8, dy_inv, w8.t().contiguous(), w_inv)                  # [M, N] · [N, K]
        dw = scaled_mm(dy8.t().contiguous(), dy_inv, x8.t().contiguous(), x_inv)  # [N, M] · [M, K]
        db = dy.sum(0) if ctx.has_bias else None
        return dx, dw, db


def block(peers, kind):
    norm, act, gated, bias = peers.parse(kind)

    def f(x, gamma, beta, w1, b1, w2, b2):
        if norm == "ln":
            h = F.layer_norm(x, (x.shape[-1],), gamma, beta, peers.EPS)
        else:
            h = F.rms_norm(x, (x.shape[-1],), gamma, peers.EPS)
        u = Fp8Linear.apply(h, w1, b1 if bias else None)
        if gated:
            a, g = u.chunk(2, dim=-1)
            a = F.silu(a) if act == "swiglu" else F.gelu(a, approximate="tanh")
            u = a * g
        else:
            u = F.gelu(u, approximate="tanh")
        return Fp8Linear.apply(u, w2, b2 if bias else None)
    return f


def bench(peers, M, H, Fd, kind):
    x, dy, gamma, beta, w1, b1, w2, b2 = peers.make_inputs(M, H, Fd, kind)
    params = [gamma, beta, w1, b1, w2, b2]
    for p in [x] + params:
        p.requires_grad_(True)
    f = block(peers, kind)

    def step():
        y = f(x, *params)
        y.backward(dy)
        for t in [x] + params:
            t.grad = None

    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    med, lo, hi = peers.cuda_time(step)
    return med, lo, hi, torch.cuda.max_memory_allocated() - base


def main(argv):
    peers = load(argv[0])
    only = set(argv[1:])
    for name, M, H, Fd, kind in peers.CONFIGS:
        if only and name not in only:
            continue
        try:
            med, lo, hi, peak = bench(peers, M, H, Fd, kind)
            print(json.dumps(dict(config=name, M=M, H=H, F=Fd, kind=kind, system="torch_fp8_eager",
                                  median_ms=round(med, 4), min_ms=round(lo, 4), max_ms=round(hi, 4),
                                  tflops=round(peers.flops(M, H, Fd, kind) / (med * 1e-3) / 1e12, 1),
                                  peak_extra_mib=round(peak / 2**20, 1))), flush=True)
        except Exception as ex:  # noqa: BLE001 (a failing config is reported, the others still run)
            print(json.dumps(dict(config=name, system="torch_fp8_eager", error=str(ex)[:300])), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
