"""PyTorch's Hessian-vector product through its unfused LayerNorm-MLP block, the peer of tapegrad_bench
gpu_higher_order (same configurations, math and dtype: bf16, LN + GELU (tanh) with biases).

For each configuration, in one run and on the same inputs (peer_bench.py's): the eager forward + backward step, and
the HVP of sum(y * dy) in every input: torch.autograd.grad(create_graph=True), then a backward through
sum(<gradient, v>) (double backward). Prints one JSON line per (config, system): median ms over ITERS steps.
"""
import json
import sys

import torch

from peer_bench import CONFIGS, bench_torch, cuda_time, make_inputs, torch_block

HVP_CONFIGS = ("gpt_1k", "gpt_4k")


def bench_double_backward(M, H, Fd, kind):
    x, dy, *params = make_inputs(M, H, Fd, kind)
    inputs = [x] + params
    for t in inputs:
        t.requires_grad_(True)
    g = torch.Generator(device="cuda").manual_seed(20)
    directions = [torch.randn(t.shape, device="cuda", generator=g).to(t.dtype) for t in inputs]
    f = torch_block(kind)

    def hvp():
        loss = (f(*inputs) * dy).sum()
        grads = torch.autograd.grad(loss, inputs, create_graph=True)
        inner = sum((gk * vk).sum() for gk, vk in zip(grads, directions))
        inner.backward()
        for t in inputs:
            t.grad = None

    med, lo, hi = cuda_time(hvp)
    return med, lo, hi


def main():
    only = set(sys.argv[1:])
    for name, M, H, Fd, kind in CONFIGS:
        if name not in HVP_CONFIGS or (only and name not in only):
            continue
        step = bench_torch(name, M, H, Fd, kind, False)[0]
        hvp = bench_double_backward(M, H, Fd, kind)[0]
        for system, ms in (("torch_eager_step", step), ("torch_double_backward", hvp)):
            print(json.dumps(dict(config=name, M=M, H=H, F=Fd, kind=kind, system=system, median_ms=round(ms, 4),
                                  hvp_over_step=round(hvp / step, 3))), flush=True)


if __name__ == "__main__":
    main()
