#!/usr/bin/python3
"""Issue 12's DeepSeek measurements, side by side in one run (prints the CPU's features first):

1. Convergence: deepseek-v3-tiny (MLA, MoE with a shared expert and bias balancing, one MTP depth) and
   a dense Llama with as many parameters per token as deepseek-v3-tiny's main model, trained the same
   number of steps on the fortunes demo corpus with the same seed, data and schedule: final validation
   loss (the main head's) and training tokens/s of each.
2. Self-speculative decoding on the trained deepseek-v3-tiny: greedy decode tokens/s plain and with the
   MTP draft (--speculative), the draft's acceptance rate, and whether the tokens are the same.
3. MLA decoding forms on random weights of a larger MLA model (hidden 1024, 16 heads, kv_lora_rank
   256, 512-token prompt): decode tokens/s absorbed (attention over the latent cache with W_uk / W_uv
   folded) and naive (the cached latent expanded into every head's keys and values each step).

Medians over --repeats runs. Usage:
  /usr/bin/python3 bench/deepseek.py --megaton build/megaton [--steps 300] [--repeats 3] [--threads 2]
"""
import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path


def run(cmd):
    result = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        raise SystemExit(f"failed ({result.returncode}): {' '.join(map(str, cmd))}\n{result.stdout[-3000:]}")
    return result.stdout


def last_json(text, key):
    for line in reversed(text.splitlines()):
        try:
            j = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(j, dict) and key in j:
            return j
    raise SystemExit(f"no JSON line with {key!r} in:\n{text[-2000:]}")


def train(megaton, run_dir, sets, steps, threads):
    if steps == 0:  # an export of the initial weights: a decaying schedule needs steps past its warmup
        sets = [*sets, 'optimizer.lr_decay_style="constant"', "optimizer.lr_warmup_iters=0"]
    run([megaton, "train", "--set", f"training.train_iters={steps}", "--set", f"training.threads={threads}",
         "--set", "logging.eval_interval=0", "--set", "sample.tokens=0", "--set", "logging.save_interval=0",
         "--set", f'logging.run_dir="{run_dir}"', *sum((["--set", s] for s in sets), [])])
    if steps == 0:
        return None
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    final = [r for r in rows if r.get("final")]
    speeds = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
    return final[-1]["val_loss"], statistics.median(speeds)


def params_per_token(megaton, folder):
    return last_json(run([megaton, "model", "info", "--model", folder, "--json"]), "active_parameters")["active_parameters"]


def generate(megaton, model, threads, extra, max_new, prompt_ids=None):
    prompt = ["--prompt-ids", ",".join(map(str, prompt_ids))] if prompt_ids else ["--prompt", "The "]
    out = run([megaton, "generate", "--model", model, *prompt, "--max-new-tokens", max_new, "--temperature", 0,
               "--threads", threads, "--json", *extra])
    return last_json(out, "decode_tokens_per_s")


def median_decode(megaton, model, threads, extra, repeats, max_new, prompt_ids=None):
    runs = [generate(megaton, model, threads, extra, max_new, prompt_ids) for _ in range(repeats)]
    return statistics.median(r["decode_tokens_per_s"] for r in runs), runs[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megaton", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    megaton = Path(a.megaton).resolve()
    print(run([megaton, "bench", "--cpu-info"]).strip())
    work = Path(tempfile.mkdtemp(prefix="megaton_deepseek_"))

    # 1. The dense baseline's MLP width is chosen so its parameters per token match deepseek-v3-tiny's
    #    main model (its MTP depth left out: it adds no parameters to what predicts the next token).
    ds = work / "deepseek"
    ds_loss, ds_speed = train(megaton, ds, ['model.preset="deepseek-v3-tiny"'], a.steps, a.threads)
    main_only = work / "deepseek_main"
    train(megaton, main_only, ['model.preset="deepseek-v3-tiny"', "model.mtp_num_layers=0"], 0, a.threads)
    target = params_per_token(megaton, main_only / "final")
    best = None
    for ffn in range(64, 2048, 16):
        probe = work / f"probe_{ffn}"
        probe.mkdir()
        cfg = {"model_type": "llama", "vocab_size": 257, "hidden_size": 192, "intermediate_size": ffn,
               "num_hidden_layers": 4, "num_attention_heads": 6, "num_key_value_heads": 2,
               "max_position_embeddings": 256, "tie_word_embeddings": False}
        (probe / "config.json").write_text(json.dumps(cfg))
        n = params_per_token(megaton, probe)
        if best is None or abs(n - target) < abs(best[1] - target):
            best = (ffn, n)
    ffn, dense_params = best
    dense_loss, dense_speed = train(megaton, work / "dense", ['model.preset="llama-tiny"',
                                                              f"model.ffn_hidden_size={ffn}"], a.steps, a.threads)
    print(f"\n{a.steps} steps on the fortunes demo corpus (final validation loss of the main head):")
    print(f"  deepseek-v3-tiny: {ds_loss:.4f}, {ds_speed:.0f} tokens/s ({target} parameters per token in the main "
          f"model, + one MTP depth)")
    print(f"  dense llama (ffn {ffn}): {dense_loss:.4f}, {dense_speed:.0f} tokens/s ({dense_params} parameters per token)")

    # 2. Self-speculative decoding.
    plain, plain_run = median_decode(megaton, ds / "final", a.threads, [], a.repeats, 200)
    spec, spec_run = median_decode(megaton, ds / "final", a.threads, ["--speculative"], a.repeats, 200)
    s = spec_run["speculative"]
    print(f"\ngreedy decode of 200 tokens, trained deepseek-v3-tiny: plain {plain:.0f} tokens/s, with the MTP draft "
          f"{spec:.0f} tokens/s ({spec / plain:.2f}x); drafts accepted {s['accepted']}/{s['drafted']} "
          f"({100 * s['accepted'] / max(s['drafted'], 1):.0f}%); same tokens: {spec_run['ids'] == plain_run['ids']}")

    # 3. MLA decoding forms at a larger shape (random weights: the speed does not depend on them).
    big = work / "mla_big"
    train(megaton, big, ['model.preset="deepseek-v3-tiny"', "model.hidden_size=1024", "model.num_attention_heads=16",
                         "model.num_query_groups=16", "model.q_lora_rank=384", "model.kv_lora_rank=256",
                         "model.qk_head_dim=64", "model.qk_pos_emb_head_dim=32", "model.v_head_dim=64",
                         'model.mlp_type="dense"', "model.ffn_hidden_size=2048", "model.mtp_num_layers=0",
                         "model.max_position_embeddings=1024"], 0, a.threads)
    prompt = [(i * 37 + 11) % 256 for i in range(512)]
    absorbed, _ = median_decode(megaton, big / "final", a.threads, ["--mla-decode", "absorbed"], a.repeats, 64, prompt)
    naive, _ = median_decode(megaton, big / "final", a.threads, ["--mla-decode", "naive"], a.repeats, 64, prompt)
    print(f"\nMLA decode after a 512-token prompt (hidden 1024, 16 heads, kv_lora_rank 256, 4 layers): absorbed "
          f"{absorbed:.1f} tokens/s, naive {naive:.1f} tokens/s ({absorbed / naive:.2f}x)")


if __name__ == "__main__":
    main()
