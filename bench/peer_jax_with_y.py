#!/usr/bin/env python3
"""JAX jit's forward + backward step with the block's output y among its results: system "jax_jit_y".

A JAX step built as `jax.vjp(f, ...)` followed by the pullback of dy that returns the gradients alone leaves y
unread, and XLA then removes the forward's second GEMM (y = a · W2ᵀ + b2): five of the six GEMMs. A training step
needs y (the loss is computed from it), and tapegrad, PyTorch eager and torch.compile all compute it. This runs
peer_bench.py's own JAX step, on the same inputs and with the same timing, with `jax.vjp` wrapped so that the
pullback also returns y: the same math, all six GEMMs, whichever form peer_bench.py's step has (bench/peer_bench.py's
returns y itself, so its "jax_jit" and this "jax_jit_y" time the same work).

usage: peer_jax_with_y.py [path of peer_bench.py, default: the one beside this script] [config names]
       (one JSON line per config, as peer_bench.py's)
"""
import json
import sys

from peer_args import load_peers


def keep_y(jax):
    """jax.vjp whose pullback returns (y, gradients): XLA must then compute y."""
    vjp = jax.vjp

    def vjp_keeping_y(f, *primals):
        y, pullback = vjp(f, *primals)
        return y, lambda cotangent: (y, pullback(cotangent))
    jax.vjp = vjp_keeping_y


def main(argv):
    import jax
    peers, only = load_peers(argv)
    keep_y(jax)
    for name, M, H, Fd, kind in peers.CONFIGS:
        if only and name not in only:
            continue
        med, lo, hi, _ = peers.bench_jax(M, H, Fd, kind)
        print(json.dumps(dict(config=name, M=M, H=H, F=Fd, kind=kind, system="jax_jit_y",
                              median_ms=round(med, 4), min_ms=round(lo, 4), max_ms=round(hi, 4),
                              tflops=round(peers.flops(M, H, Fd, kind) / (med * 1e-3) / 1e12, 1),
                              peak_extra_mib=None)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
