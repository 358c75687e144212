#!/usr/bin/env python3
"""Fits the model by which a GPU op decides whether its fp8 products pay (ops/fp8/gpu_dispatch.cpp) to the
layernorm_mlp benchmark's steps (`bench/gpu_round.sh node` -> ours.jsonl), and prints the measured and predicted
ratios to bf16.

    python3 bench/fp8_dispatch_fit.py build-gpu/round/ours.jsonl [--min-product N]

(--min-product leaves out the shapes with M·H·F below N: runs from before the benchmark quantized every shape ran
the smallest unquantized; the coefficients in gpu_dispatch.cpp come from such a run, with N = 2^32.)

The model, per recipe: time(fp8 step) - time(bf16 step) =
    - saving · multiply-adds + activation · activation elements + weight · weight elements + launch · tensors
(gpu_dispatch.hpp's StepWork, in µs, per G multiply-adds and M elements), fitted by least squares relative to the
bf16 step over the autotuned forward+backward steps, with and without a weight cache (the cache's weight elements
are 0). Pure Python: the machines that run it need no numpy."""
import argparse
import json

RECIPES = ["delayed", "current", "block"]


def step_work(M, H, F, width, cached):
    """gpu_dispatch's layernorm_mlp_work: the six products, h, a, dy and dz, W1 and W2, six tensors."""
    return [3 * M * H * F * (1 + width) / 1e9, (2 * M * H + (1 + width) * M * F) / 1e6,
            0.0 if cached else H * F * (1 + width) / 1e6, 6.0]


def solve(a, b):
    n = len(a)
    m = [row[:] + [v] for row, v in zip(a, b)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


def least_squares(rows, targets, weights):
    k = len(rows[0])
    normal = [[sum(w * w * r[i] * r[j] for r, w in zip(rows, weights)) for j in range(k)] for i in range(k)]
    rhs = [sum(w * w * r[i] * t for r, t, w in zip(rows, targets, weights)) for i in range(k)]
    return solve(normal, rhs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("steps")
    parser.add_argument("--min-product", type=float, default=0)
    args = parser.parse_args()
    steps = {}
    for line in open(args.steps):
        r = json.loads(line)
        if r.get("gemm") == "autotuned" and r.get("mode") == "forward_backward":
            steps[(r["M"], r["H"], r["F"], r["kind"], r["precision"])] = r["median_ms"] * 1000
    shapes = sorted({k[:4] for k in steps if k[0] * k[1] * k[2] >= args.min_product})
    for recipe in RECIPES:
        rows, targets, weights, labels = [], [], [], []
        for cached in (False, True):
            precision = f"fp8_{recipe}" + ("_cached" if cached else "")
            for shape in shapes:
                if shape + (precision,) not in steps:
                    continue
                M, H, F, kind = shape
                bf16 = steps[shape + ("bf16",)]
                work = step_work(M, H, F, 2 if kind == "rms_swiglu" else 1, cached)
                rows.append([-work[0]] + work[1:])
                targets.append(steps[shape + (precision,)] - bf16)
                weights.append(1 / bf16)
                labels.append((shape, cached, bf16))
        saving, activation, weight, launch = least_squares(rows, targets, weights)
        print(f"{recipe}: {{.saving = {saving:.3f}, .activation = {activation:.3f}, .weight = {weight:.3f}, "
              f".launch = {launch:.2f}}}")
        for (shape, cached, bf16), row, target in zip(labels, rows, targets):
            predicted = sum(c * x for c, x in zip((saving, activation, weight, launch), row))
            print(f"  {str(shape):34} {'cached' if cached else '      '}  measured {1 + target / bf16:.3f}"
                  f"  predicted {1 + predicted / bf16:.3f}")


if __name__ == "__main__":
    main()
