#!/usr/bin/env python3
"""`megaton plan` against published training figures: Megatron-LM's weak-scaling table on H100
(github.com/NVIDIA/Megatron-LM images/model_table.png, Megatron-Core r0.8.0: GPT models 1.7B-462B,
vocabulary 131072, sequence 4096, DP 48, overlapped grad reduce / param gather / TP comm) and
DeepSeek-V3's run (arXiv 2412.19437 and 2505.09343 Table 4: 2048 H800, PP16 DualPipe, EP64, ZeRO-1
DP, no TP, FP8, batch 15360 x 4096, MFU 38.94% of the bf16 peak with causal attention FLOPs).
Predicted MFU on the shipped `h100` system (datasheet figures, estimated efficiencies) next to the
published one. What the publications leave out is assumed and printed: micro-batch 1, the 1F1B
schedule at PP > 1, GPT-2 blocks (LayerNorm, GeLU, learned positions), bf16; H800 = the h100
system with NVLink at 200 GB/s per direction; DeepSeek-V3 without its MTP layer (Megaton refuses
MTP under pipelining) and with 61 layers cut 2 / 14 x 4 / 3."""
import argparse
import json
import os
import subprocess
import tempfile

# name, heads, hidden, layers, tp, pp, gpus, batch, published MFU
MEGATRON = [
    ("1.7B", 16, 2048, 24, 1, 1, 48, 192, 0.41),
    ("7.1B", 32, 4096, 30, 2, 1, 96, 192, 0.47),
    ("16B", 48, 6144, 32, 4, 1, 192, 192, 0.49),
    ("32B", 56, 7168, 48, 8, 1, 384, 192, 0.46),
    ("70B", 64, 8192, 84, 8, 2, 768, 384, 0.42),
    ("119B", 80, 10240, 92, 8, 4, 1536, 768, 0.43),
    ("177B", 96, 12288, 96, 8, 6, 2304, 1152, 0.44),
    ("314B", 128, 16384, 96, 8, 8, 3072, 1536, 0.48),
    ("462B", 144, 18432, 112, 8, 16, 6144, 3072, 0.47),
]


def plan(megaton, system, devices, settings):
    cmd = [megaton, "plan", "--system", system, "--devices", str(devices), "--json"]
    for s in settings:
        cmd += ["--set", s]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if out.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{out.stdout}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def row(name, p, published):
    b = p["breakdown_s"]
    step = p["step_time_s"]
    shares = ", ".join(f"{k} {100 * v / step:.0f}%" for k, v in b.items() if v / step >= 0.01)
    print(f"| {name} | {p['devices']} | {100 * p['mfu']:.1f}% | {100 * published:.1f}% | "
          f"{p['peak_memory_bytes'] / 2**30:.1f} | {shares} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megaton", default="build/megaton")
    args = ap.parse_args()
    print("| model | GPUs | predicted MFU | published MFU | peak GiB | predicted step breakdown |")
    print("|---|---|---|---|---|---|")
    common = ["model.preset=\"gpt2-124m\"", "model.vocab_size=131072", "model.max_position_embeddings=4096",
              "model.make_vocab_size_divisible_by=128", "training.seq_length=4096", "training.micro_batch_size=1",
              "precision.bf16=true", "parallel.use_distributed_optimizer=true", "parallel.overlap_param_gather=true"]
    for name, heads, hidden, layers, tp, pp, gpus, batch, mfu in MEGATRON:
        sets = common + [f"model.num_attention_heads={heads}", f"model.num_query_groups={heads}",
                         f"model.hidden_size={hidden}", f"model.ffn_hidden_size={4 * hidden}",
                         f"model.num_layers={layers}", f"tp={tp}", f"pp={pp}",
                         f"training.global_batch_size={batch}",
                         f"parallel.sequence_parallel={'true' if tp > 1 else 'false'}"]
        row(f"Megatron GPT {name} (tp{tp} pp{pp} dp48)", plan(args.megaton, "h100", gpus, sets), mfu)
    h100 = subprocess.run([args.megaton, "plan", "systems", "--print", "h100"], stdout=subprocess.PIPE, text=True,
                          check=True).stdout
    nvlink = "[network.intra_node]\nbandwidth_Bps = 4.5e+11"
    assert nvlink in h100, "the h100 system's NVLink line moved"
    h800 = h100.replace(nvlink, "[network.intra_node]\nbandwidth_Bps = 2e+11").replace('name = "h100"',
                                                                                        'name = "h800"')
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "h800.toml")
        open(path, "w").write(h800)
        sets = ["model.preset=\"deepseek-v3-671b\"", "model.mtp_num_layers=0", "training.seq_length=4096",
                "training.micro_batch_size=1", "training.global_batch_size=15360", "precision.bf16=true",
                "precision.fp8=\"e4m3\"", "precision.fp8_recipe=\"blockwise\"", "pp=16", "ep=64",
                "parallel.pipeline_schedule=\"dualpipe\"", "parallel.decoder_first_pipeline_num_layers=2",
                "parallel.decoder_last_pipeline_num_layers=3", "parallel.use_distributed_optimizer=true"]
        row("DeepSeek-V3 671B (pp16 dualpipe ep64 dp128, FP8)", plan(args.megaton, path, 2048, sets), 0.3894)


if __name__ == "__main__":
    main()
