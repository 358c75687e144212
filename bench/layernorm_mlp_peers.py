#!/usr/bin/env python3
"""The layernorm_mlp node against its peers on one GPU: a markdown table (stdout) and, with --png, a chart.

usage: layernorm_mlp_peers.py <tapegrad_bench gpu_layernorm_mlp JSON lines> <peer JSON lines> [--png F]
                              [--gemm autotuned|heuristic]

Both files come from the same run on the same GPU (issue 5's rule); the peer lines are peer_bench.py's, followed by
peer_jax_with_y.py's where it ran. The peers time forward + backward of the same block; the table sets tapegrad's
forward + backward beside them, as milliseconds, as a ratio to JAX jit (to "jax_jit_y", JAX's step that also returns
y, where present: peer_bench.py's "jax_jit" drops y and with it a GEMM), as TFLOP/s on the GEMM flops, and peak
extra memory against PyTorch eager's. --gemm picks which of tapegrad's runs
(GEMM algorithms autotuned, the default, or cuBLASLt's heuristic choice; lines without the field count as heuristic).
"""
import json
import sys

PEERS = ["gemm_floor", "torch_eager", "torch_compile", "jax_jit", "jax_jit_y"]


def read(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def mib(x):
    """MiB with one decimal below 10 (small configs differ by fractions), whole above."""
    return f"{x:.1f}" if x < 10 else f"{x:.0f}"


def main(argv):
    options = {"--png": None, "--gemm": "autotuned"}
    for flag in options:
        if flag in argv:
            i = argv.index(flag)
            options[flag] = argv[i + 1]
            argv = argv[:i] + argv[i + 2:]
    png = options["--png"]
    ours = [r for r in read(argv[0]) if r.get("group") == "gpu_layernorm_mlp" and "config" in r
            and r.get("gemm", "heuristic") == options["--gemm"]]
    peers = [r for r in read(argv[1]) if "median_ms" in r]
    configs = [r["config"] for r in ours if r["mode"] == "forward_backward"]
    peer_ms = {(r["config"], r["system"]): r for r in peers}
    mine = {(r["config"], r["mode"]): r for r in ours}
    jax_system = "jax_jit_y" if any(r["system"] == "jax_jit_y" for r in peers) else "jax_jit"
    shown = [p for p in PEERS if any(r["system"] == p for r in peers)]

    print("| config (M, H, F, block) | tapegrad fwd / bwd / fwd+bwd ms | fwd+bwd as a CUDA graph ms | "
          + " | ".join(f"{p} ms" for p in shown)
          + f" | tapegrad / {jax_system} (graph) | TFLOP/s | peak extra MiB: tapegrad / torch eager (ratio) |")
    print("|" + "---|" * (6 + len(shown)))
    for c in configs:
        both = mine[(c, "forward_backward")]
        fwd, bwd = mine[(c, "forward")], mine[(c, "backward")]
        cells = [f"{c} ({both['M']:.0f}, {both['H']:.0f}, {both['F']:.0f}, {both['kind']})",
                 f"{fwd['median_ms']:.3f} / {bwd['median_ms']:.3f} / {both['median_ms']:.3f}"]
        graph = mine.get((c, "forward_backward_graph"))
        cells.append(f"{graph['median_ms']:.3f}" if graph else "—")
        cells += [f"{peer_ms[(c, p)]['median_ms']:.3f}" if (c, p) in peer_ms else "—" for p in shown]
        jax = peer_ms.get((c, jax_system))
        ratio = f"{both['median_ms'] / jax['median_ms']:.2f}" if jax else "—"
        if jax and graph:
            ratio += f" ({graph['median_ms'] / jax['median_ms']:.2f})"
        cells.append(ratio)
        cells.append(f"{both['tflops']:.0f}")
        eager = peer_ms.get((c, "torch_eager"))
        ours_mib = both['peak_extra_mib']
        cells.append(f"{mib(ours_mib)} / {mib(eager['peak_extra_mib'])} ({ours_mib / eager['peak_extra_mib']:.2f})"
                     if eager else "—")
        print("| " + " | ".join(cells) + " |")

    if png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        systems = ["tapegrad"] + shown
        configs = [c for c in configs if (c, jax_system) in peer_ms]  # a bar needs JAX's time to divide by
        fig, ax = plt.subplots(figsize=(9, 4))
        width = 0.8 / len(systems)
        for k, s in enumerate(systems):
            ratios = []
            for c in configs:
                jax = peer_ms.get((c, jax_system))
                ms = mine[(c, "forward_backward")]["median_ms"] if s == "tapegrad" else \
                    peer_ms.get((c, s), {}).get("median_ms")
                ratios.append(ms / jax["median_ms"] if jax and ms else 0)
            ax.bar([i + k * width for i in range(len(configs))], ratios, width, label=s)
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xticks([i + width * (len(systems) - 1) / 2 for i in range(len(configs))], configs)
        ax.set_ylabel(f"forward + backward time / {jax_system}")
        ax.set_title("layernorm_mlp, bf16, one GPU (lower is faster)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(png, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1:])
