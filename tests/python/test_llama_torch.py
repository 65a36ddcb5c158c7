"""End-to-end check of Megaton's Llama against the independent PyTorch reference.

Usage (CTest runs it from the build directory): /usr/bin/python3 test_llama_torch.py --megaton PATH

Byte-level corpora -> `megaton preprocess`; tiny Llamas (GQA 6 query / 2 kv heads, head_dim 8); then
`megaton eval --dump-grads` (loss and every parameter gradient) and 5 `megaton train` AdamW steps
(per-step loss / grad_norm / lr and the exported weights), each against the same full-batch PyTorch
run on the same samples. Cases:
  * llama: untied head, half (HF) RoPE, data in order; micro_batch_size 4 and 2 (2 accumulated)
  * llama_tied_rope3: tied head, llama3 RoPE scaling (its frequencies span the kept, interpolated
    and slowed bands)
  * llama_interleaved: interleaved RoPE (model.rope_layout, which an HF config cannot express, so
    megaton builds and initializes the model and there is no eval stage), constant lr after 3
    warmup steps, Megatron's shuffled GPTDataset sampling, 2 accumulated micro-batches
See end_to_end.py and torch_reference.py for the details.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from end_to_end import Case, run_cases  # noqa: E402
from torch_reference import LLAMA3_SCALING, LlamaConfig, TrainSettings  # noqa: E402


def tiny_llama(**overrides) -> LlamaConfig:
    return LlamaConfig(**{**dict(vocab_size=257, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                                 num_attention_heads=6, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5,
                                 rope_theta=10000.0, max_position_embeddings=64, tie_word_embeddings=False),
                         **overrides})


CASES = [
    Case(name="llama", config=tiny_llama(), seed=4321, micro_batches=(4, 2)),
    Case(name="llama_tied_rope3",
         config=tiny_llama(tie_word_embeddings=True, rope_scaling=LLAMA3_SCALING, max_position_embeddings=1024),
         seed=8765),
    Case(name="llama_bf16", config=tiny_llama(), seed=5432, micro_batches=(2,), bf16=True),
    Case(name="llama_interleaved", config=tiny_llama(rope_layout="interleaved"), micro_batches=(2,),
         data="shuffled", train=TrainSettings(warmup=3)),
]

if __name__ == "__main__":
    run_cases(CASES)
