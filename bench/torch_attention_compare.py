"""PyTorch side of `megaton bench --attention --json` on a GPU: times torch's
scaled_dot_product_attention (causal) on the same shapes and dtype on the same device, once per SDPA
backend that takes them (FlashAttention-2, cuDNN, memory-efficient), and prints Megaton's TFLOP/s,
each backend's and the ratio to the best of them, per pass.

    megaton bench --attention --device cuda --dtype bf16 --model llama3-8b --batch 2 --seq-len 4096 --json \
        | python3 bench/torch_attention_compare.py

FLOPs as Megaton counts them (FlashAttention's convention): forward 4 B H T^2 D / 2 (causal), backward
2.5 times that. Timing matches Megaton's: batches of 10 back-to-back calls closed by a device
synchronize, one warm-up batch, median of 10. GQA runs with enable_gqa where torch has it, else with
k / v repeated to the query heads beforehand (outside the timing). Backward is torch.autograd.grad of
the output (no gradient accumulation), the forward's graph kept.
"""
import contextlib
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

CALLS = 10


def median_seconds(fn, repeats=10):
    times = []
    for r in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
        if r > 0:
            times.append((time.perf_counter() - t0) / CALLS)
    return statistics.median(times)


def backends():
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return [("default", None)]
    named = [("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION")]
    return [(n, (sdpa_kernel, getattr(SDPBackend, b))) for n, b in named if hasattr(SDPBackend, b)]


def sdpa_times(cfg, dtype, dev):
    B, T, Hq, Hkv, Dqk, Dv = (cfg[k] for k in ("batch", "seq_len", "heads", "kv_heads", "head_dim_qk", "head_dim_v"))
    g = torch.Generator(device=dev).manual_seed(1)
    rnd = lambda *s: (torch.rand(*s, device=dev, generator=g) * 2 - 1).to(dtype).requires_grad_()
    q, k, v = rnd(B, Hq, T, Dqk), rnd(B, Hkv, T, Dqk), rnd(B, Hkv, T, Dv)
    dout = (torch.rand(B, Hq, T, Dv, device=dev, generator=g) * 2 - 1).to(dtype)
    kwargs = {"is_causal": True}
    if Hkv != Hq:
        try:
            F.scaled_dot_product_attention(q[:, :, :8], k[:, :, :8], v[:, :, :8], is_causal=True, enable_gqa=True)
            kwargs["enable_gqa"] = True
        except TypeError:
            k = k.detach().repeat_interleave(Hq // Hkv, dim=1).requires_grad_()
            v = v.detach().repeat_interleave(Hq // Hkv, dim=1).requires_grad_()
    results = {}
    for name, ctx in backends():
        try:
            with ctx[0](ctx[1]) if ctx else contextlib.nullcontext():
                fwd = median_seconds(lambda: F.scaled_dot_product_attention(q, k, v, **kwargs))
                out = F.scaled_dot_product_attention(q, k, v, **kwargs)
                bwd = median_seconds(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
            results[name] = {"forward": fwd, "backward": bwd}
        except RuntimeError as e:  # this backend does not take the shape or dtype
            print(f"  sdpa {name}: not available ({str(e).splitlines()[0][:80]})", file=sys.stderr)
    return results


def main():
    rows = [json.loads(line) for line in sys.stdin if line.startswith("{")]
    if not rows:
        sys.exit("torch_attention_compare: no JSON lines on stdin (run megaton bench --attention ... --json)")
    dtypes = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    cfg = rows[0]
    times = sdpa_times(cfg, dtypes[cfg["dtype"]], torch.device(cfg["device"]))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; {cfg['model']} {cfg['dtype']} B {cfg['batch']} "
          f"T {cfg['seq_len']} heads {cfg['heads']}/{cfg['kv_heads']} D {cfg['head_dim_qk']}/{cfg['head_dim_v']}")
    names = list(times)
    print(f"{'pass':<9} {'megaton TF/s':>12} " + " ".join(f"{n + ' TF/s':>14}" for n in names) + f" {'ratio to best':>13}")
    for r in rows:
        flops = r["tflops"] * r["seconds"]
        theirs = [flops / times[n][r["pass"]] for n in names]
        best = max(theirs) if theirs else float("nan")
        print(f"{r['pass']:<9} {r['tflops']:>12.1f} " + " ".join(f"{t:>14.1f}" for t in theirs) +
              f" {r['tflops'] / best:>13.2f}")


if __name__ == "__main__":
    main()
