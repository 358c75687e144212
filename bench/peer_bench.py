"""Anchor timings for a LayerNorm-MLP block, forward + backward, on one GPU.

Measures, in one run and on the same inputs:
  - gemm_floor: the six GEMMs of forward+backward alone (torch.matmul, cuBLAS)
  - torch_eager: F.layer_norm -> F.linear -> gelu/swiglu -> F.linear, autograd backward
  - torch_compile: the same function through torch.compile (Inductor)
  - jax_jit: the same math in jax.numpy, jax.jit(jax.vjp), returning y with the gradients
Prints one JSON line per (config, system): median ms, TFLOP/s on the 12*M*H*F
GEMM flops (gated: 18*M*H*F), and peak extra memory where the framework reports it.
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

CONFIGS = [
    # name, M tokens, H hidden, F ffn, kind
    ("small", 256, 256, 1024, "ln_gelu"),
    ("gpt_1k", 4096, 1024, 4096, "ln_gelu"),
    ("gpt_4k", 8192, 4096, 16384, "ln_gelu"),
    ("llama_4k", 8192, 4096, 11008, "rms_swiglu"),
]
if os.environ.get("CONFIGS"):  # a JSON list of [name, M, H, F, kind]
    CONFIGS = [tuple(c) for c in json.loads(os.environ["CONFIGS"])]
EPS = 1e-5
ITERS = int(os.environ.get("ITERS", "30"))


def flops(M, H, Fd, kind):
    return (18 if parse(kind)[2] else 12) * M * H * Fd


def cuda_time(fn, iters=ITERS, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times), min(times), max(times)


def cuda_time_and_peak(fn):
    """cuda_time of fn, and the most memory torch allocated during it beyond what was allocated before (inputs and
    parameters): (median, min, max, peak bytes)."""
    fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    med, lo, hi = cuda_time(fn)
    return med, lo, hi, torch.cuda.max_memory_allocated() - base


def autograd_step(f, inputs, dy):
    """One training step's work with autograd: f(*inputs) seeded with dy into every input (all made to require
    gradients), the gradients dropped after."""
    for t in inputs:
        t.requires_grad_(True)

    def step():
        f(*inputs).backward(dy)
        for t in inputs:
            t.grad = None
    return step


def jax_time(fn, *args, iters=ITERS, warmup=5):
    """cuda_time for JAX, which has no CUDA events: wall time of fn(*args) until its results are ready."""
    import jax
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times), max(times)


def jax_step(f):
    """jax.jit of f's forward and backward: (*primals, dy) -> (y, the gradients of every primal). y is returned too:
    a training step needs it (its loss), and without it XLA drops the forward's last product."""
    import jax

    @jax.jit
    def step(*args):
        *primals, dy = args
        y, vjp = jax.vjp(f, *primals)
        return y, vjp(dy)
    return step


def make_inputs(M, H, Fd, kind, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.float32, generator=g)
    x = r(M, H).to(dtype)
    dy = r(M, H).to(dtype)
    gamma = (1 + 0.1 * r(H)).to(dtype)
    beta = (0.1 * r(H)).to(dtype)
    f1 = 2 * Fd if parse(kind)[2] else Fd
    w1 = (r(f1, H) / H ** 0.5).to(dtype)
    b1 = (0.1 * r(f1)).to(dtype)
    w2 = (r(H, Fd) / Fd ** 0.5).to(dtype)
    b2 = (0.1 * r(H)).to(dtype)
    return x, dy, gamma, beta, w1, b1, w2, b2


def parse(kind):
    """kind = '<norm>_<act>': norm in {ln (with bias), rms (no bias)}, act in {gelu, geglu, swiglu}."""
    norm, act = kind.split("_")
    return norm, act, act in ("geglu", "swiglu"), norm == "ln"


def torch_block(kind, linear=F.linear):
    """The block in PyTorch; `linear(x, w, b)` makes its two products (peer_torch_fp8.py passes FP8 ones)."""
    norm, act, gated, bias = parse(kind)

    def f(x, gamma, beta, w1, b1, w2, b2):
        if norm == "ln":
            h = F.layer_norm(x, (x.shape[-1],), gamma, beta, EPS)
        else:
            h = F.rms_norm(x, (x.shape[-1],), gamma, EPS)
        u = linear(h, w1, b1 if bias else None)
        if gated:
            a, g = u.chunk(2, dim=-1)
            a = F.silu(a) if act == "swiglu" else F.gelu(a, approximate="tanh")
            u = a * g
        else:
            u = F.gelu(u, approximate="tanh")
        return linear(u, w2, b2 if bias else None)
    return f


def bench_torch(name, M, H, Fd, kind, compiled, block=torch_block):
    """The step of block(kind) (default torch_block; peer_torch_fp8.py passes its fp8 block) with autograd."""
    x, dy, *params = make_inputs(M, H, Fd, kind)
    f = block(kind)
    if compiled:
        f = torch.compile(f)
    return cuda_time_and_peak(autograd_step(f, [x] + params, dy))


def bench_gemm_floor(M, H, Fd, kind):
    x, dy, gamma, beta, w1, b1, w2, b2 = make_inputs(M, H, Fd, kind)
    f1 = w1.shape[0]
    h = torch.randn(M, H, device="cuda").to(x.dtype)
    a = torch.randn(M, Fd, device="cuda").to(x.dtype)
    da = torch.randn(M, f1, device="cuda").to(x.dtype)

    def step():
        torch.matmul(h, w1.t())        # fwd GEMM1  [M,H]x[H,f1]
        torch.matmul(a, w2.t())        # fwd GEMM2  [M,F]x[F,H]
        torch.matmul(dy.t(), a)        # dW2        [H,M]x[M,F]
        torch.matmul(dy, w2)           # dAct       [M,H]x[H,F]
        torch.matmul(da.t(), h)        # dW1        [f1,M]x[M,H]
        torch.matmul(da, w1)           # dLn        [M,f1]x[f1,H]

    med, lo, hi = cuda_time(step)
    return med, lo, hi, None


def to_jax(tensors):
    """The torch tensors as bf16 JAX arrays on the default device: the same values in both frameworks."""
    import jax.numpy as jnp
    return [jnp.asarray(t.float().cpu().numpy()).astype(jnp.bfloat16) for t in tensors]


def jax_norm(norm, x, gamma, beta):
    """LayerNorm ("ln", with beta) or RMSNorm ("rms") of x's last axis, statistics in f32."""
    import jax
    import jax.numpy as jnp
    xf = x.astype(jnp.float32)
    if norm == "ln":
        mu = xf.mean(-1, keepdims=True)
        var = ((xf - mu) ** 2).mean(-1, keepdims=True)
        return ((xf - mu) * jax.lax.rsqrt(var + EPS)).astype(x.dtype) * gamma + beta
    return (xf * jax.lax.rsqrt((xf * xf).mean(-1, keepdims=True) + EPS)).astype(x.dtype) * gamma


def jax_block(kind):
    """The block in jax.numpy, with torch_block's arguments (weights as F.linear takes them)."""
    import jax

    norm, act, gated, bias = parse(kind)

    def f(x, gamma, beta, w1, b1, w2, b2):
        h = jax_norm(norm, x, gamma, beta)
        u = h @ w1.T
        if bias:
            u = u + b1
        if gated:
            a, g = jnp.split(u, 2, axis=-1)
            a = jax.nn.silu(a) if act == "swiglu" else jax.nn.gelu(a, approximate=True)
            u = a * g
        else:
            u = jax.nn.gelu(u, approximate=True)
        y = u @ w2.T
        return y + b2 if bias else y
    return f


def bench_jax(M, H, Fd, kind):
    x, dy, *params = to_jax(make_inputs(M, H, Fd, kind))
    return (*jax_time(jax_step(jax_block(kind)), x, *params, dy), None)


def print_record(rec, bench, flops):
    """Prints rec (what was measured) as one JSON line with bench()'s (median, min, max ms, peak bytes or None) and
    TFLOP/s on `flops`, or with the error bench raised: one failing system must not hide the rest."""
    try:
        med, lo, hi, peak = bench()
        rec.update(median_ms=round(med, 4), min_ms=round(lo, 4), max_ms=round(hi, 4),
                   tflops=round(flops / (med * 1e-3) / 1e12, 1),
                   peak_extra_mib=None if peak is None else round(peak / 2**20, 1))
    except Exception as e:
        rec.update(error=repr(e)[:300])
    print(json.dumps(rec), flush=True)


def split_frameworks(argv):
    """The frameworks argv names ("torch", "jax"; none named: both) and the config names it names."""
    frameworks = {a for a in argv if a in ("torch", "jax")} or {"torch", "jax"}
    return frameworks, {a for a in argv if a not in ("torch", "jax")}


def main():
    only = set(sys.argv[1:])
    for name, M, H, Fd, kind in CONFIGS:
        if only and name not in only:
            continue
        systems = [
            ("gemm_floor", lambda: bench_gemm_floor(M, H, Fd, kind)),
            ("torch_eager", lambda: bench_torch(name, M, H, Fd, kind, False)),
            ("torch_compile", lambda: bench_torch(name, M, H, Fd, kind, True)),
            ("jax_jit", lambda: bench_jax(M, H, Fd, kind)),
        ]
        for sysname, fn in systems:
            print_record(dict(config=name, M=M, H=H, F=Fd, kind=kind, system=sysname), fn, flops(M, H, Fd, kind))


if __name__ == "__main__":
    main()
