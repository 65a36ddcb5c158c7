"""End-to-end check of Megaton's DeepSeek models (DeepseekV3ForCausalLM / DeepseekV2ForCausalLM folders) against
the independent PyTorch reference.

Usage (CTest runs it from the build directory): /usr/bin/python3 test_deepseek_torch.py --megaton PATH

Tiny DeepSeeks saved by the reference as HF folders; `megaton eval --dump-grads` (the LM loss and every
gradient, the routers' share of the sequence-wise balancing loss included) and 5 `megaton train` AdamW steps
(with the auxiliary-loss-free expert-bias update after each), each against the same PyTorch run. Cases:
  * deepseek_v3: multi-latent attention with a query latent, YaRN rope scaling whose magnitude and softmax
    factor differ from 1, the first layer dense, then 8 experts top-2 by sigmoid scores + expert bias within
    2 of 4 groups, normalised weights scaled by 2.5, one shared expert, sequence-wise balancing loss, two
    multi-token prediction depths (MoE blocks; their loss weighted 0.1 / 2 joins the gradients, the file
    holds DeepSeek-V3's copies of the embedding and head in the MTP layers); micro-batches of 4 and 2 (the
    sequence-wise and MTP losses are means per micro-batch over equal counts, so accumulation matches)
  * deepseek_v2: no query latent (q_proj), no rope scaling, softmax over all experts then top-2 unnormalised
    and scaled, two shared experts
See end_to_end.py and torch_reference.py for the details.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from end_to_end import Case, run_cases  # noqa: E402
from torch_reference import DeepseekConfig  # noqa: E402

YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 8.0, "beta_slow": 1.0,
        "mscale": 1.0, "mscale_all_dim": 0.8}


def tiny_deepseek(**overrides) -> DeepseekConfig:
    return DeepseekConfig(**{**dict(model_type="deepseek_v3", vocab_size=257, hidden_size=48, intermediate_size=80,
                                    num_hidden_layers=2, num_attention_heads=3, q_lora_rank=24, kv_lora_rank=16,
                                    qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12, moe_intermediate_size=16,
                                    n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                                    first_k_dense_replace=1, scoring_func="sigmoid", topk_method="noaux_tc",
                                    n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
                                    aux_loss_alpha=0.01, seq_aux=True, rms_norm_eps=1e-6, rope_theta=10000.0,
                                    rope_scaling=YARN, max_position_embeddings=64),
                             **overrides})


CASES = [
    Case(name="deepseek_v3", config=tiny_deepseek(num_nextn_predict_layers=2), seed=1357, micro_batches=(4, 2)),
    Case(name="deepseek_v2",
         config=tiny_deepseek(model_type="deepseek_v2", q_lora_rank=None, rope_scaling=None, scoring_func="softmax",
                              topk_method="greedy", n_group=1, topk_group=1, norm_topk_prob=False,
                              routed_scaling_factor=1.5, n_shared_experts=2, tie_word_embeddings=True),
         seed=2468),
]

if __name__ == "__main__":
    run_cases(CASES)
