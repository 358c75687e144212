#!/usr/bin/env python3
"""The layernorm_mlp node against its peers on one GPU: a markdown table (stdout) and, with --png, a chart.

usage: layernorm_mlp_peers.py <tapegrad_bench gpu_layernorm_mlp JSON lines> <peer JSON lines>... [--png F]
                              [--fp8-png F] [--gemm autotuned|heuristic]

Both files come from the same run on the same GPU; the peer lines are bench/peer_bench.py's, followed by
peer_jax_with_y.py's where it ran. The peers time forward + backward of the same block; the table sets tapegrad's
forward + backward beside them, as milliseconds, as a ratio to JAX jit (to "jax_jit_y", JAX's step that also returns
y, where present: an earlier peer_bench.py's "jax_jit" dropped y and with it a GEMM), as TFLOP/s on the GEMM flops,
and peak extra memory against PyTorch eager's. --gemm picks which of tapegrad's runs
(GEMM algorithms autotuned, the default, or cuBLASLt's heuristic choice; lines without the field count as heuristic).

Where tapegrad's lines include fp8 runs ("precision" other than bf16; lines without the field are bf16), a second
table sets each recipe's step beside tapegrad's bf16 step, the six FP8 GEMMs alone (fp8_gemm_floor.py's
"gemms_fp8") and PyTorch eager with FP8 GEMMs (peer_torch_fp8.py's "torch_fp8_eager"), from the peer files given;
--fp8-png charts each as a fraction of tapegrad's bf16 step.
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
    options = {"--png": None, "--fp8-png": None, "--gemm": "autotuned"}
    for flag in options:
        if flag in argv:
            i = argv.index(flag)
            options[flag] = argv[i + 1]
            argv = argv[:i] + argv[i + 2:]
    png = options["--png"]
    runs = [r for r in read(argv[0]) if r.get("group") == "gpu_layernorm_mlp" and "config" in r
            and r.get("gemm", "heuristic") == options["--gemm"]]
    ours = [r for r in runs if r.get("precision", "bf16") == "bf16"]
    peers = [r for path in argv[1:] for r in read(path) if "median_ms" in r]
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

    fp8_table(runs, peer_ms)
    if options["--fp8-png"]:
        fp8_chart(runs, peer_ms, options["--fp8-png"])

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


def fp8_table(runs, peer_ms):
    recipes = sorted({r["precision"] for r in runs if r.get("precision", "bf16") != "bf16"})
    if not recipes:
        return
    step = {(r["config"], r.get("precision", "bf16"), r["mode"]): r for r in runs}
    configs = [r["config"] for r in runs if r["mode"] == "forward_backward" and r.get("precision", "bf16") == "bf16"]
    print()
    print("| config | bf16 fwd+bwd ms (graph) | "
          + " | ".join(f"{p} ms (graph), / bf16" for p in recipes)
          + " | six fp8 GEMMs ms (torch) | " + " | ".join(f"{p} / six fp8 GEMMs" for p in recipes)
          + " | torch_fp8_eager ms | peak extra MiB: bf16 / " + " / ".join(recipes) + " |")
    print("|" + "---|" * (4 + 2 * len(recipes) + 1))

    def timed(c, p):
        both, graph = step.get((c, p, "forward_backward")), step.get((c, p, "forward_backward_graph"))
        text = f"{both['median_ms']:.3f}" if both else "—"
        return text + (f" ({graph['median_ms']:.3f})" if graph else "")

    for c in configs:
        bf16 = step[(c, "bf16", "forward_backward")]
        cells = [c, timed(c, "bf16")]
        for p in recipes:
            r = step.get((c, p, "forward_backward"))
            cells.append(timed(c, p) + (f", {r['median_ms'] / bf16['median_ms']:.2f}" if r else ""))
        floor = peer_ms.get((c, "gemms_fp8"))
        cells.append(f"{floor['median_ms']:.3f}" if floor else "—")
        for p in recipes:
            r = step.get((c, p, "forward_backward"))
            cells.append(f"{r['median_ms'] / floor['median_ms']:.2f}" if r and floor else "—")
        eager = peer_ms.get((c, "torch_fp8_eager"))
        cells.append(f"{eager['median_ms']:.3f}" if eager else "—")
        mibs = [mib(bf16["peak_extra_mib"])]
        for p in recipes:
            r = step.get((c, p, "forward_backward"))
            ratio = r["peak_extra_mib"] / bf16["peak_extra_mib"] if r else 0
            mibs.append(f"{mib(r['peak_extra_mib'])} ({ratio:.2f})" if r else "—")
        cells.append(" / ".join(mibs))
        print("| " + " | ".join(cells) + " |")


def fp8_chart(runs, peer_ms, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    step = {(r["config"], r.get("precision", "bf16")): r["median_ms"] for r in runs if r["mode"] == "forward_backward"}
    configs = [c for (c, p) in step if p == "bf16"]
    recipes = sorted({p for (_, p) in step if p != "bf16"})
    bars = [(f"tapegrad {p}", lambda c, p=p: step.get((c, p))) for p in recipes]
    bars += [(name, lambda c, s=system: peer_ms.get((c, s), {}).get("median_ms"))
             for name, system in (("six fp8 GEMMs (torch)", "gemms_fp8"), ("PyTorch eager fp8", "torch_fp8_eager"))]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(bars)
    for k, (name, ms) in enumerate(bars):
        ax.bar([i + k * width for i in range(len(configs))],
               [(ms(c) or 0) / step[(c, "bf16")] for c in configs], width, label=name)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks([i + width * (len(bars) - 1) / 2 for i in range(len(configs))], configs)
    ax.set_ylabel("forward + backward time / tapegrad bf16")
    ax.set_title("layernorm_mlp in fp8, one GPU (lower is faster)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1:])
