"""End-to-end check of Megaton's Llama against the independent PyTorch reference.

Usage (CTest runs it from the build directory): /usr/bin/python3 test_llama_torch.py --megaton PATH

Byte-level corpus -> `megaton preprocess`; seeded random tiny Llamas (GQA 6 query / 2 kv heads,
head_dim 8) saved as HF folders; then `megaton eval --dump-grads` (loss and every parameter
gradient) and 5 `megaton train` AdamW steps (per-step loss / grad_norm and the exported weights).
Two cases: untied head with plain RoPE, and tied head with llama3 RoPE scaling (its frequencies
span the kept, interpolated and slowed bands). See torch_reference.py for the details.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_reference import LLAMA3_SCALING, Case, LlamaConfig, run_cases  # noqa: E402


def tiny_llama(**overrides) -> LlamaConfig:
    return LlamaConfig(**{**dict(vocab_size=257, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                                 num_attention_heads=6, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5,
                                 rope_theta=10000.0, max_position_embeddings=64, tie_word_embeddings=False),
                         **overrides})


CASES = [
    Case(name="llama", config=tiny_llama(), seed=4321),
    Case(name="llama_tied_rope3",
         config=tiny_llama(tie_word_embeddings=True, rope_scaling=LLAMA3_SCALING, max_position_embeddings=1024),
         seed=8765),
]

if __name__ == "__main__":
    run_cases(CASES)
