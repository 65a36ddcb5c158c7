"""Independent PyTorch (float64, autograd) reference for Megaton's MoE layer (tests/nn/moe_layer_test.cpp).

Written from the published definitions, not from Megaton's code: the router of Megatron-Core's
TopKRouter / DeepSeek-V3's MoEGate (softmax or sigmoid scores, a selection-only expert bias, group-
limited top-k where a group scores the sum of its top-2, norm_topk_prob, routed scaling), Megatron's
switch_load_balancing_loss_func and DeepSeek-V3's sequence-wise balance loss, the router z-loss
(ST-MoE), token dropping by probs with capacity ceil(N * K / E * factor), SwiGLU experts, and a
shared expert. The C++ test saves the layer's weights, input, output gradient dy, and its results;
this script recomputes y, the losses and the gradients of sum(y * dy) + losses, and exits non-zero
naming the first quantity that differs (relative to its largest magnitude: 1e-5 for the output and
losses, 1e-4 for gradients; NaN / Inf fail).

Usage: /usr/bin/python3 moe_reference.py DIR --B 2 --T 5 --E 4 --K 2 [--score sigmoid] ...
"""
import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch


def load(d: Path, name: str, grad=False):
    p = d / f"{name}.npy"
    if not p.exists():
        return None
    t = torch.from_numpy(np.load(p).astype(np.float64))
    return t.requires_grad_(grad)


def swiglu(x, w1, w2):
    gate, up = (x @ w1.T).chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up) @ w2.T


def route(logits, bias, a):
    """Top-k expert indices [N, K] and weights [N, K] of every token."""
    n, e = logits.shape
    if a.score == "sigmoid":
        scores = torch.sigmoid(logits)
    elif a.pre_softmax:
        scores = torch.softmax(logits, dim=-1)
    else:
        scores = logits
    choice = scores.detach() + (bias if bias is not None else 0.0)
    if a.groups > 1:
        group_scores = choice.view(n, a.groups, -1).topk(2, dim=-1).values.sum(dim=-1)
        keep_groups = group_scores.topk(a.topk_groups, dim=-1).indices
        group_mask = torch.zeros(n, a.groups, dtype=torch.bool).scatter_(1, keep_groups, True)
        expert_mask = group_mask.repeat_interleave(e // a.groups, dim=1)
        choice = choice.masked_fill(~expert_mask, float("-inf"))
    idx = choice.topk(a.K, dim=-1).indices
    if a.score == "softmax" and not a.pre_softmax:
        w = torch.softmax(logits.gather(1, idx), dim=-1)
    else:
        w = scores.gather(1, idx)
    if a.norm_topk:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return idx, w * a.scaling


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    for k in ("B", "T", "E", "K"):
        ap.add_argument(f"--{k}", type=int, required=True)
    ap.add_argument("--score", default="softmax")
    ap.add_argument("--pre-softmax", dest="pre_softmax", type=int, default=1)
    ap.add_argument("--norm-topk", dest="norm_topk", type=int, default=0)
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--topk-groups", dest="topk_groups", type=int, default=1)
    ap.add_argument("--scaling", type=float, default=1.0)
    ap.add_argument("--aux", default="none")
    ap.add_argument("--aux-coeff", dest="aux_coeff", type=float, default=0.0)
    ap.add_argument("--z-coeff", dest="z_coeff", type=float, default=0.0)
    ap.add_argument("--capacity", type=float, default=0.0)
    a = ap.parse_args()
    d = Path(a.dir)
    torch.set_default_dtype(torch.float64)

    x = load(d, "x", True)
    dy = load(d, "dy")
    wr = load(d, "mlp.router.weight", True)
    bias = load(d, "mlp.router.expert_bias")
    w1 = load(d, "mlp.experts.linear_fc1.weight", True)
    w2 = load(d, "mlp.experts.linear_fc2.weight", True)
    s1 = load(d, "mlp.shared_experts.linear_fc1.weight", True)
    s2 = load(d, "mlp.shared_experts.linear_fc2.weight", True)
    n, c = x.shape
    E, K = a.E, a.K

    logits = x @ wr.T
    idx, w = route(logits, bias, a)
    routing_map = torch.zeros(n, E, dtype=torch.bool).scatter_(1, idx, True)
    selected = routing_map.sum(dim=0)
    keep = routing_map.clone()
    if a.capacity > 0:
        capacity = math.ceil(n * K / E * a.capacity)
        probs_map = torch.zeros(n, E).scatter(1, idx, w.detach())
        top = probs_map.topk(capacity, dim=0).indices
        keep &= torch.zeros(n, E, dtype=torch.bool).scatter_(0, top, True)
    dropped = int(routing_map.sum() - keep.sum())

    f = w1.shape[0] // (2 * E)
    y = torch.zeros(n, c)
    for e in range(E):
        for k in range(K):
            rows = (idx[:, k] == e) & keep[:, e]
            if rows.any():
                out = swiglu(x[rows], w1[2 * f * e:2 * f * (e + 1)], w2[c * e:c * (e + 1)])
                y = y.index_add(0, rows.nonzero().squeeze(1), w[rows, k:k + 1] * out)
    if s1 is not None:
        y = y + swiglu(x, s1, s2)

    balance = torch.zeros(())
    if a.aux != "none" and a.aux_coeff > 0:
        if a.score == "sigmoid":
            sig = torch.sigmoid(logits)
            p = sig / (sig.sum(dim=-1, keepdim=True) + 1e-20)
        else:
            p = torch.softmax(logits, dim=-1)
        if a.aux == "aux_loss":  # Megatron's switch_load_balancing_loss_func
            balance = torch.sum(p.sum(dim=0) * selected) * (E * a.aux_coeff / (n * n * K))
        else:  # DeepSeek-V3: per sequence, f_i = E / (K T) count_i, P_i = mean_t p_i,t; mean over sequences
            T = a.T
            per_seq = []
            for b in range(n // T):
                f_i = routing_map[b * T:(b + 1) * T].sum(dim=0) * (E / (K * T))
                per_seq.append(a.aux_coeff * torch.sum(f_i * p[b * T:(b + 1) * T].mean(dim=0)))
            balance = torch.stack(per_seq).mean()
    z = a.z_coeff * torch.logsumexp(logits, dim=-1).square().mean() if a.z_coeff > 0 else torch.zeros(())

    total = (y * dy).sum() + balance + z
    total.backward()

    stats = (d / "stats.txt").read_text().split()
    failures = []

    def compare(name, got, want, tol):
        got = np.asarray(got, dtype=np.float64).ravel()
        want = np.asarray(want, dtype=np.float64).ravel()
        if got.shape != want.shape:
            failures.append(f"{name}: shape {got.shape} vs reference {want.shape}")
            return
        if not (np.all(np.isfinite(got)) and np.all(np.isfinite(want))):
            failures.append(f"{name}: non-finite values")
            return
        scale = max(np.abs(want).max(), 1e-30)
        err = np.abs(got - want).max() / scale
        print(f"{name}: relative error {err:.3e} (scale {scale:.3e})")
        if err >= tol:
            failures.append(f"{name}: relative error {err:.3e} >= {tol}")

    def saved(name):
        return np.load(d / f"{name}.npy")

    compare("y", saved("y"), y.detach(), 1e-5)
    if a.aux != "none":
        compare("balance loss", [float(stats[0])], [balance.item()], 1e-5)
    if a.z_coeff > 0:
        compare("z loss", [float(stats[1])], [z.item()], 1e-5)
    if int(stats[2]) != dropped:
        failures.append(f"dropped slots: megaton {stats[2]}, reference {dropped}")
    if float(stats[3]) != float(selected.max()):
        failures.append(f"max expert load: megaton {stats[3]}, reference {int(selected.max())}")
    if a.capacity > 0 and dropped == 0:
        failures.append("the capacity case dropped nothing: it tests nothing")
    compare("dx", saved("dx"), x.grad, 1e-4)
    for name, t in (("mlp.router.weight", wr), ("mlp.experts.linear_fc1.weight", w1),
                    ("mlp.experts.linear_fc2.weight", w2), ("mlp.shared_experts.linear_fc1.weight", s1),
                    ("mlp.shared_experts.linear_fc2.weight", s2)):
        if t is not None:
            compare(name + ".grad", saved(name + ".grad"), t.grad, 1e-4)
    if bias is not None and np.any(saved("mlp.router.expert_bias.grad") != 0):
        failures.append("the expert bias got a gradient")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
