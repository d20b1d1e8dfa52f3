#!/usr/bin/env python3
"""Writes tests/data/gpt_reference.ckpt: a small GPT computed by PyTorch, the outside oracle
that model/reference_test.cc checks Tandem against.

The model is Tandem's GPT (pre-LayerNorm GPT-2 blocks, tanh GELU, learned positions, an
untied output head, mean cross-entropy over every token) built from plain PyTorch ops with
random weights. The fixture holds the weights, a fixed batch, the logits, the loss, every
parameter's gradient, and the losses of three AdamW steps, in Tandem's checkpoint format
(model/checkpoint.h), so the test needs no PyTorch.

Needs PyTorch and numpy, installed by hand (`pip install torch numpy`); CI does not run it.
Usage: tools/make_reference.py [--out tests/data/gpt_reference.ckpt]
"""
import argparse
import math
import struct

import torch
import torch.nn.functional as F

# The fixture's model and training settings (also written into its metadata).
N_LAYER, N_HEAD, D_MODEL, SEQ, VOCAB, BATCH = 2, 4, 32, 16, 64, 4
LR, BETA1, BETA2, EPS, WD = 1e-2, 0.9, 0.95, 1e-8, 0.1


def param_specs():
    C, V, T = D_MODEL, VOCAB, SEQ
    specs = [("embed.wte", (V, C)), ("embed.wpe", (T, C))]
    for l in range(N_LAYER):
        h = f"h{l}"
        specs += [(f"{h}.ln1.weight", (C,)), (f"{h}.ln1.bias", (C,)),
                  (f"{h}.attn.qkv.weight", (3 * C, C)), (f"{h}.attn.qkv.bias", (3 * C,)),
                  (f"{h}.attn.proj.weight", (C, C)), (f"{h}.attn.proj.bias", (C,)),
                  (f"{h}.ln2.weight", (C,)), (f"{h}.ln2.bias", (C,)),
                  (f"{h}.mlp.fc.weight", (4 * C, C)), (f"{h}.mlp.fc.bias", (4 * C,)),
                  (f"{h}.mlp.proj.weight", (C, 4 * C)), (f"{h}.mlp.proj.bias", (C,))]
    specs += [("head.ln.weight", (C,)), ("head.ln.bias", (C,)), ("head.weight", (V, C))]
    return specs


def init_params(gen):
    params = {}
    for name, shape in param_specs():
        if name.endswith("ln1.weight") or name.endswith("ln2.weight") or name == "head.ln.weight":
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen, dtype=torch.float64)
        elif name.endswith(".bias"):
            t = 0.02 * torch.randn(shape, generator=gen, dtype=torch.float64)
        else:
            t = 0.05 * torch.randn(shape, generator=gen, dtype=torch.float64)
        params[name] = t.float().requires_grad_(True)
    return params


def forward(p, tokens):
    B, T = tokens.shape
    C, NH = D_MODEL, N_HEAD
    hs = C // NH
    x = p["embed.wte"][tokens] + p["embed.wpe"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(N_LAYER):
        h = f"h{l}"
        ln1 = F.layer_norm(x, (C,), p[f"{h}.ln1.weight"], p[f"{h}.ln1.bias"], eps=1e-5)
        qkv = ln1 @ p[f"{h}.attn.qkv.weight"].T + p[f"{h}.attn.qkv.bias"]
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p[f"{h}.attn.proj.weight"].T + p[f"{h}.attn.proj.bias"]
        ln2 = F.layer_norm(x, (C,), p[f"{h}.ln2.weight"], p[f"{h}.ln2.bias"], eps=1e-5)
        fc = F.gelu(ln2 @ p[f"{h}.mlp.fc.weight"].T + p[f"{h}.mlp.fc.bias"], approximate="tanh")
        x = x + fc @ p[f"{h}.mlp.proj.weight"].T + p[f"{h}.mlp.proj.bias"]
    x = F.layer_norm(x, (C,), p["head.ln.weight"], p["head.ln.bias"], eps=1e-5)
    return x @ p["head.weight"].T  # (B, T, V)


def fnv1a(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def write_checkpoint(path, arrays, meta):
    """Tandem's checkpoint format: see model/checkpoint.h."""
    body = bytearray(b"TANDEMCK") + struct.pack("<II", 1, len(arrays))
    for name, values in arrays:
        flat = [float(v) for v in values]
        body += struct.pack("<I", len(name)) + name.encode() + struct.pack("<Q", len(flat))
        body += struct.pack(f"<{len(flat)}f", *flat)
    text = "".join(f"{k}={v}\n" for k, v in sorted(meta.items())).encode()
    body += struct.pack("<I", len(text)) + text
    body += struct.pack("<Q", fnv1a(body)) + b"TANDEMEND"
    with open(path, "wb") as f:
        f.write(body)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/data/gpt_reference.ckpt")
    args = ap.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    params = init_params(gen)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    targets = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    arrays = [("tokens", tokens.flatten().tolist()), ("targets", targets.flatten().tolist())]
    arrays += [(f"param/{n}", params[n].detach().flatten().tolist()) for n, _ in param_specs()]

    logits = forward(params, tokens)
    loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
    loss.backward()
    arrays.append(("logits", logits.detach().flatten().tolist()))
    arrays.append(("loss", [loss.item()]))
    arrays += [(f"grad/{n}", params[n].grad.flatten().tolist()) for n, _ in param_specs()]

    opt = torch.optim.AdamW(params.values(), lr=LR, betas=(BETA1, BETA2), eps=EPS,
                            weight_decay=WD)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = F.cross_entropy(forward(params, tokens).view(-1, VOCAB), targets.view(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    arrays.append(("adamw_losses", losses))
    meta = {"n_layer": N_LAYER, "n_head": N_HEAD, "d_model": D_MODEL, "seq_len": SEQ,
            "vocab": VOCAB, "batch": BATCH, "lr": LR, "beta1": BETA1, "beta2": BETA2,
            "eps": EPS, "weight_decay": WD, "torch": torch.__version__}
    write_checkpoint(args.out, arrays, meta)
    print(f"wrote {args.out}: loss {losses[0]:.6f}, AdamW losses {losses}")


if __name__ == "__main__":
    main()
