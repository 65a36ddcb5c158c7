"""End-to-end check of Megaton's GPT-2 against the independent PyTorch reference.

Usage (CTest runs it from the build directory): /usr/bin/python3 test_gpt_torch.py --megaton PATH

Byte-level corpus -> `megaton preprocess`; a seeded random tiny GPT-2 (tied head, n_inner from the
4*C default) saved as an HF folder; then `megaton eval --dump-grads` (loss and every parameter
gradient) and 5 `megaton train` AdamW steps (per-step loss / grad_norm and the exported weights),
once with micro_batch_size = global_batch_size = 4 and once accumulating 2 micro-batches of 2,
both against the same full-batch PyTorch run. See torch_reference.py for the details.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_reference import Case, GPT2Config, run_cases  # noqa: E402

CASES = [
    Case(name="gpt2",
         config=GPT2Config(vocab_size=257, n_positions=64, n_embd=48, n_layer=2, n_head=4),  # head_dim 12
         seed=1234, seq_len=32, eval_samples=4, micro_batches=(4, 2)),
]

if __name__ == "__main__":
    run_cases(CASES)
