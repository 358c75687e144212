#!/usr/bin/env python3
"""Turns tapegrad_bench's JSON lines (stdin) into the markdown tables of RESULTS.md (stdout)."""
import json
import sys
from collections import defaultdict

rows = [json.loads(line) for line in sys.stdin if line.startswith("{")]
by_group = defaultdict(list)
for r in rows:
    by_group[r["group"]].append(r)


def table(header, lines):
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for line in lines:
        print("| " + " | ".join(str(x) for x in line) + " |")
    print()


for meta in by_group["meta"]:
    print(f"threads {meta['threads']}, OPENBLAS_CORETYPE={meta['OPENBLAS_CORETYPE']}, "
          f"OPENBLAS_L2_SIZE={meta['OPENBLAS_L2_SIZE']}, blas_min_work={int(meta['blas_min_work'])}\n")

if by_group["tape_overhead"]:
    cells = defaultdict(dict)
    for r in by_group["tape_overhead"]:
        cells[(r["op"], r["dtype"], r["shape"][0])][r["mode"]] = r["ns_per_node"]
    modes = ["raw_tensor", "no_grad", "recorded_forward", "recorded_forward_backward"]
    table(["op", "dtype", "numel"] + [f"{m} ns/node" for m in modes] + ["recording ns/node"],
          [[*key, *(f"{c[m]:.0f}" for m in modes), f"{c['recorded_forward'] - c['no_grad']:.0f}"]
           for key, c in cells.items()])

if by_group["fusion"]:
    cells = defaultdict(dict)
    for r in by_group["fusion"]:
        cells[(r["expression"], r["form"])][r["mode"]] = r["median_ns"] / 1e6
    for r in by_group["fusion_memory"]:
        cells[(r["expression"], r["form"])].update(r)
    mb = 1 / (1 << 20)
    table(["expression", "form", "no_grad ms", "recorded fwd ms", "recorded fwd+bwd ms", "held after fwd MiB",
           "saved beyond output MiB"],
          [[*key, f"{c['no_grad']:.2f}", f"{c['recorded_forward']:.2f}", f"{c['recorded_forward_backward']:.2f}",
            f"{c['held_after_forward_bytes'] * mb:.1f}", f"{round(c['saved_beyond_output_bytes'] * mb, 1) + 0.0:.1f}"]  # + 0.0: no "-0.0"
           for key, c in cells.items()])

if by_group["matmul"]:
    cells = defaultdict(dict)
    for r in by_group["matmul"]:
        cells[(f"{r['a'][0]}x{r['a'][1]} · {r['b'][0]}x{r['b'][1]}", r["dtype"])][r["impl"]] = r["gflops"]
    impls = ["openblas", "tapegrad_matmul", "tapegrad_gemm_eigen_path", "eigen_contraction"]
    table(["product", "dtype"] + [f"{i} GFLOP/s" for i in impls] + ["tapegrad / openblas"],
          [[*key, *(f"{c[i]:.1f}" if i in c else "-" for i in impls),
            f"{c['tapegrad_matmul'] / c['openblas']:.2f}" if "openblas" in c else "-"]
           for key, c in cells.items()])

if by_group["layernorm_mlp"]:
    cells = defaultdict(dict)
    for r in by_group["layernorm_mlp"]:
        m, h, f = r["mhf"]
        cells[(f"({m}, {h}, {f})", r["dtype"], r["activation"])][(r["form"], r["mode"])] = r["median_ns"] / 1e6
    fwd, grad = "no_grad", "recorded_forward_backward"
    table(["(M, H, F)", "dtype", "activation", "node fwd ms", "node fwd+bwd ms", "composite fwd ms",
           "composite fwd+bwd ms", "speed-up fwd", "speed-up fwd+bwd", "node grad/fwd", "composite grad/fwd"],
          [[*key, f"{c['node', fwd]:.3f}", f"{c['node', grad]:.3f}", f"{c['composite', fwd]:.3f}",
            f"{c['composite', grad]:.3f}", f"{c['composite', fwd] / c['node', fwd]:.2f}x",
            f"{c['composite', grad] / c['node', grad]:.2f}x", f"{c['node', grad] / c['node', fwd]:.2f}",
            f"{c['composite', grad] / c['composite', fwd]:.2f}"]
           for key, c in cells.items()])

if by_group["layernorm_mlp_memory"]:
    cells = defaultdict(dict)
    for r in by_group["layernorm_mlp_memory"]:
        m, h, f = r["mhf"]
        cells[(f"({m}, {h}, {f})", r["dtype"], r["activation"])][r["form"]] = r["saved_bytes"] / r["x_bytes"]
    forms = ["node save_all", "node recompute_norm", "node recompute_all", "composite"]
    table(["(M, H, F)", "dtype", "activation"] + [f"{f} (× x)" for f in forms],
          [[*key, *(f"{c[f]:.2f}" for f in forms)] for key, c in cells.items()])

if by_group["attention"]:
    cells = defaultdict(dict)
    for r in by_group["attention"]:
        b, s, hq, hkv, d = r["b_s_hq_hkv_d"]
        cells[(f"({b}, {s}, {hq}/{hkv}, {d})", "causal" if r["causal"] else "full", r["dtype"])][r["mode"]] = r
    modes = ["forward", "forward_backward"]
    table(["(B, S, Hq/Hkv, D)", "mask", "dtype"] + [f"{m} ms" for m in modes] + [f"{m} GFLOP/s" for m in modes],
          [[*key, *(f"{c[m]['median_ns'] / 1e6:.2f}" for m in modes), *(f"{c[m]['gflops']:.1f}" for m in modes)]
           for key, c in cells.items()])

if by_group["attention_memory"]:
    mb = 1 / (1 << 20)
    table(["(B, S, H, D)", "peak extra MiB", "bytes per token", "one S × S f32 matrix MiB"],
          [[str(tuple(r["b_s_hq_hkv_d"][:3] + r["b_s_hq_hkv_d"][4:])), f"{r['peak_extra_bytes'] * mb:.2f}",
            f"{r['peak_extra_bytes_per_token']:.0f}", f"{r['one_s_by_s_matrix_bytes'] * mb:.0f}"]
           for r in by_group["attention_memory"]])
