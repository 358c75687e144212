#!/usr/bin/env python3
"""PyTorch's tensor parallelism on the LayerNorm-MLP block, the peer of tapegrad_gpu_dist_bench (issue 28): the same
math and shapes in bf16 (LN + GELU(tanh) with biases; RMSNorm + SwiGLU without), forward + backward from a fixed
seed gradient, one process per GPU:
  unsharded  the plain module (run with one process)
  tp         torch.distributed.tensor.parallel: fc1 (gate, up) ColwiseParallel, fc2 RowwiseParallel
  tp_sp      + SequenceParallel on the norm (x, y sharded over rows: fc1's input all-gathered, fc2's output
             reduce-scattered)
  dp         DistributedDataParallel, each process M / p rows
Each rank times its steps with CUDA events (median after warm-up); rank 0 prints one JSON line per (config, mode)
with the slowest rank's median.

  python3 -m torch.distributed.run --nproc_per_node=P bench/peer_torch_tp.py [--steps N] [--quick]
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                               parallelize_module)
from torch.nn.parallel import DistributedDataParallel

CONFIGS = [("gpt_4k", 8192, 4096, 16384, "ln_gelu"), ("llama_4k", 8192, 4096, 11008, "rms_swiglu")]


class Block(nn.Module):
    def __init__(self, H, Fdim, kind):
        super().__init__()
        self.gelu = kind == "ln_gelu"
        self.norm = nn.LayerNorm(H, eps=1e-5) if self.gelu else nn.RMSNorm(H, eps=1e-5)
        if self.gelu:
            self.fc1 = nn.Linear(H, Fdim)
        else:
            self.gate = nn.Linear(H, Fdim, bias=False)
            self.up = nn.Linear(H, Fdim, bias=False)
        self.fc2 = nn.Linear(Fdim, H, bias=self.gelu)

    def forward(self, x):
        h = self.norm(x)
        a = F.gelu(self.fc1(h), approximate="tanh") if self.gelu else F.silu(self.gate(h)) * self.up(h)
        return self.fc2(a)


def plan(block, sequence):
    cols = ["fc1"] if block.gelu else ["gate", "up"]
    p = {c: ColwiseParallel(input_layouts=Shard(0)) if sequence else ColwiseParallel() for c in cols}
    p["fc2"] = RowwiseParallel(output_layouts=Shard(0)) if sequence else RowwiseParallel()
    if sequence:
        p["norm"] = SequenceParallel(sequence_dim=0)
    return p


def median_ms(step, steps):
    for _ in range(3):
        step()
    marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
    for start, stop in marks:
        start.record()
        step()
        stop.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(stop) for start, stop in marks)
    return times[len(times) // 2]


def main():
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 20
    configs = [("small", 1024, 256, 1024, "ln_gelu")] if "--quick" in sys.argv else CONFIGS
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (world,))
    modes = ["unsharded"] if world == 1 else ["tp", "tp_sp", "dp"]
    for name, M, H, Fdim, kind in configs:
        for mode in modes:
            torch.manual_seed(7)
            block = Block(H, Fdim, kind).cuda().to(torch.bfloat16)
            rows = M // world if mode in ("tp_sp", "dp") else M
            if mode in ("tp", "tp_sp"):
                block = parallelize_module(block, mesh, plan(block, mode == "tp_sp"))
            elif mode == "dp":
                block = DistributedDataParallel(block)
            torch.manual_seed(100 + rank)
            x = torch.randn(rows, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            dy = torch.randn(rows, H, device="cuda", dtype=torch.bfloat16)

            def step():
                y = block(x)
                y.backward(dy)
                x.grad = None
                for p in block.parameters():
                    p.grad = None

            ms = torch.tensor([median_ms(step, steps)], device="cuda")
            dist.all_reduce(ms, op=dist.ReduceOp.MAX)
            if rank == 0:
                print(json.dumps({"system": "torch", "config": name, "M_H_F": [M, H, Fdim], "kind": kind,
                                  "mode": mode, "gpus": world, "median_ms": ms.item()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
