#!/usr/bin/env python3
"""PyTorch eager with FP8 GEMMs: the fp8 peer of the layernorm_mlp node, system "torch_fp8_eager".

The block of bench/peer_bench.py (LayerNorm + GELU with biases, RMSNorm + SwiGLU without; bf16 everywhere
else), its two linear layers an autograd Function whose products are torch._scaled_mm (cuBLASLt's FP8 kernels) on
tensors quantized with current scaling by separate PyTorch ops: scale = max / amax of each tensor, e4m3 for the
forward's inputs and weights, e5m2 for the gradients (TransformerEngine's HYBRID format), the K-major copies that
Hopper's FP8 products need made by .t().contiguous(). The forward's products use fast accumulation, the backward's
not (TransformerEngine's choice). Timed, on the same inputs, as peer_bench.py times its systems.

usage: peer_torch_fp8.py [path of peer_bench.py, default: the one beside this script] [config names]
       (one JSON line per config, as peer_bench.py's)
"""
import json
import sys

import torch

from peer_args import load_peers

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


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


def bench(peers, M, H, Fd, kind):
    """peer_bench.py's eager step, timed as it times PyTorch's, with this file's fp8 block."""
    fp8_block = lambda k: peers.torch_block(k, linear=Fp8Linear.apply)  # noqa: E731
    return peers.bench_torch(None, M, H, Fd, kind, False, block=fp8_block)


def main(argv):
    peers, only = load_peers(argv)
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
