"""PyTorch side of `megaton bench --gemm-shapes --json` on a GPU: times the same linear shapes with
torch (F.linear forward, dgrad dy @ w, wgrad w_grad += dy^T x) in the same dtype on the same device,
and prints Megaton's rate, PyTorch's and their ratio per (linear, pass).

    megaton bench --gemm-shapes --device cuda --dtype bf16 --json | python3 bench/torch_gemm_compare.py

Timing matches Megaton's: batches of 20 back-to-back calls closed by a device synchronize, one
warm-up batch, median of the repeats. Inputs are uniform in [-1, 1), never zeros.
"""
import json
import statistics
import sys
import time

import torch

CALLS = 20


def median_seconds(fn, repeats):
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


def main():
    rows = [json.loads(line) for line in sys.stdin if line.startswith("{")]
    if not rows:
        sys.exit("torch_gemm_compare: no JSON lines on stdin (run megaton bench --gemm-shapes ... --json)")
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16}
    torch.backends.cuda.matmul.allow_tf32 = False  # Megaton's f32 GEMMs are true fp32
    print(f"{'linear':<13} {'pass':<8} {'rows':>6} {'in':>6} {'out':>6} {'megaton TF/s':>12} {'torch TF/s':>10} {'ratio':>6}")
    ratios = []
    for r in rows:
        dev = torch.device(r["device"])
        dt = dtypes[r["dtype"]]
        n, k, m = r["rows"], r["in"], r["out"]
        g = torch.Generator(device=dev).manual_seed(1)
        rnd = lambda *s: (torch.rand(*s, device=dev, generator=g) * 2 - 1).to(dt)
        x, w, dy, dw = rnd(n, k), rnd(m, k), rnd(n, m), rnd(m, k)
        fn = {
            "forward": lambda: torch.nn.functional.linear(x, w),
            "dgrad": lambda: dy @ w,
            "wgrad": lambda: dw.addmm_(dy.t(), x),
        }[r["pass"]]
        tflops = 2.0 * n * k * m / median_seconds(fn, 10) / 1e12
        ours = r["gflops"] / 1e3
        ratios.append(ours / tflops)
        print(f"{r['linear']:<13} {r['pass']:<8} {n:>6} {k:>6} {m:>6} {ours:>12.1f} {tflops:>10.1f} {ours / tflops:>6.2f}")
    print(f"ceiling (Megaton square 8192^3 {rows[0]['dtype']} GEMM): {rows[0]['ceiling_gflops'] / 1e3:.1f} TFLOP/s; "
          f"median megaton/torch ratio {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
