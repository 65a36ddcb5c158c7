"""End-to-end check of Megaton's Mixtral (MixtralForCausalLM folders) against the independent PyTorch
reference.

Usage (CTest runs it from the build directory): /usr/bin/python3 test_mixtral_torch.py --megaton PATH

A tiny Mixtral (GQA 6 query / 2 kv heads, 4 experts top-2 of width 32, Switch balancing loss with
coefficient 0.02) saved by the reference as an HF folder; `megaton eval --dump-grads` (the LM loss,
and every gradient including the router's share of the balancing loss) and 5 `megaton train` AdamW
steps on one micro-batch per step (the balancing loss is per micro-batch, as in Megatron-Core, so only
a full-batch micro-batch matches the reference's full-batch step), each against the same PyTorch run.
See end_to_end.py and torch_reference.py for the details.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from end_to_end import Case, run_cases  # noqa: E402
from torch_reference import MixtralConfig  # noqa: E402

TINY_MIXTRAL = MixtralConfig(vocab_size=257, hidden_size=48, intermediate_size=32, num_hidden_layers=2,
                             num_attention_heads=6, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5,
                             rope_theta=1e6, max_position_embeddings=64, tie_word_embeddings=False,
                             num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02,
                             output_router_logits=True)

CASES = [Case(name="mixtral", config=TINY_MIXTRAL, seed=2468, micro_batches=(4,))]

if __name__ == "__main__":
    run_cases(CASES)
