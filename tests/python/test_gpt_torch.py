"""End-to-end check of Megaton's GPT-2 against the independent PyTorch reference.

Usage (CTest runs it from the build directory): /usr/bin/python3 test_gpt_torch.py --megaton PATH

Byte-level corpora -> `megaton preprocess`; seeded random tiny GPT-2s (n_inner from the 4*C default)
saved as HF folders; then `megaton eval --dump-grads` (loss and every parameter gradient) and 5
`megaton train` AdamW steps (per-step loss / grad_norm / lr and the exported weights), each against
the same full-batch PyTorch run on the same samples. Cases:
  * gpt2: tied head, constant lr, data in order; micro_batch_size 4 and 2 (2 accumulated micro-batches)
  * gpt2_untied: untied head, cosine decay after 2 warmup steps, Megatron's shuffled GPTDataset
    sampling, 2 accumulated micro-batches
  * gpt2_blend: linear decay after 1 warmup step, ending (lr_decay_iters 4) before training does,
    the Megatron blend "0.6 A 0.4 B"
See end_to_end.py and torch_reference.py for the details.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from end_to_end import Case, run_cases  # noqa: E402
from torch_reference import GPT2Config, TrainSettings  # noqa: E402


def tiny_gpt2(**overrides) -> GPT2Config:
    return GPT2Config(**{**dict(vocab_size=257, n_positions=64, n_embd=48, n_layer=2, n_head=4), **overrides})  # head_dim 12


CASES = [
    Case(name="gpt2", config=tiny_gpt2(), seed=1234, micro_batches=(4, 2)),
    Case(name="gpt2_untied", config=tiny_gpt2(tie_word_embeddings=False), seed=2345, micro_batches=(2,),
         data="shuffled", train=TrainSettings(min_lr=1e-4, warmup=2, decay_style="cosine")),
    Case(name="gpt2_bf16", config=tiny_gpt2(), seed=4567, micro_batches=(2,), bf16=True),
    Case(name="gpt2_blend", config=tiny_gpt2(), seed=3456, data="blend",
         train=TrainSettings(min_lr=2e-4, warmup=1, decay_style="linear", decay_iters=4)),
]

if __name__ == "__main__":
    run_cases(CASES)
