#!/usr/bin/env python3
"""Per-kernel time of the steps in an ncu CSV (`bench/gpu_round.sh ncustep` or `nculayer`), grouped by what the
kernels do, for bench/RESULTS.md's per-kernel tables.

    python3 bench/ncu_kernels.py build-gpu/round/ncu.csv [--kernels]

For each `### <shape ...>` section: the kernels' total and the sum per group in µs, and with --kernels every kernel
in launch order. ncu's lines are gpu__time_duration.sum in ns, one per kernel."""
import argparse
import collections
import csv
import re

# The first pattern a kernel's name matches names its group.
GROUPS = [
    ("GEMMs (cuBLASLt)", r"nvjet|gemm|cutlass|sm90_xmma"),
    ("attention (cuDNN)", r"cudnn|fmha|flash"),
    ("amax", r"amax_kernel"),
    ("quantization", r"quantize_kernel|scale_kernel|delayed_scaling|begin_step|end_step"),
    ("activation", r"activation_kernel|backward_codes_kernel"),
    ("norm", r"norm_"),
    ("column sums", r"sum_partials"),
    ("copies and fills", r"copy|fill_kernel|pad|crop"),
]


def group_of(kernel):
    for name, pattern in GROUPS:
        if re.search(pattern, kernel):
            return name
    return "other"


def sections(path):
    """(section title, [(kernel, µs)]) in file order."""
    title, kernels = None, []
    with open(path) as f:
        for line in f:
            if line.startswith("###"):
                if title is not None:
                    yield title, kernels
                title, kernels = line[3:].strip(), []
            elif line.startswith('"') and not line.startswith('"ID"'):
                row = next(csv.reader([line]))
                if row[12] == "gpu__time_duration.sum":
                    us = float(row[14].replace(",", "")) / (1000 if row[13] == "ns" else 1)
                    kernels.append((row[4], us))
    if title is not None:
        yield title, kernels


def short(kernel):
    kernel = re.sub(r"^void ", "", kernel)
    kernel = re.sub(r"tapegrad::(cuda::)?(<unnamed>::)?", "", kernel)
    return re.sub(r"\(.*", "", kernel)[:90]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv")
    parser.add_argument("--kernels", action="store_true", help="list every kernel too")
    args = parser.parse_args()
    for title, kernels in sections(args.csv):
        sums = collections.Counter()
        for kernel, us in kernels:
            sums[group_of(kernel)] += us
        total = sum(us for _, us in kernels)
        print(f"### {title}: {len(kernels)} kernels, {total:.1f} µs")
        for name, us in sums.most_common():
            print(f"  {name:20} {us:9.1f} µs  {100 * us / total:5.1f} %")
        if args.kernels:
            for kernel, us in kernels:
                print(f"    {us:9.1f}  {short(kernel)}")


if __name__ == "__main__":
    main()
