"""Independent plain-PyTorch reference for Megaton (fp32, eager, no fused kernels).

Contents:
  * safetensors read/write with numpy (no `safetensors` package needed)
  * HF GPT-2 (GPT2LMHeadModel), HF Llama (LlamaForCausalLM) and HF Mixtral (MixtralForCausalLM, with
    Megatron-Core's per-layer Switch balancing loss) re-implemented from their definitions; parameter names are the HF checkpoint names, so `named_parameters()` is the
    checkpoint layout (a tied head has no parameter of its own: it reuses the embedding). A Llama
    may also use Megatron's interleaved RoPE (Meta's original layout), which HF files cannot say:
    its q/k rows are permuted to and from HF order on load and save
  * HF folder load/save (config.json + model.safetensors) and seeded random init
  * Megatron MMIDIDX .bin/.idx reader and the in-order sample layout (data.shuffle = false); the
    shuffled GPTDataset / BlendedDataset samples come from data_reference.py
  * AdamW (a restatement of torch.optim.AdamW with Megaton's two weight-decay groups), Megatron's
    learning-rate schedules, and a reference training loop with global grad-norm clipping

The end-to-end harness that runs the `megaton` CLI against this reference is end_to_end.py; the
reference's own self-tests are selftest_torch_reference.py.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------------
# safetensors
# ----------------------------------------------------------------------------------------------

# safetensors dtype name -> numpy dtype (BF16 is handled separately: numpy has no bfloat16; F8_E4M3
# codes are read as their raw bytes, uint8, and never written).
_ST_TO_NUMPY = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U8": np.uint8, "U16": np.uint16, "BOOL": np.bool_,
}
_NUMPY_TO_ST = {np.dtype(v): k for k, v in _ST_TO_NUMPY.items()}
_ST_TO_NUMPY["F8_E4M3"] = np.uint8


def read_safetensors(path, dtypes: dict | None = None) -> dict[str, np.ndarray]:
    """Reads every tensor of a .safetensors file. BF16 is widened to float32; F8_E4M3 comes as its
    uint8 codes. `dtypes`, when given, receives each tensor's stored dtype name."""
    data = Path(path).read_bytes()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = data[base + start:base + end]
        shape = tuple(info["shape"])
        if dtypes is not None:
            dtypes[name] = info["dtype"]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            array = bits.view(np.float32)
        else:
            array = np.frombuffer(raw, dtype=np.dtype(_ST_TO_NUMPY[info["dtype"]]).newbyteorder("<"))
        if array.size != math.prod(shape):
            raise ValueError(f"{path}: tensor {name} has {array.size} elements, shape {shape}")
        tensors[name] = array.reshape(shape).astype(array.dtype.newbyteorder("="))
    return tensors


def write_safetensors(path, tensors: dict, metadata: dict[str, str] | None = None) -> None:
    """Writes numpy arrays / torch tensors (names sorted, data packed, header padded to 8 bytes)."""
    arrays = {}
    for name, value in tensors.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        arrays[name] = np.ascontiguousarray(value)
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in sorted(arrays):
        a = arrays[name]
        header[name] = {"dtype": _NUMPY_TO_ST[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for name in sorted(arrays):
            f.write(arrays[name].astype(arrays[name].dtype.newbyteorder("<")).tobytes())


# ----------------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------------

@dataclass
class GPT2Config:
    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: int | None = None  # None => 4 * n_embd
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"
    tie_word_embeddings: bool = True

    @property
    def inner(self) -> int:
        return self.n_inner if self.n_inner is not None else 4 * self.n_embd

    def to_hf(self) -> dict:
        return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], **asdict(self)}


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int | None = None  # None => hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # None or {"rope_type": "llama3", factor, ...}
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    # Megaton's model.rope_layout: "half" (HF rotate_half) or "interleaved" (Megatron / Meta). Not an HF
    # key: HF files always hold the half layout.
    rope_layout: str = "half"

    @property
    def dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    def to_hf(self) -> dict:
        hf = {k: v for k, v in asdict(self).items() if k != "rope_layout"}
        return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **hf}


@dataclass
class MixtralConfig(LlamaConfig):
    """A Llama whose every MLP is num_local_experts SwiGLU experts of intermediate_size, top-k routed."""
    num_local_experts: int = 8
    num_experts_per_tok: int = 2
    router_aux_loss_coef: float = 0.0
    output_router_logits: bool = False  # HF adds the balancing loss to the training loss only then

    @property
    def aux_coeff(self) -> float:
        return self.router_aux_loss_coef if self.output_router_logits else 0.0

    def to_hf(self) -> dict:
        hf = {k: v for k, v in asdict(self).items() if k != "rope_layout"}
        return {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "sliding_window": None, **hf}


@dataclass
class DeepseekConfig:
    """HF DeepseekV2 / DeepseekV3 (model_type "deepseek_v2" / "deepseek_v3"): multi-latent attention, the first
    first_k_dense_replace layers with a dense SwiGLU MLP of intermediate_size, the rest mixtures of
    n_routed_experts SwiGLU experts of moe_intermediate_size plus n_shared_experts fused into one."""
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    moe_intermediate_size: int
    n_routed_experts: int | None
    n_shared_experts: int
    num_experts_per_tok: int
    first_k_dense_replace: int
    scoring_func: str = "sigmoid"
    topk_method: str = "noaux_tc"
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    aux_loss_alpha: float = 0.0
    seq_aux: bool = True
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # None or {"type": "yarn", factor, original_max_position_embeddings, ...}
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    num_nextn_predict_layers: int = 0  # multi-token prediction depths, stored as layers after the last

    # Not HF keys: MTP's loss weight (Megatron's mtp_loss_scaling_factor default, which a trainer
    # loading an HF folder uses), and: the auxiliary-loss-free balancing update after each training step (noaux_tc), as
    # Megatron's moe_router_bias_update_rate (its default, which a trainer loading an HF folder uses).
    BIAS_UPDATE_RATE = 1e-3
    MTP_LOSS_SCALING_FACTOR = 0.1

    def to_hf(self) -> dict:
        arch = "DeepseekV3ForCausalLM" if self.model_type == "deepseek_v3" else "DeepseekV2ForCausalLM"
        return {"architectures": [arch], "num_key_value_heads": self.num_attention_heads, "moe_layer_freq": 1,
                "attention_bias": False, "hidden_act": "silu", **asdict(self)}


def config_from_hf(hf: dict):
    """Builds a GPT2Config / LlamaConfig / MixtralConfig / DeepseekConfig from a config.json dict, ignoring
    unrelated HF keys."""
    kind = hf.get("model_type")
    cls = {"gpt2": GPT2Config, "llama": LlamaConfig, "mixtral": MixtralConfig, "deepseek_v2": DeepseekConfig,
           "deepseek_v3": DeepseekConfig}.get(kind)
    if cls is None:
        raise ValueError(f"unsupported model_type {kind!r}")
    known = cls.__dataclass_fields__
    cfg = cls(**{k: v for k, v in hf.items() if k in known})
    if kind == "gpt2" and cfg.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"unsupported GPT-2 activation {cfg.activation_function!r}")
    if kind.startswith("deepseek"):
        if hf.get("moe_layer_freq", 1) != 1 or hf.get("attention_bias", False):
            raise ValueError("moe_layer_freq other than 1 and attention biases are not supported")
        if cfg.rope_scaling is not None and cfg.rope_scaling.get("type", cfg.rope_scaling.get("rope_type")) != "yarn":
            raise ValueError(f"unsupported rope_scaling {cfg.rope_scaling!r}")
    elif kind in ("llama", "mixtral") and cfg.rope_scaling is not None:
        rope_type = cfg.rope_scaling.get("rope_type", cfg.rope_scaling.get("type"))
        if rope_type != "llama3":
            raise ValueError(f"unsupported rope_scaling {cfg.rope_scaling!r}")
    return cfg


# A llama3 rope_scaling whose bands a head_dim 8 / rope_theta 1e4 model spans: of its four frequencies
# one is kept, one interpolated and two slowed down.
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 128}


# ----------------------------------------------------------------------------------------------
# Shared building blocks
# ----------------------------------------------------------------------------------------------

def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal mask) v for [B, H, T, D] tensors (full T x T mask)."""
    t = q.shape[-2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every position of the batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


# ----------------------------------------------------------------------------------------------
# GPT-2 (HF GPT2LMHeadModel semantics)
# ----------------------------------------------------------------------------------------------

class Conv1D(nn.Module):
    """HF GPT-2's linear layer: weight stored [in, out], y = x @ W + b."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.empty(n_out))

    def forward(self, x):
        return x @ self.weight + self.bias


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """HF "gelu_new": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = Conv1D(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = Conv1D(cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=-1)
        heads = lambda y: y.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)  # noqa: E731
        y = causal_attention(heads(q), heads(k), heads(v))
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class GPT2MLP(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.c_fc = Conv1D(cfg.n_embd, cfg.inner)
        self.c_proj = Conv1D(cfg.inner, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(gelu_tanh(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = GPT2Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = GPT2MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.config = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.n_positions, cfg.n_embd),
            h=nn.ModuleList(GPT2Block(cfg) for _ in range(cfg.n_layer)),
            ln_f=nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon),
        ))
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def head_weight(self) -> torch.Tensor:
        tied = self.config.tie_word_embeddings
        return self.transformer.wte.weight if tied else self.lm_head.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.config.n_positions:
            raise ValueError(f"sequence length {t} exceeds n_positions {self.config.n_positions}")
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe(torch.arange(t, device=idx.device))
        for block in tr.h:
            x = block(x)
        return tr.ln_f(x) @ self.head_weight().t()


# ----------------------------------------------------------------------------------------------
# Llama (HF LlamaForCausalLM semantics)
# ----------------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """HF default RoPE frequencies, with the "llama3" rescaling when rope_scaling asks for it."""
    d = cfg.dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    if cfg.rope_scaling is None:
        return inv_freq
    s = cfg.rope_scaling
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are slowed down by `factor`, short ones kept, the band between interpolated.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class HalfRope:
    """HF apply_rotary_pos_emb: dims i and i + D/2 of a head turn together by angle pos * inv_freq[i]."""

    def __init__(self, freqs: torch.Tensor):  # freqs: [T, D/2] angles
        angles = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = angles.cos(), angles.sin()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.cos + rotate_half(x) * self.sin


class InterleavedRope:
    """Meta's apply_rotary_emb, the layout Megatron calls interleaved: dims 2i and 2i + 1 of a head are
    one complex number, multiplied by exp(1j * pos * inv_freq[i])."""

    def __init__(self, freqs: torch.Tensor):
        self.turn = torch.polar(torch.ones_like(freqs), freqs)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
        return torch.view_as_real(pairs * self.turn).flatten(-2)


ROPE_LAYOUTS = {"half": HalfRope, "interleaved": InterleavedRope}


def hf_rows_to_interleaved(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undoes the `permute` of HF's convert_llama_weights_to_hf.py, which turns each head's interleaved
    q/k rows (2i, 2i + 1) into rotate_half rows (i, i + D/2): view(heads, D/2, 2, C).transpose(1, 2)."""
    return w.reshape(heads, 2, -1, w.shape[-1]).transpose(1, 2).reshape(w.shape)


def interleaved_rows_to_hf(w: torch.Tensor, heads: int) -> torch.Tensor:
    """HF's `permute`: interleaved q/k rows -> rotate_half rows."""
    return w.reshape(heads, -1, 2, w.shape[-1]).transpose(1, 2).reshape(w.shape)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        h, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.dim
        if h % kv:
            raise ValueError(f"num_attention_heads {h} is not a multiple of num_key_value_heads {kv}")
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)

    def forward(self, x, rope):
        b, t, _ = x.shape
        h, kv, d = self.cfg.num_attention_heads, self.cfg.num_key_value_heads, self.cfg.dim
        q = rope(self.q_proj(x).view(b, t, h, d).transpose(1, 2))
        k = rope(self.k_proj(x).view(b, t, kv, d).transpose(1, 2))
        v = self.v_proj(x).view(b, t, kv, d).transpose(1, 2)
        # GQA: query head j reads kv head j // (h // kv) (HF repeat_kv).
        k = k.repeat_interleave(h // kv, dim=1)
        v = v.repeat_interleave(h // kv, dim=1)
        y = causal_attention(q, k, v)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, h * d))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x, rope):
        x = x + self.self_attn(self.input_layernorm(x), rope)
        return x + self.mlp(self.post_attention_layernorm(x))


class MixtralExpert(nn.Module):
    def __init__(self, cfg: MixtralConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)  # gate
        self.w2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)  # down
        self.w3 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)  # up

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MixtralSparseMoe(nn.Module):
    """HF's MixtralSparseMoeBlock: softmax over all experts' logits, the top-k, renormalised to sum 1,
    each token's output the weighted sum of its k experts. `balance_loss` after forward: Megatron-
    Core's switch_load_balancing_loss_func over the tokens of this call,
    coeff * E / (N^2 k) * sum_e (sum_t p_te) * count_e, which Megaton trains with (HF's own version
    pools every layer's router logits before the product instead)."""

    def __init__(self, cfg: MixtralConfig):
        super().__init__()
        self.top_k, self.coeff = cfg.num_experts_per_tok, cfg.aux_coeff
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_local_experts, bias=False)
        self.experts = nn.ModuleList(MixtralExpert(cfg) for _ in range(cfg.num_local_experts))
        self.balance_loss = torch.zeros(())

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        n, e = x.shape[0], len(self.experts)
        probs = torch.softmax(self.gate(x), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        y = torch.zeros_like(x)
        for expert_id, expert in enumerate(self.experts):
            token, slot = (chosen == expert_id).nonzero(as_tuple=True)
            if token.numel():
                y = y.index_add(0, token, weights[token, slot, None] * expert(x[token]))
        counts = torch.zeros(e).scatter_add_(0, chosen.reshape(-1), torch.ones(chosen.numel()))
        self.balance_loss = self.coeff * e / (n * n * self.top_k) * torch.sum(probs.sum(dim=0) * counts)
        return y.reshape(shape)


class MixtralLayer(LlamaLayer):
    def __init__(self, cfg: MixtralConfig):
        super().__init__(cfg)
        del self.mlp
        self.block_sparse_moe = MixtralSparseMoe(cfg)

    def forward(self, x, rope):
        x = x + self.self_attn(self.input_layernorm(x), rope)
        return x + self.block_sparse_moe(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """Llama, or Mixtral with MixtralLayer (see aux_loss)."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        layer = MixtralLayer if isinstance(cfg, MixtralConfig) else LlamaLayer
        self.model = nn.ModuleDict(dict(
            embed_tokens=nn.Embedding(cfg.vocab_size, cfg.hidden_size),
            layers=nn.ModuleList(layer(cfg) for _ in range(cfg.num_hidden_layers)),
            norm=RMSNorm(cfg.hidden_size, cfg.rms_norm_eps),
        ))
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def head_weight(self) -> torch.Tensor:
        tied = self.config.tie_word_embeddings
        return self.model.embed_tokens.weight if tied else self.lm_head.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        freqs = torch.outer(torch.arange(t, dtype=torch.float32, device=idx.device), self.inv_freq)
        rope = ROPE_LAYOUTS[self.config.rope_layout](freqs)
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x, rope)
        return self.model.norm(x) @ self.head_weight().t()


# ----------------------------------------------------------------------------------------------
# DeepSeek-V2 / V3 (HF modeling_deepseek.py semantics; MoE balancing as Megatron-Core trains it)
# ----------------------------------------------------------------------------------------------

def yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


class DeepseekRope:
    """DeepSeek's rotary embedding (with YaRN when rope_scaling asks): cos / sin of [T, D] angles times
    YaRN's magnitude, applied after DeepSeek's apply_rotary_pos_emb moves each head's interleaved pairs
    (2i, 2i + 1) to (i, i + D/2) and rotates by rotate_half."""

    def __init__(self, cfg: DeepseekConfig, t: int):
        d, base = cfg.qk_rope_head_dim, cfg.rope_theta
        freq_extra = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        magnitude = 1.0
        s = cfg.rope_scaling
        if s is None:
            inv_freq = freq_extra
        else:
            factor, old = s["factor"], s.get("original_max_position_embeddings", 4096)
            fast, slow = s.get("beta_fast", 32), s.get("beta_slow", 1)
            corr = lambda rot: d * math.log(old / (rot * 2 * math.pi)) / (2 * math.log(base))  # noqa: E731
            low, high = max(math.floor(corr(fast)), 0), min(math.ceil(corr(slow)), d - 1)
            if low == high:
                high += 0.001
            ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
            kept = 1.0 - ramp  # weight of the unscaled frequency
            inv_freq = freq_extra / factor * (1 - kept) + freq_extra * kept
            magnitude = yarn_mscale(factor, s.get("mscale", 1)) / yarn_mscale(factor, s.get("mscale_all_dim", 0))
        angles = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq)
        emb = torch.cat((angles, angles), dim=-1)
        self.cos, self.sin = (emb.cos() * magnitude).float(), (emb.sin() * magnitude).float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [B, H, T, D]
        b, h, t, d = x.shape
        x = x.view(b, h, t, d // 2, 2).transpose(4, 3).reshape(b, h, t, d)
        return x * self.cos + rotate_half(x) * self.sin


def deepseek_softmax_scale(cfg: DeepseekConfig) -> float:
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    s = cfg.rope_scaling
    if s is not None and s.get("mscale_all_dim", 0):
        m = yarn_mscale(s["factor"], s["mscale_all_dim"])
        scale *= m * m
    return scale


class DeepseekAttention(nn.Module):
    """DeepseekV2/V3Attention: q through the q_lora_rank latent (or q_proj), [c | k_pe] = kv_a_proj_with_mqa(x),
    per head [k_nope | v] = kv_b_proj(RMSNorm(c)), the one k_pe shared by every head."""

    def __init__(self, cfg: DeepseekConfig):
        super().__init__()
        self.cfg = cfg
        h, qk = cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        if cfg.q_lora_rank:
            self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, h * qk, bias=False)
        else:
            self.q_proj = nn.Linear(cfg.hidden_size, h * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, h * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False)
        self.o_proj = nn.Linear(h * cfg.v_head_dim, cfg.hidden_size, bias=False)

    def forward(self, x, rope):
        c = self.cfg
        b, t, _ = x.shape
        h, nope, r, dv = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if c.q_lora_rank else self.q_proj(x)
        q_nope, q_pe = q.view(b, t, h, nope + r).transpose(1, 2).split([nope, r], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([c.kv_lora_rank, r], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(b, t, h, nope + dv).transpose(1, 2)
        k_nope, v = kv.split([nope, dv], dim=-1)
        k_pe = rope(k_pe.view(b, t, 1, r).transpose(1, 2))
        q = torch.cat((q_nope, rope(q_pe)), dim=-1)
        k = torch.cat((k_nope, k_pe.expand(b, h, t, r)), dim=-1)
        scores = q @ k.transpose(-1, -2) * deepseek_softmax_scale(c)
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        y = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, h * dv))


class DeepseekMLP(nn.Module):
    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DeepseekGate(nn.Module):
    """MoEGate: scores (sigmoid or softmax of the logits); "noaux_tc" (V3) chooses by scores + the
    selection-only e_score_correction_bias within the topk_group groups of highest top-2 sums; "greedy" (V2)
    takes the top-k scores. Weights are the chosen scores, normalised when norm_topk_prob (then, in V2 only,
    not scaled) and scaled by routed_scaling_factor."""

    def __init__(self, cfg: DeepseekConfig):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.n_routed_experts, cfg.hidden_size))
        if cfg.topk_method == "noaux_tc":
            # Moved by the balancing update after each step, never by the optimizer (no gradient).
            self.e_score_correction_bias = nn.Parameter(torch.zeros(cfg.n_routed_experts), requires_grad=False)

    def forward(self, x):  # x [N, C] -> chosen [N, K], weights [N, K], scores [N, E]
        c = self.cfg
        logits = x @ self.weight.t()
        scores = logits.sigmoid() if c.scoring_func == "sigmoid" else logits.softmax(dim=-1)
        n, e = scores.shape
        if c.topk_method == "noaux_tc":
            choice = scores.detach() + self.e_score_correction_bias
            groups = choice.view(n, c.n_group, -1).topk(2, dim=-1).values.sum(dim=-1)
            keep = torch.zeros(n, c.n_group, dtype=torch.bool).scatter_(1, groups.topk(c.topk_group, dim=-1).indices,
                                                                         True)
            choice = choice.masked_fill(~keep.repeat_interleave(e // c.n_group, dim=1), float("-inf"))
            chosen = choice.topk(c.num_experts_per_tok, dim=-1).indices
        else:
            chosen = scores.detach().topk(c.num_experts_per_tok, dim=-1).indices
        weights = scores.gather(1, chosen)
        normalised = c.num_experts_per_tok > 1 and c.norm_topk_prob
        if normalised:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        if c.model_type == "deepseek_v3" or not normalised:
            weights = weights * c.routed_scaling_factor
        return chosen, weights, scores


class DeepseekMoE(nn.Module):
    """Routed experts + shared experts. `balance_loss` after forward: the sequence-wise balancing loss of
    DeepSeek-V2 / V3 (seq_aux), alpha * mean over sequences of sum_i f_i P_i with f_i = E / (K T) * (tokens of
    the sequence choosing i) and P_i the mean over its tokens of the scores normalised to sum 1 (softmax
    scores already do); or Megatron's micro-batch Switch loss when seq_aux is false. `loads` counts the
    tokens each expert got, for the bias update."""

    def __init__(self, cfg: DeepseekConfig):
        super().__init__()
        self.cfg = cfg
        self.gate = DeepseekGate(cfg)
        self.experts = nn.ModuleList(DeepseekMLP(cfg.hidden_size, cfg.moe_intermediate_size)
                                     for _ in range(cfg.n_routed_experts))
        if cfg.n_shared_experts:
            self.shared_experts = DeepseekMLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts)
        self.balance_loss = torch.zeros(())
        self.loads = torch.zeros(cfg.n_routed_experts)

    def forward(self, x):
        c = self.cfg
        b, t, _ = x.shape
        flat = x.reshape(b * t, -1)
        chosen, weights, scores = self.gate(flat)
        y = torch.zeros_like(flat)
        for expert_id, expert in enumerate(self.experts):
            token, slot = (chosen == expert_id).nonzero(as_tuple=True)
            if token.numel():
                y = y.index_add(0, token, weights[token, slot, None] * expert(flat[token]))
        if c.n_shared_experts:
            y = y + self.shared_experts(flat)
        e, k = c.n_routed_experts, c.num_experts_per_tok
        counts = torch.zeros(b * t, e).scatter_(1, chosen, 1.0)
        self.loads = counts.sum(dim=0)
        p = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20) if c.scoring_func == "sigmoid" else scores
        if c.seq_aux:
            f = counts.view(b, t, e).sum(dim=1) * (e / (k * t))
            self.balance_loss = c.aux_loss_alpha * (f * p.view(b, t, e).mean(dim=1)).sum(dim=1).mean()
        else:
            self.balance_loss = c.aux_loss_alpha * e / ((b * t) ** 2 * k) * torch.sum(p.sum(dim=0) * self.loads)
        return y.view(b, t, -1)

    @torch.no_grad()
    def update_bias(self):
        """Auxiliary-loss-free balancing (noaux_tc): bias += rate * sign(mean load - load), in float32."""
        if self.cfg.topk_method == "noaux_tc":
            delta = torch.sign(self.loads.mean() - self.loads).float() * DeepseekConfig.BIAS_UPDATE_RATE
            self.gate.e_score_correction_bias.add_(delta)


class DeepseekLayer(nn.Module):
    def __init__(self, cfg: DeepseekConfig, index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DeepseekAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        moe = cfg.n_routed_experts is not None and index >= cfg.first_k_dense_replace
        self.mlp = DeepseekMoE(cfg) if moe else DeepseekMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, rope):
        x = x + self.self_attn(self.input_layernorm(x), rope)
        return x + self.mlp(self.post_attention_layernorm(x))


class DeepseekMTPLayer(DeepseekLayer):
    """DeepSeek-V3's multi-token prediction depth k (stored as layer num_hidden_layers + k - 1): the block of a
    decoder layer past the last, fed eh_proj([enorm(embedding of the ids k ahead) | hnorm(previous depth's output)]),
    its output normalised by shared_head.norm; the embedding and head are the model's. The previous depth
    of depth 1 is the main model's final-norm output (as Megatron-Core and vLLM feed it)."""

    def __init__(self, cfg: DeepseekConfig, index: int):
        super().__init__(cfg, index)
        self.enorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.shared_head = nn.ModuleDict(dict(norm=RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)))

    def forward(self, emb, hidden, rope):
        x = self.eh_proj(torch.cat((self.enorm(emb), self.hnorm(hidden)), dim=-1))
        return self.shared_head.norm(super().forward(x, rope))


def shift_left(t: torch.Tensor, k: int, fill: int) -> torch.Tensor:
    """[B, T] ids k positions ahead, the last k filled (Megatron's roll_tensor, k times)."""
    out = torch.full_like(t, fill)
    out[:, :t.shape[1] - k] = t[:, k:]
    return out


class Deepseek(nn.Module):
    def __init__(self, cfg: DeepseekConfig):
        super().__init__()
        self.config = cfg
        n, d = cfg.num_hidden_layers, cfg.num_nextn_predict_layers
        self.model = nn.ModuleDict(dict(
            embed_tokens=nn.Embedding(cfg.vocab_size, cfg.hidden_size),
            layers=nn.ModuleList([*(DeepseekLayer(cfg, i) for i in range(n)),
                                  *(DeepseekMTPLayer(cfg, n) for _ in range(d))]),
            norm=RMSNorm(cfg.hidden_size, cfg.rms_norm_eps),
        ))
        self.mtp_logits = []
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """The main head's logits; the MTP depths' logits are left in mtp_logits (see mtp_loss)."""
        cfg = self.config
        rope = DeepseekRope(cfg, idx.shape[1])
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers[:cfg.num_hidden_layers]:
            x = layer(x, rope)
        h = self.model.norm(x)
        self.mtp_logits = []
        for k, depth in enumerate(self.model.layers[cfg.num_hidden_layers:], start=1):
            h = depth(self.model.embed_tokens(shift_left(idx, k, 0)), h, rope)
            self.mtp_logits.append(h @ self.head_weight().t())
        return self.model.norm(x) @ self.head_weight().t()

    def mtp_loss(self, labels: torch.Tensor) -> torch.Tensor:
        """mtp_loss_scaling_factor / D * sum over depths k of the mean cross-entropy on the labels k ahead."""
        if not self.mtp_logits:
            return torch.zeros(())
        losses = [F.cross_entropy(logits.reshape(-1, logits.shape[-1]), shift_left(labels, k, -100).reshape(-1))
                  for k, logits in enumerate(self.mtp_logits, start=1)]
        return DeepseekConfig.MTP_LOSS_SCALING_FACTOR / len(losses) * sum(losses)


# ----------------------------------------------------------------------------------------------
# Construction, HF folders, random init
# ----------------------------------------------------------------------------------------------

def build_model(cfg) -> nn.Module:
    if isinstance(cfg, DeepseekConfig):
        return Deepseek(cfg)
    return GPT2(cfg) if isinstance(cfg, GPT2Config) else Llama(cfg)


def embedding_name(model: nn.Module) -> str:
    return "transformer.wte.weight" if isinstance(model, GPT2) else "model.embed_tokens.weight"


@torch.no_grad()
def random_init(model: nn.Module, seed: int) -> nn.Module:
    """Norm weights 1; every other tensor, biases included, ~ N(0, 0.02) from a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    norm_weights = {f"{m}.weight" for m, mod in model.named_modules() if isinstance(mod, (nn.LayerNorm, RMSNorm))}
    for name, p in model.named_parameters():
        if name.endswith("e_score_correction_bias"):
            continue  # starts at zero: moved by balancing, not initialised
        if name in norm_weights:
            p.fill_(1.0)
        else:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return model


def _canonical_name(cfg, name: str) -> str | None:
    """HF tensor name -> our parameter name; None for non-parameter entries to ignore."""
    if isinstance(cfg, GPT2Config):
        if name.split(".")[-2:] in (["attn", "bias"], ["attn", "masked_bias"]):
            return None  # causal-mask buffers found in older GPT-2 checkpoints
        if not name.startswith("transformer.") and name != "lm_head.weight":
            return "transformer." + name
    return name


def _interleaved_heads(cfg, name: str) -> int:
    """Heads whose rows of parameter `name` an interleaved-RoPE Llama orders differently from HF (0: none)."""
    if getattr(cfg, "rope_layout", "half") != "interleaved":
        return 0
    if name.endswith("self_attn.q_proj.weight"):
        return cfg.num_attention_heads
    return cfg.num_key_value_heads if name.endswith("self_attn.k_proj.weight") else 0


def load_hf(folder, rope_layout: str = "half") -> nn.Module:
    """Loads config.json + model.safetensors. Every parameter must be present; a tied model may
    carry an lm_head.weight only if it equals the embedding. rope_layout "interleaved" builds the
    Llama with interleaved RoPE, its q/k rows taken out of HF order."""
    folder = Path(folder)
    cfg = config_from_hf(json.loads((folder / "config.json").read_text()))
    if rope_layout != "half":
        cfg = replace(cfg, rope_layout=rope_layout)
    model = build_model(cfg)
    raw = read_safetensors(folder / "model.safetensors")
    tensors = {}
    for name, array in raw.items():
        canon = _canonical_name(cfg, name)
        if canon is not None:
            tensors[canon] = torch.from_numpy(array.astype(np.float32))
    params = dict(model.named_parameters())
    emb = embedding_name(model)
    for name, copied in mtp_copies(model).items():  # DeepSeek-V3's MTP layers repeat the embedding and head
        if name in tensors:
            if copied not in tensors or not torch.equal(tensors.pop(name), tensors[copied]):
                raise ValueError(f"{folder}: {name} differs from {copied}, which this model shares")
    if cfg.tie_word_embeddings and "lm_head.weight" in tensors:
        head = tensors.pop("lm_head.weight")
        if emb in tensors and not torch.equal(head, tensors[emb]):
            raise ValueError(f"{folder}: tied model but lm_head.weight differs from {emb}")
    missing = sorted(set(params) - set(tensors))
    unexpected = sorted(set(tensors) - set(params))
    if missing or unexpected:
        raise ValueError(f"{folder}: missing tensors {missing}, unexpected tensors {unexpected}")
    with torch.no_grad():
        for name, p in params.items():
            if tuple(tensors[name].shape) != tuple(p.shape):
                raise ValueError(f"{folder}: {name} has shape {tuple(tensors[name].shape)}, expected {tuple(p.shape)}")
            heads = _interleaved_heads(cfg, name)
            p.copy_(hf_rows_to_interleaved(tensors[name], heads) if heads else tensors[name])
    return model


def mtp_copies(model: nn.Module) -> dict[str, str]:
    """HF name of each copy a DeepSeek-V3 file keeps in its MTP layers -> the name of the tensor it copies."""
    if not isinstance(model, Deepseek):
        return {}
    cfg = model.config
    head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    out = {}
    for i in range(cfg.num_hidden_layers, cfg.num_hidden_layers + cfg.num_nextn_predict_layers):
        out[f"model.layers.{i}.embed_tokens.weight"] = "model.embed_tokens.weight"
        out[f"model.layers.{i}.shared_head.head.weight"] = head
    return out


def hf_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters as an HF file holds them: HF names, q/k rows of an interleaved model in HF order,
    DeepSeek-V3's copies of the embedding and head in its MTP layers."""
    out = {}
    for name, p in model.named_parameters():
        heads = _interleaved_heads(model.config, name)
        out[name] = interleaved_rows_to_hf(p.detach(), heads) if heads else p.detach()
    for name, copied in mtp_copies(model).items():
        out[name] = out[copied].clone()
    return out


def save_hf(model: nn.Module, folder) -> None:
    """Writes config.json and model.safetensors (fp32, HF names and layout, no lm_head when tied)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2) + "\n")
    write_safetensors(folder / "model.safetensors", hf_tensors(model), {"format": "pt"})


# ----------------------------------------------------------------------------------------------
# Megatron .bin/.idx dataset
# ----------------------------------------------------------------------------------------------

MMIDIDX_MAGIC = b"MMIDIDX\x00\x00"
MMIDIDX_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
                  6: np.float64, 7: np.float32, 8: np.uint16}


def read_megatron_tokens(prefix) -> np.ndarray:
    """All tokens of prefix.bin, sequences concatenated in index order, as int64."""
    idx = Path(f"{prefix}.idx").read_bytes()
    if idx[:9] != MMIDIDX_MAGIC:
        raise ValueError(f"{prefix}.idx: bad magic {idx[:9]!r}")
    version, code, n_seq, n_doc = struct.unpack_from("<QBQQ", idx, 9)
    if version != 1:
        raise ValueError(f"{prefix}.idx: unsupported version {version}")
    dtype = np.dtype(MMIDIDX_DTYPES[code]).newbyteorder("<")
    offset = 9 + struct.calcsize("<QBQQ")
    lengths = np.frombuffer(idx, dtype="<i4", count=n_seq, offset=offset)
    pointers = np.frombuffer(idx, dtype="<i8", count=n_seq, offset=offset + 4 * n_seq)
    data = Path(f"{prefix}.bin").read_bytes()
    parts = [np.frombuffer(data, dtype=dtype, count=int(n), offset=int(p)) for n, p in zip(lengths, pointers)]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


class TokenSamples:
    """In-order samples (data.shuffle = false): sample i = tokens[j*T : j*T + T + 1] with j = i modulo the
    number of samples, as the stream wraps around at its end. Inputs are a sample's first T tokens,
    labels its last T."""

    def __init__(self, tokens: np.ndarray, seq_len: int):
        self.tokens = torch.from_numpy(tokens)
        self.seq_len = seq_len

    def __len__(self):
        return (len(self.tokens) - 1) // self.seq_len

    def batch(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.seq_len
        rows = torch.stack([self.tokens[j * t:j * t + t + 1] for j in (i % len(self) for i in indices)])
        return rows[:, :-1], rows[:, 1:]


class RowSamples:
    """Samples given as rows of T + 1 tokens, rows[i] for sample i: a Megatron GPTDataset or
    BlendedDataset restated in data_reference.py."""

    def __init__(self, rows):
        self.rows = rows

    def batch(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.from_numpy(np.array([self.rows[i] for i in indices], dtype=np.int64))
        return rows[:, :-1], rows[:, 1:]


# ----------------------------------------------------------------------------------------------
# Optimizer and reference training
# ----------------------------------------------------------------------------------------------

def decays(model: nn.Module) -> dict[str, bool]:
    """Parameter name -> whether AdamW weight decay applies: everything except norms, biases
    and embeddings (a tied head is the embedding, so it does not decay; an untied head does)."""
    exempt = set()
    for mname, mod in model.named_modules():
        if isinstance(mod, (nn.LayerNorm, RMSNorm, nn.Embedding)):
            exempt.update(f"{mname}.{p}" for p, _ in mod.named_parameters(recurse=False))
    return {n: not (n in exempt or n.endswith(".bias")) for n, _ in model.named_parameters()}


class AdamW:
    """torch.optim.AdamW's update (amsgrad off) written out, over two groups (decay / no decay).
    Step t (1-based): p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)."""

    def __init__(self, model: nn.Module, lr: float, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
        flags = decays(model)
        self.params = [(p, weight_decay if flags[n] else 0.0) for n, p in model.named_parameters()]
        self.lr, self.betas, self.eps = lr, betas, eps
        self.exp_avg = [torch.zeros_like(p) for p, _ in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p, _ in self.params]
        self.t = 0

    @torch.no_grad()
    def step(self):
        self.t += 1
        b1, b2 = self.betas
        bc1, bc2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for (p, wd), m, v in zip(self.params, self.exp_avg, self.exp_avg_sq):
            if p.grad is None:
                continue
            p.mul_(1 - self.lr * wd)
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            denom = (v.sqrt() / math.sqrt(bc2)).add_(self.eps)
            p.addcdiv_(m, denom, value=-self.lr / bc1)


def torch_adamw(model: nn.Module, lr: float, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
    """torch.optim.AdamW with the same two groups as AdamW above."""
    flags = decays(model)
    named = list(model.named_parameters())
    return torch.optim.AdamW([
        {"params": [p for n, p in named if flags[n]], "weight_decay": weight_decay},
        {"params": [p for n, p in named if not flags[n]], "weight_decay": 0.0},
    ], lr=lr, betas=betas, eps=eps)


@dataclass
class TrainSettings:
    """The optimizer/batch settings the end-to-end tests give both trainers."""
    steps: int = 5
    batch: int = 4  # global batch (samples per optimizer step)
    lr: float = 1e-3  # peak lr
    min_lr: float = 0.0
    warmup: int = 0  # optimizer.lr_warmup_iters
    decay_style: str = "constant"  # "constant", "linear" or "cosine"
    decay_iters: int = 0  # optimizer.lr_decay_iters; 0: steps, as Megaton defaults to train_iters
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    eps: float = 1e-8
    clip: float = 1.0


def scheduled_lr(s: TrainSettings, update: int) -> float:
    """The lr of optimizer update `update` (1-based): Megatron's OptimizerParamScheduler.get_lr with
    init lr 0, restated by shape. Warmup climbs in a straight line from 0 to the peak at update
    `warmup`; then "constant" holds the peak, "linear" falls in a straight line to min_lr at
    `decay_iters`, "cosine" falls along cos^2(pi/2 * done), which is Megatron's (1 + cos(pi * done)) / 2
    for the fraction `done` of that span; past it, min_lr. Megaton indexes the schedule by the number
    of the update being made (trainer.cpp), so the first warmup update already moves the weights."""
    peak, floor, warmup = s.lr, s.min_lr, s.warmup
    if warmup > 0 and update <= warmup:
        return peak * update / warmup
    if s.decay_style == "constant":
        return peak
    decay_end = s.decay_iters or s.steps
    done = min((update - warmup) / (decay_end - warmup), 1.0)  # fraction of the decay behind us
    left = {"linear": 1.0 - done, "cosine": math.cos(math.pi / 2 * done) ** 2}[s.decay_style]
    return floor + (peak - floor) * left


def train_reference(model: nn.Module, samples, s: TrainSettings, bf16: bool = False) -> list[dict]:
    """Step k (0-based) trains on samples k*B .. k*B+B-1 of `samples` (TokenSamples or RowSamples) as
    one batch, at the scheduled lr. Returns per-step {"step", "loss" (before the update), "grad_norm"
    (before clipping), "lr"}. bf16: the forward under PyTorch's CPU autocast to bfloat16 (its GEMMs in
    bf16, the loss in fp32 on fp32 logits), fp32 parameters, gradients and AdamW state."""
    opt = AdamW(model, s.lr, s.betas, s.eps, s.weight_decay)
    history = []
    for k in range(s.steps):
        inputs, labels = samples.batch(range(k * s.batch, (k + 1) * s.batch))
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(inputs)
        loss = lm_loss(logits.float(), labels)
        (loss + aux_loss(model, labels)).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), s.clip)
        opt.lr = scheduled_lr(s, k + 1)
        opt.step()
        for m in model.modules():
            if isinstance(m, DeepseekMoE):
                m.update_bias()
        history.append({"step": k + 1, "loss": loss.item(), "grad_norm": norm.item(), "lr": opt.lr})
    return history


def aux_loss(model: nn.Module, labels: torch.Tensor) -> torch.Tensor:
    """What training adds to the LM loss of the model's latest forward, reported apart from it: the MoE
    layers' balancing losses and DeepSeek's multi-token prediction loss (zero without them)."""
    balance = sum((m.balance_loss for m in model.modules() if isinstance(m, (MixtralSparseMoe, DeepseekMoE))),
                  torch.zeros(()))
    return balance + (model.mtp_loss(labels) if isinstance(model, Deepseek) else torch.zeros(()))


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in float64 (plain |a - b| when b is zero)."""
    a = torch.as_tensor(np.asarray(a, dtype=np.float64))
    b = torch.as_tensor(np.asarray(b, dtype=np.float64))
    denom = b.norm().item()
    diff = (a - b).norm().item()
    return diff / denom if denom > 0 else diff
