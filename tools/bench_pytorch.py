#!/usr/bin/env python3
"""The same GPT as Tandem's, trained by PyTorch: on the CPU in one process, and in two
processes with DistributedDataParallel over Gloo, for `bazel run //tools:bench`; on a GPU
(--device cuda --dtype bf16, autocast) for tools/gpu_check.sh. Prints one JSON line per run
with tokens/s (from the median step), to set beside Tandem's figures measured in the same run.

Same model (pre-LayerNorm GPT-2 blocks, tanh GELU, learned positions, the head untied or with
--tie-embeddings the token embedding, as Tandem's gpt2-small), same
sizes, global batch, sequence length and optimizer (AdamW) as Tandem's benchmark; random
tokens; on the CPU float32 with one intra-op thread per process, as Tandem uses one BLAS thread
per worker.

PyTorch is not a dependency of Tandem: install it by hand (`pip install torch numpy`); where
it is absent this prints {"skipped": "..."} and exits 0.
Usage: bench_pytorch.py --n-layer 8 --d-model 128 --n-head 4 --seq-len 64 --batch 16 \
         --steps 20 --procs 1|2
"""
import argparse
import json
import math
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16, help="global batch")
    ap.add_argument("--tie-embeddings", action="store_true",
                    help="the head's weight is the token embedding's (GPT-2's tying)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (one process on cuda:0)")
    ap.add_argument("--dtype", default="f32", help="f32, or bf16 autocast on cuda")
    ap.add_argument("--peak-tflops", type=float, default=0,
                    help="the GPU's dense peak in the dtype, for MFU (0: unknown, no MFU); "
                         "tools/gpu_check.sh passes the one Tandem's runtime/device_peak found")
    args = ap.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError:
        print(json.dumps({"skipped": "PyTorch is not installed (pip install torch numpy)"}))
        return 0
    if args.procs == 1:
        result = run(0, 1, args)
    else:
        import torch.multiprocessing as mp
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        queue = mp.get_context("spawn").SimpleQueue()
        mp.spawn(worker, args=(args, queue), nprocs=args.procs, join=True)
        result = queue.get()
    print(json.dumps(result))
    return 0


def worker(rank, args, queue):
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=args.procs)
    result = run(rank, args.procs, args)
    if rank == 0:
        queue.put(result)
    dist.destroy_process_group()


def run(rank, world, args):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    dev = torch.device(args.device)
    if dev.type == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(1234)
    C, NH, T, V = args.d_model, args.n_head, args.seq_len, args.vocab

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.fc_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B = x.shape[0]
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
            q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.blocks = nn.ModuleList(Block() for _ in range(args.n_layer))
            self.ln, self.head = nn.LayerNorm(C), nn.Linear(C, V, bias=False)
            if args.tie_embeddings:
                self.head.weight = self.wte.weight

        def forward(self, tokens, targets):
            x = self.wte(tokens) + self.wpe(torch.arange(T, device=tokens.device))
            for b in self.blocks:
                x = b(x)
            logits = self.head(self.ln(x))
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    model = GPT().to(dev)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    local = args.batch // world
    gen = torch.Generator().manual_seed(rank)
    times = []
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.dtype == "bf16")
    for step in range(args.steps):
        tokens = torch.randint(0, V, (local, T), generator=gen).to(dev)
        targets = torch.randint(0, V, (local, T), generator=gen).to(dev)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with autocast:
            loss = model(tokens, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    steady = sorted(times[2:]) if len(times) > 3 else sorted(times)
    median = steady[len(steady) // 2]
    params = sum(p.numel() for p in model.parameters())
    # MFU's N: the parameters in matmuls, all but the looked-up embedding tables (tied, the
    # token table is the head's weight: model.parameters() lists it once, and it multiplies).
    net = model.module if world > 1 else model
    looked_up = net.wpe.weight.numel() + (0 if args.tie_embeddings else net.wte.weight.numel())
    matmul_params = params - looked_up
    tps = args.batch * T / median
    return {"framework": "pytorch " + torch.__version__, "procs": world,
            "device": args.device, "dtype": args.dtype, "parameters": params,
            "tokens_per_second": tps, "step_seconds": median,
            "mfu": (6 * matmul_params * tps / (args.peak_tflops * 1e12)
                    if dev.type == "cuda" and args.peak_tflops > 0 else None),
            "loss": float(loss.item()) if math.isfinite(loss.item()) else None}


if __name__ == "__main__":
    sys.exit(main())
