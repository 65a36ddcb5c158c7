#!/usr/bin/python3
"""Serving through HTTP (issue 15): N completion requests sent to `megaton serve` one after another,
then all N at once from N client threads, side by side in one run against one server.

Random Llama weights of the stories110M shape (bench/decode.py's folder), the byte tokenizer,
greedy, each request a different 64-character prompt and max_tokens new tokens. Reported: aggregate
generated tokens/s of each phase and their ratio, mean request latency and time to first token (from
the server's /metrics summaries), the most KV pages in use (polled), errors, and the server's
resident memory before and after the concurrent phase (flat = nothing leaked per request).

  /usr/bin/python3 bench/serve_load.py --megaton build/megaton [--requests 16] [--max-tokens 64]
      [--precision fp32|bf16] [--kv-cache-dtype auto|f32|bf16] [--weights-dtype auto|int8|fp8-block]
      [--threads 2] [--shape 110m]
"""
import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode  # noqa: E402  (the random-weight HF folder)


def post(port, body, timeout=600):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data) if data else {}


def metrics(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    values = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+(?:\{[^}]*\})?) ([0-9.eE+-]+)$", line)
        if m:
            values[m.group(1)] = float(m.group(2))
    return values


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def prompt_of(i):
    words = ["the", "cat", "sat", "on", "a", "mat", "while", "dogs", "ran", "far", "away", "from", "home"]
    text = " ".join(words[(i * 7 + k * 3) % len(words)] for k in range(20))
    return text[:64]


def summary_delta(before, after, name):
    n = after.get(f"{name}_count", 0) - before.get(f"{name}_count", 0)
    s = after.get(f"{name}_sum", 0) - before.get(f"{name}_sum", 0)
    return s / n if n else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megaton", required=True)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "f32", "bf16"])
    ap.add_argument("--weights-dtype", default="auto", choices=["auto", "int8", "fp8-block"],
                    help="serve's --weights-dtype: the weights as stored (auto) or quantised at load")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shape", default="110m", choices=sorted(decode.SHAPES))
    args = ap.parse_args()
    print(subprocess.run([args.megaton, "bench", "--cpu-info", "--threads", str(args.threads)], capture_output=True,
                         text=True).stdout.strip())
    with tempfile.TemporaryDirectory() as work:
        folder = os.path.join(work, args.shape)
        dims = decode.SHAPES[args.shape]
        decode.write_hf(folder, decode.random_weights(*dims, seed=1), *dims)
        server = subprocess.Popen([args.megaton, "serve", "--model", folder, "--port", "0", "--threads",
                                   str(args.threads), "--precision", args.precision, "--kv-cache-dtype",
                                   args.kv_cache_dtype, "--weights-dtype", args.weights_dtype, "--max-sequences", str(max(16, args.requests))],
                                  stdout=subprocess.PIPE, text=True)
        try:
            line = server.stdout.readline()
            port = int(re.search(r":(\d+) \(loaded", line).group(1))
            print(line.strip())
            bodies = [{"model": args.shape, "prompt": prompt_of(i), "max_tokens": args.max_tokens, "temperature": 0}
                      for i in range(args.requests)]
            post(port, dict(bodies[0], max_tokens=4))  # warm-up
            m0 = metrics(port)
            t0 = time.perf_counter()
            sequential = [post(port, b) for b in bodies]
            seq_s = time.perf_counter() - t0
            m1 = metrics(port)
            rss_before = rss_mb(server.pid)
            results = [None] * args.requests
            peak_pages = [0.0]
            done = threading.Event()

            def poll():
                while not done.is_set():
                    peak_pages[0] = max(peak_pages[0], metrics(port).get("megaton_kv_cache_pages_used", 0))
                    time.sleep(0.05)

            def client(i):
                results[i] = post(port, bodies[i])

            threads = [threading.Thread(target=client, args=(i,)) for i in range(args.requests)]
            poller = threading.Thread(target=poll)
            poller.start()
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            conc_s = time.perf_counter() - t0
            done.set()
            poller.join()
            m2 = metrics(port)
            rss_after = rss_mb(server.pid)
        finally:
            server.terminate()
            server.wait(timeout=60)

    def tokens(rs):
        return sum(r[1].get("usage", {}).get("completion_tokens", 0) for r in rs if r and r[0] == 200)

    errors = sum(1 for r in sequential + results if not r or r[0] != 200)
    same = sum(1 for a, b in zip(sequential, results)
               if a[0] == b[0] == 200 and a[1]["choices"][0]["text"] == b[1]["choices"][0]["text"])
    seq_rate, conc_rate = tokens(sequential) / seq_s, tokens(results) / conc_s
    report = {
        "shape": args.shape, "precision": args.precision, "weights_dtype": args.weights_dtype,
        "kv_cache_dtype": args.kv_cache_dtype,
        "requests": args.requests, "max_tokens": args.max_tokens, "errors": errors,
        "sequential_tokens_per_s": round(seq_rate, 1), "concurrent_tokens_per_s": round(conc_rate, 1),
        "speedup": round(conc_rate / seq_rate, 2),
        "sequential_latency_s": round(summary_delta(m0, m1, "megaton_sequence_seconds"), 3),
        "concurrent_latency_s": round(summary_delta(m1, m2, "megaton_sequence_seconds"), 3),
        "sequential_ttft_s": round(summary_delta(m0, m1, "megaton_time_to_first_token_seconds"), 3),
        "concurrent_ttft_s": round(summary_delta(m1, m2, "megaton_time_to_first_token_seconds"), 3),
        "peak_kv_pages_used": peak_pages[0], "kv_pages": m2.get("megaton_kv_cache_pages"),
        "same_text_as_sequential": same,
        "rss_mb_before": round(rss_before, 1), "rss_mb_after": round(rss_after, 1),
    }
    print(json.dumps(report))
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
