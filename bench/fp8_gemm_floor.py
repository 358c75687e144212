"""The fp8 floor of a LayerNorm-MLP step: its six GEMMs in fp8 (torch._scaled_mm, cuBLASLt) beside the same six
in bf16, in one run on one GPU. Forward GEMMs e4m3 x e4m3; the backward's products with the gradient e5m2 x e4m3
(TE's HYBRID recipe). One JSON line per (config, system)."""
import json, os, sys, time
import torch

import peer_bench  # beside this file

CONFIGS = [("gpt_1k", 4096, 1024, 4096, False), ("gpt_4k", 8192, 4096, 16384, False),
           ("llama_4k", 8192, 4096, 11008, True)]
if os.environ.get("CONFIGS"):  # a JSON list of [name, M, H, F, gated]
    CONFIGS = [tuple(c) for c in json.loads(os.environ["CONFIGS"])]
ITERS = int(os.environ.get("ITERS", "50"))


def cuda_time(fn, iters=ITERS, warmup=10):
    """Median and minimum ms of fn, timed as peer_bench.py times (CUDA events around each run, after warm-up)."""
    med, lo, _ = peer_bench.cuda_time(fn, iters, warmup)
    return med, lo


def main():
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    one = torch.ones((), device="cuda")
    for name, M, H, F, gated in CONFIGS:
        f1 = 2 * F if gated else F
        r = lambda *s: torch.randn(*s, device="cuda")
        # row-major operands; _scaled_mm wants A row-major [m,k] and B column-major [k,n] (a transposed row-major)
        h, w1, a, w2, dy, dz = r(M, H), r(f1, H), r(M, F), r(H, F), r(M, H), r(M, f1)
        bf = [t.bfloat16() for t in (h, w1, a, w2, dy, dz)]
        hb, w1b, ab, w2b, dyb, dzb = bf
        def bf16_step():
            hb @ w1b.t(); ab @ w2b.t(); dyb.t() @ ab; dyb @ w2b; dzb.t() @ hb; dzb @ w1b
        h8, w18, a8, w28 = h.to(e4), w1.to(e4), a.to(e4), w2.to(e4)
        dy8, dz8 = dy.to(e5), dz.to(e5)
        # contiguous transposed copies where the product needs the other major order (a real step keeps them)
        w1T8, w2T8 = w1.t().contiguous().to(e4), w2.t().contiguous().to(e4)
        aT8, hT8 = a.t().contiguous().to(e4), h.t().contiguous().to(e4)
        dyT8, dzT8 = dy.t().contiguous().to(e5), dz.t().contiguous().to(e5)
        mm = lambda x, y: torch._scaled_mm(x, y, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        def fp8_step():
            mm(h8, w18.t())          # z = h W1
            mm(a8, w28.t())          # y = a W2
            mm(dyT8, aT8.t())        # dW2 = dy^T a   [H,M][M,F]
            mm(dy8, w2T8.t())        # da = dy W2     [M,H][H,F]
            mm(dzT8, hT8.t())        # dW1 = dz^T h   [f1,M][M,H]
            mm(dz8, w1T8.t())        # dh = dz W1     [M,f1][f1,H]
        flops = (18 if gated else 12) * M * H * F
        for sysname, fn in (("gemms_bf16", bf16_step), ("gemms_fp8", fp8_step), ("gemms_bf16_again", bf16_step)):
            try:
                med, lo = cuda_time(fn)
                print(json.dumps(dict(config=name, M=M, H=H, F=F, system=sysname, median_ms=round(med, 4),
                                      min_ms=round(lo, 4), tflops=round(flops / (med * 1e-3) / 1e12, 1))), flush=True)
            except Exception as ex:  # noqa: BLE001
                print(json.dumps(dict(config=name, system=sysname, error=str(ex)[:300])), flush=True)
        del h8, w18, a8, w28, dy8, dz8, w1T8, w2T8, aT8, hT8, dyT8, dzT8, bf
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
