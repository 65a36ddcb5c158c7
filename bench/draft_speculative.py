#!/usr/bin/python3
"""Speculative decoding with a separate draft model (issue 15), side by side in one run.

Trains gpt-tiny (4 layers) and a 1-layer gpt-tiny draft on the built-in fortunes demo corpus (same
data, seed and steps), then decodes greedily from a few prompts with the main model alone and with
`--draft-model` at several draft lengths: decode tokens/s (median over prompts and repeats), the
draft's acceptance rate and the main model's steps per generated token. Every speculative run must
print plain greedy's ids (checked).

  /usr/bin/python3 bench/draft_speculative.py --megaton build/megaton [--steps 300] [--tokens 200]
      [--draft-tokens 2,4,6] [--repeats 3] [--threads 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

PROMPTS = ["The ", "A man ", "Q: What is ", "It is a truth "]


def run(cmd, env):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def train(megaton, run_dir, layers, steps, env):
    run([megaton, "train", "--set", 'model.preset="gpt-tiny"', "--set", f"model.num_layers={layers}",
         "--set", f"training.train_iters={steps}", "--set", "logging.eval_interval=0", "--set", "sample.tokens=0",
         "--set", "logging.save_interval=0", "--set", f'logging.run_dir="{run_dir}"'], env)
    return os.path.join(run_dir, "final")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megaton", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--draft-tokens", default="2,4,6")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    print(run([args.megaton, "bench", "--cpu-info", "--threads", str(args.threads)], env).strip())
    with tempfile.TemporaryDirectory() as work:
        main_dir = train(args.megaton, os.path.join(work, "main"), 4, args.steps, env)
        draft_dir = train(args.megaton, os.path.join(work, "draft"), 1, args.steps, env)

        def generate(prompt, extra):
            return json.loads(run([args.megaton, "generate", "--model", main_dir, "--prompt", prompt,
                                   "--max-new-tokens", str(args.tokens), "--temperature", "0", "--json",
                                   "--threads", str(args.threads)] + extra, env))

        variants = [("main model alone", [])] + [(f"draft, {k} tokens", ["--draft-model", draft_dir, "--draft-tokens", k])
                                                for k in args.draft_tokens.split(",")]
        rates = {name: [] for name, _ in variants}
        accepted = {name: [0, 0, 0, 0] for name, _ in variants}  # accepted, drafted, main steps, tokens
        for _ in range(args.repeats):
            for prompt in PROMPTS:
                plain = None
                for name, extra in variants:
                    j = generate(prompt, extra)
                    if plain is None:
                        plain = j["ids"]
                    elif j["ids"] != plain:
                        sys.exit(f"{name}: ids differ from plain greedy's for prompt {prompt!r}")
                    if j["decode_tokens_per_s"]:
                        rates[name].append(j["decode_tokens_per_s"])
                    s = j.get("speculative")
                    if s:
                        a = accepted[name]
                        a[0] += s["accepted"]
                        a[1] += s["drafted"]
                        a[2] += s["main_steps"]
                        a[3] += len(j["ids"]) - 1
    base = statistics.median(rates[variants[0][0]])
    for name, _ in variants:
        r = statistics.median(rates[name])
        a = accepted[name]
        extra = (f", acceptance {a[0] / a[1]:.0%}, {a[2] / a[3]:.2f} main steps per token" if a[1] else "")
        print(f"{name}: decode {r:.1f} tok/s ({r / base:.2f}x){extra}")


if __name__ == "__main__":
    main()
