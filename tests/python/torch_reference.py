"""Independent plain-PyTorch reference for Megaton (fp32, eager, no fused kernels).

Contents:
  * safetensors read/write with numpy (no `safetensors` package needed)
  * HF GPT-2 (GPT2LMHeadModel) and HF Llama (LlamaForCausalLM) re-implemented from their
    definitions; parameter names are the HF checkpoint names, so `named_parameters()` is the
    checkpoint layout (a tied head has no parameter of its own: it reuses the embedding)
  * HF folder load/save (config.json + model.safetensors) and seeded random init
  * Megatron MMIDIDX .bin/.idx reader and the sample layout Megaton uses
  * AdamW (a restatement of torch.optim.AdamW with Megaton's two weight-decay groups) and a
    reference training loop with global grad-norm clipping
  * the end-to-end harness shared by test_gpt_torch.py / test_llama_torch.py: runs the `megaton`
    CLI (preprocess, eval --dump-grads, train) and compares against this reference

Run this file directly for its self-tests: /usr/bin/python3 tests/python/torch_reference.py
"""
from __future__ import annotations

import json
import math
import shutil
import struct
import subprocess
import sys
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------------
# safetensors
# ----------------------------------------------------------------------------------------------

# safetensors dtype name -> numpy dtype (BF16 is handled separately: numpy has no bfloat16).
_ST_TO_NUMPY = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U8": np.uint8, "U16": np.uint16, "BOOL": np.bool_,
}
_NUMPY_TO_ST = {np.dtype(v): k for k, v in _ST_TO_NUMPY.items()}


def read_safetensors(path) -> dict[str, np.ndarray]:
    """Reads every tensor of a .safetensors file. BF16 is widened to float32."""
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

    @property
    def dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    def to_hf(self) -> dict:
        return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **asdict(self)}


def config_from_hf(hf: dict):
    """Builds a GPT2Config / LlamaConfig from a config.json dict, ignoring unrelated HF keys."""
    kind = hf.get("model_type")
    cls = {"gpt2": GPT2Config, "llama": LlamaConfig}.get(kind)
    if cls is None:
        raise ValueError(f"unsupported model_type {kind!r}")
    known = cls.__dataclass_fields__
    cfg = cls(**{k: v for k, v in hf.items() if k in known})
    if kind == "gpt2" and cfg.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"unsupported GPT-2 activation {cfg.activation_function!r}")
    if kind == "llama" and cfg.rope_scaling is not None:
        rope_type = cfg.rope_scaling.get("rope_type", cfg.rope_scaling.get("type"))
        if rope_type != "llama3":
            raise ValueError(f"unsupported rope_scaling {cfg.rope_scaling!r}")
    return cfg


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

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        h, kv, d = self.cfg.num_attention_heads, self.cfg.num_key_value_heads, self.cfg.dim
        q = self.q_proj(x).view(b, t, h, d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, kv, d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, kv, d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
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

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.model = nn.ModuleDict(dict(
            embed_tokens=nn.Embedding(cfg.vocab_size, cfg.hidden_size),
            layers=nn.ModuleList(LlamaLayer(cfg) for _ in range(cfg.num_hidden_layers)),
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
        angles = torch.cat((freqs, freqs), dim=-1)  # [T, D], HF rotate_half layout
        cos, sin = angles.cos(), angles.sin()
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.model.norm(x) @ self.head_weight().t()


# ----------------------------------------------------------------------------------------------
# Construction, HF folders, random init
# ----------------------------------------------------------------------------------------------

def build_model(cfg) -> nn.Module:
    return GPT2(cfg) if isinstance(cfg, GPT2Config) else Llama(cfg)


def embedding_name(model: nn.Module) -> str:
    return "transformer.wte.weight" if isinstance(model, GPT2) else "model.embed_tokens.weight"


@torch.no_grad()
def random_init(model: nn.Module, seed: int) -> nn.Module:
    """Norm weights 1; every other tensor, biases included, ~ N(0, 0.02) from a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    norm_weights = {f"{m}.weight" for m, mod in model.named_modules() if isinstance(mod, (nn.LayerNorm, RMSNorm))}
    for name, p in model.named_parameters():
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


def load_hf(folder) -> nn.Module:
    """Loads config.json + model.safetensors. Every parameter must be present; a tied model may
    carry an lm_head.weight only if it equals the embedding."""
    folder = Path(folder)
    cfg = config_from_hf(json.loads((folder / "config.json").read_text()))
    model = build_model(cfg)
    raw = read_safetensors(folder / "model.safetensors")
    tensors = {}
    for name, array in raw.items():
        canon = _canonical_name(cfg, name)
        if canon is not None:
            tensors[canon] = torch.from_numpy(array.astype(np.float32))
    params = dict(model.named_parameters())
    emb = embedding_name(model)
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
            p.copy_(tensors[name])
    return model


def save_hf(model: nn.Module, folder) -> None:
    """Writes config.json and model.safetensors (fp32, HF names, no lm_head when tied)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2) + "\n")
    write_safetensors(folder / "model.safetensors", dict(model.named_parameters()), {"format": "pt"})


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
    """Sample i = tokens[i*T : i*T + T + 1]: inputs are its first T tokens, labels its last T."""

    def __init__(self, tokens: np.ndarray, seq_len: int):
        self.tokens = torch.from_numpy(tokens)
        self.seq_len = seq_len

    def __len__(self):
        return (len(self.tokens) - 1) // self.seq_len

    def batch(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.seq_len
        rows = torch.stack([self.tokens[i * t:i * t + t + 1] for i in indices])
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
    lr: float = 1e-3
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    eps: float = 1e-8
    clip: float = 1.0


def train_reference(model: nn.Module, samples: TokenSamples, s: TrainSettings) -> list[dict]:
    """Unshuffled training: step k (0-based) uses samples k*B .. k*B+B-1 modulo len(samples).
    Returns per-step {"step", "loss" (before the update), "grad_norm" (before clipping)}."""
    opt = AdamW(model, s.lr, s.betas, s.eps, s.weight_decay)
    history = []
    for k in range(s.steps):
        inputs, labels = samples.batch([(k * s.batch + j) % len(samples) for j in range(s.batch)])
        model.zero_grad(set_to_none=True)
        loss = lm_loss(model(inputs), labels)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), s.clip)
        opt.step()
        history.append({"step": k + 1, "loss": loss.item(), "grad_norm": norm.item()})
    return history


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in float64 (plain |a - b| when b is zero)."""
    a = torch.as_tensor(np.asarray(a, dtype=np.float64))
    b = torch.as_tensor(np.asarray(b, dtype=np.float64))
    denom = b.norm().item()
    diff = (a - b).norm().item()
    return diff / denom if denom > 0 else diff


# ----------------------------------------------------------------------------------------------
# End-to-end harness (shared by test_gpt_torch.py and test_llama_torch.py)
# ----------------------------------------------------------------------------------------------

def last_json_with(text: str, key: str) -> dict | None:
    """The last line of `text` that parses as a JSON object holding `key` (CLI output mixes logs)."""
    for line in reversed(text.strip().splitlines()):
        try:
            result = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(result, dict) and key in result:
            return result
    return None


class MegatonError(RuntimeError):
    pass


class MegatonCli:
    """Runs `megaton <subcommand> ...`, turning every failure into a message naming the subcommand."""

    def __init__(self, binary):
        self.binary = Path(binary)
        if not self.binary.is_file():
            raise MegatonError(f"megaton binary not found at {self.binary}")

    def run(self, subcommand: str, *args, expect_files=()) -> str:
        cmd = [str(self.binary), subcommand, *map(str, args)]
        print("$ " + " ".join(cmd), flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise MegatonError(f"`megaton {subcommand}` exited with code {proc.returncode} "
                               f"(subcommand missing or failing)\nstdout:\n{proc.stdout[-2000:]}\n"
                               f"stderr:\n{proc.stderr[-2000:]}")
        missing = [str(f) for f in expect_files if not Path(f).exists()]
        if missing:
            raise MegatonError(f"`megaton {subcommand}` exited 0 but did not create {missing} "
                               f"(subcommand '{subcommand}' not implemented?)\nstdout:\n{proc.stdout[-2000:]}")
        return proc.stdout

    def preprocess(self, text_file, prefix) -> None:
        self.run("preprocess", "--input", text_file, "--output-prefix", prefix, "--tokenizer", "byte",
                 "--append-eod", expect_files=[f"{prefix}.bin", f"{prefix}.idx"])

    def eval(self, model_dir, prefix, seq_len, max_samples, grads_file) -> dict:
        out = self.run("eval", "--model", model_dir, "--data", prefix, "--seq-len", seq_len,
                       "--max-samples", max_samples, "--dump-grads", grads_file, expect_files=[grads_file])
        result = last_json_with(out, "loss")
        if result is not None:
            return result
        raise MegatonError(f"`megaton eval` printed no JSON line with a \"loss\"; stdout:\n{out[-2000:]}")

    def train(self, config_file, run_dir) -> list[dict]:
        metrics = Path(run_dir) / "metrics.jsonl"
        final = Path(run_dir) / "final"
        self.run("train", "--config", config_file,
                 expect_files=[metrics, final / "config.json", final / "model.safetensors"])
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        return [r for r in rows if {"step", "loss", "grad_norm"} <= r.keys()]


class Checker:
    """Collects named comparisons, prints one line each, and decides the exit status."""

    def __init__(self):
        self.failures = []

    def value(self, label: str, err: float, tol: float, detail: str = "") -> None:
        ok = err < tol  # NaN fails
        print(f"  [{'ok' if ok else 'FAIL'}] {label}: rel_err={err:.3e} (tol {tol:.0e}){' ' + detail if detail else ''}")
        if not ok:
            self.failures.append(f"{label}: rel_err={err:.3e} >= {tol:.0e} {detail}")

    def fail(self, label: str, message: str) -> None:
        print(f"  [FAIL] {label}: {message}")
        self.failures.append(f"{label}: {message.splitlines()[0] if message else ''}")

    def tensors(self, label: str, got: dict, want: dict, tol: float) -> None:
        """Compares two name -> array maps tensor by tensor (all names of `want` must be in `got`)."""
        for name in sorted(want):
            if name not in got:
                self.fail(f"{label} {name}", "missing")
            elif tuple(got[name].shape) != tuple(want[name].shape):
                self.fail(f"{label} {name}", f"shape {tuple(got[name].shape)}, expected {tuple(want[name].shape)}")
            else:
                self.value(f"{label} {name}", rel_err(got[name], want[name]), tol,
                           f"|ref|={np.linalg.norm(np.asarray(want[name], dtype=np.float64)):.3e}")
        extra = sorted(set(got) - set(want))
        if extra:
            self.fail(f"{label}", f"unexpected tensors {extra}")

    def exit(self) -> None:
        if self.failures:
            print(f"\n{len(self.failures)} check(s) FAILED:")
            for f in self.failures:
                print("  - " + f)
            sys.exit(1)
        print("\nall checks passed")
        sys.exit(0)


# A few kilobytes of varied bytes (ASCII, digits, multi-byte UTF-8), one document per line.
def sample_corpus(n_lines: int = 60) -> str:
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dogs", "naïve", "café",
             "Σ", "→", "tensor", "gradient", "Megaton", "{json}", "x^2", "œuvre", "日本", "\t"]
    lines = []
    for i in range(n_lines):
        picked = [words[(i * 7 + j * 3) % len(words)] for j in range(6 + i % 5)]
        lines.append(f"{i}: " + " ".join(picked) + f" = {i * i % 97}.")
    return "\n".join(lines) + "\n"


@dataclass
class Case:
    """One end-to-end comparison: a model config, eval / train sizes, and micro-batch variants."""
    name: str
    config: object
    seed: int
    seq_len: int = 32
    eval_samples: int = 4
    train: TrainSettings = field(default_factory=TrainSettings)
    micro_batches: tuple = (4,)  # one `megaton train` run per micro_batch_size

    def train_toml(self, model_dir, prefix, run_dir, micro_batch) -> str:
        t = self.train
        return f"""[model]
load = "{model_dir}"
[data]
data_path = "{prefix}"
valid_data_path = "{prefix}"
shuffle = false
[training]
micro_batch_size = {micro_batch}
global_batch_size = {t.batch}
seq_length = {self.seq_len}
train_iters = {t.steps}
seed = 1
[optimizer]
lr = {t.lr!r}
min_lr = {t.lr!r}
lr_warmup_iters = 0
lr_decay_style = "constant"
weight_decay = {t.weight_decay!r}
adam_beta1 = {t.betas[0]!r}
adam_beta2 = {t.betas[1]!r}
adam_eps = {t.eps!r}
clip_grad = {t.clip!r}
[logging]
run_dir = "{run_dir}"
log_interval = 1
eval_interval = 0
save_interval = 0
"""


# Tolerances from the test specification.
LOSS_TOL, GRAD_TOL = 1e-5, 1e-4
TRAIN_LOSS_TOL, GRAD_NORM_TOL, WEIGHT_TOL = 1e-4, 1e-3, 1e-4


def _check_eval(cli, chk, case, model_dir, prefix, samples, work):
    model = load_hf(model_dir)
    inputs, labels = samples.batch(range(case.eval_samples))
    loss = lm_loss(model(inputs), labels)
    loss.backward()
    ref_grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
    grads_file = work / f"{case.name}_grads.safetensors"
    result = cli.eval(model_dir, prefix, case.seq_len, case.eval_samples, grads_file)
    print(f"  eval: megaton loss={result['loss']!r} tokens={result.get('tokens')}, torch loss={loss.item()!r}")
    chk.value(f"{case.name} eval loss", abs(result["loss"] - loss.item()) / abs(loss.item()), LOSS_TOL)
    want_tokens = case.eval_samples * case.seq_len
    if result.get("tokens") != want_tokens:
        chk.fail(f"{case.name} eval tokens", f"{result.get('tokens')!r}, expected {want_tokens}")
    chk.tensors(f"{case.name} grad", read_safetensors(grads_file), ref_grads, GRAD_TOL)


def _check_train(cli, chk, case, model_dir, prefix, samples, work):
    model = load_hf(model_dir)
    history = train_reference(model, samples, case.train)
    final = {n: p.detach().numpy() for n, p in model.named_parameters()}
    for mb in case.micro_batches:
        label = f"{case.name} train(mbs={mb},gbs={case.train.batch})"
        run_dir = work / f"{case.name}_run_mbs{mb}"
        shutil.rmtree(run_dir, ignore_errors=True)
        config_file = work / f"{case.name}_mbs{mb}.toml"
        config_file.write_text(case.train_toml(model_dir, prefix, run_dir, mb))
        try:
            rows = {r["step"]: r for r in cli.train(config_file, run_dir)}
        except MegatonError as e:
            chk.fail(label, str(e))
            continue
        for ref in history:
            got = rows.get(ref["step"])
            if got is None:
                chk.fail(f"{label} step {ref['step']}", "no metrics.jsonl line")
                continue
            print(f"  step {ref['step']}: megaton loss={got['loss']!r} grad_norm={got['grad_norm']!r} lr={got.get('lr')!r}; "
                  f"torch loss={ref['loss']!r} grad_norm={ref['grad_norm']!r}")
            chk.value(f"{label} step {ref['step']} loss", abs(got["loss"] - ref["loss"]) / abs(ref["loss"]), TRAIN_LOSS_TOL)
            chk.value(f"{label} step {ref['step']} grad_norm",
                      abs(got["grad_norm"] - ref["grad_norm"]) / abs(ref["grad_norm"]), GRAD_NORM_TOL)
            if "lr" in got and abs(got["lr"] - case.train.lr) > 1e-9 * case.train.lr:
                chk.fail(f"{label} step {ref['step']} lr", f"{got['lr']!r}, expected constant {case.train.lr!r}")
        try:
            exported = {n: p.detach().numpy() for n, p in load_hf(run_dir / "final").named_parameters()}
        except (ValueError, KeyError, OSError) as e:
            chk.fail(f"{label} final model", f"cannot load {run_dir / 'final'}: {e}")
            continue
        chk.tensors(f"{label} final", exported, final, WEIGHT_TOL)


def run_cases(cases: list[Case], argv=None) -> None:
    """Entry point of the end-to-end tests: preprocess once, then per case eval + train checks."""
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megaton", required=True, help="path to the megaton binary")
    parser.add_argument("--workdir", default=None, help="scratch folder (default: ./py_<script name>)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    work = Path(args.workdir or f"py_{Path(sys.argv[0]).stem}").resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    chk = Checker()
    try:
        cli = MegatonCli(args.megaton)
        text_file = work / "corpus.txt"
        text_file.write_text(sample_corpus(), encoding="utf-8")
        prefix = work / "corpus"
        cli.preprocess(text_file, prefix)
        tokens = read_megatron_tokens(prefix)
    except MegatonError as e:
        chk.fail("setup", str(e))
        chk.exit()
    print(f"dataset: {len(tokens)} tokens, ids in [{tokens.min()}, {tokens.max()}]")
    for case in cases:
        print(f"\n== {case.name}: {case.config.to_hf()}")
        if tokens.max() >= case.config.vocab_size or tokens.min() < 0:
            chk.fail(case.name, f"token ids outside [0, {case.config.vocab_size})")
            continue
        samples = TokenSamples(tokens, case.seq_len)
        if len(samples) < case.eval_samples:
            chk.fail(case.name, f"only {len(samples)} samples of length {case.seq_len}")
            continue
        model_dir = work / f"{case.name}_init"
        save_hf(random_init(build_model(case.config), case.seed), model_dir)
        for stage, fn in (("eval", _check_eval), ("train", _check_train)):
            try:
                fn(cli, chk, case, model_dir, prefix, samples, work)
            except MegatonError as e:
                chk.fail(f"{case.name} {stage}", str(e))
            except Exception:  # keep going so every case reports; the traceback says what broke
                chk.fail(f"{case.name} {stage}", traceback.format_exc())
    chk.exit()


# ----------------------------------------------------------------------------------------------
# Self-tests
# ----------------------------------------------------------------------------------------------

def _tiny_gpt2(tied=True) -> GPT2Config:
    return GPT2Config(vocab_size=257, n_positions=64, n_embd=48, n_layer=2, n_head=4, tie_word_embeddings=tied)


def _tiny_llama(tied=False, scaling=None) -> LlamaConfig:
    return LlamaConfig(vocab_size=257, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                       num_attention_heads=6, num_key_value_heads=2, head_dim=8, rope_theta=10000.0,
                       rope_scaling=scaling, max_position_embeddings=1024, tie_word_embeddings=tied)


LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 128}


def _selftest(tmp: Path) -> None:
    # safetensors round trip, metadata, bf16 decode.
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b.c": np.array([-1, 7], dtype=np.int64)}
    write_safetensors(tmp / "t.safetensors", arrays, {"format": "pt"})
    back = read_safetensors(tmp / "t.safetensors")
    assert back.keys() == arrays.keys() and all(np.array_equal(back[k], arrays[k]) for k in arrays)
    header_len = struct.unpack("<Q", (tmp / "t.safetensors").read_bytes()[:8])[0]
    assert header_len % 8 == 0
    bf16 = np.array([1.5, -2.25], dtype=np.float32).view(np.uint32) >> 16
    hdr = json.dumps({"x": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    (tmp / "bf.safetensors").write_bytes(struct.pack("<Q", len(hdr)) + hdr + bf16.astype("<u2").tobytes())
    assert read_safetensors(tmp / "bf.safetensors")["x"].tolist() == [1.5, -2.25]
    print("ok: safetensors round trip (f32, i64, metadata, 8-byte header padding, bf16 read)")

    # Megatron dataset: two sequences written with pointers out of order, read back in index order.
    seqs = [np.array([5, 6, 256], dtype=np.uint16), np.array([7, 8, 9, 256], dtype=np.uint16)]
    (tmp / "d.bin").write_bytes(seqs[1].tobytes() + seqs[0].tobytes())
    idx = MMIDIDX_MAGIC + struct.pack("<QBQQ", 1, 8, 2, 3)
    idx += np.array([3, 4], dtype="<i4").tobytes() + np.array([8, 0], dtype="<i8").tobytes()
    idx += np.array([0, 1, 2], dtype="<i8").tobytes()
    (tmp / "d.idx").write_bytes(idx)
    tokens = read_megatron_tokens(tmp / "d")
    assert tokens.tolist() == [5, 6, 256, 7, 8, 9, 256], tokens
    x, y = TokenSamples(tokens, 3).batch([1, 0])
    assert x.tolist() == [[7, 8, 9], [5, 6, 256]] and y.tolist() == [[8, 9, 256], [6, 256, 7]]
    print("ok: MMIDIDX reader and sample layout")

    # Losses at init are near ln(V) (a tied RMSNorm model sits a little above: each input token's
    # own embedding leaks into its logit); save/load round trips; GPT-2 bare names load.
    gen = torch.Generator().manual_seed(3)
    idx = torch.randint(0, 257, (2, 33), generator=gen)
    for cfg in (_tiny_gpt2(), _tiny_gpt2(tied=False), _tiny_llama(), _tiny_llama(True, LLAMA3_SCALING)):
        model = random_init(build_model(cfg), seed=1)
        loss = lm_loss(model(idx[:, :-1]), idx[:, 1:]).item()
        assert abs(loss - math.log(257)) < 0.1, (cfg, loss)
        folder = tmp / f"m_{type(cfg).__name__}_{cfg.tie_word_embeddings}"
        save_hf(model, folder)
        again = load_hf(folder)
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters()))
        print(f"ok: {type(cfg).__name__} tied={cfg.tie_word_embeddings} loss at init {loss:.4f} "
              f"(ln V = {math.log(257):.4f}), HF folder round trip")
    bare = {n.removeprefix("transformer."): p for n, p in random_init(GPT2(_tiny_gpt2()), 2).named_parameters()}
    bare["h.0.attn.bias"] = torch.ones(1, 1, 64, 64)  # legacy mask buffer: ignored
    (tmp / "bare").mkdir()
    (tmp / "bare" / "config.json").write_text(json.dumps(_tiny_gpt2().to_hf()))
    write_safetensors(tmp / "bare" / "model.safetensors", bare)
    assert torch.equal(load_hf(tmp / "bare").transformer.wte.weight, bare["wte.weight"])
    print("ok: GPT-2 bare tensor names and legacy attn.bias buffers load")

    # Causality: changing the last token leaves earlier logits unchanged.
    for cfg in (_tiny_gpt2(), _tiny_llama()):
        model = random_init(build_model(cfg), seed=4)
        changed = idx[:1, :32].clone()
        changed[0, -1] = (changed[0, -1] + 1) % 257
        a, b = model(idx[:1, :32]), model(changed)
        assert torch.allclose(a[:, :-1], b[:, :-1], atol=1e-6) and not torch.allclose(a[:, -1], b[:, -1])
    print("ok: causal masking (GPT-2, Llama)")

    # GQA: a 2-kv-head model equals the 6-kv-head model whose kv weights repeat each kv head 3 times.
    gqa = random_init(Llama(_tiny_llama()), seed=5)
    mha = Llama(LlamaConfig(**{**asdict(_tiny_llama()), "num_key_value_heads": 6}))
    with torch.no_grad():
        for name, p in mha.named_parameters():
            src = dict(gqa.named_parameters())[name]
            if name.endswith(("k_proj.weight", "v_proj.weight")):
                src = src.view(2, 1, 8, 48).expand(2, 3, 8, 48).reshape(48, 48)
            p.copy_(src)
    assert torch.allclose(gqa(idx), mha(idx), atol=1e-5)
    print("ok: GQA equals MHA with repeated kv heads")

    # llama3 scaling: for head_dim 8 / theta 1e4 / original 128 the four frequencies fall in the
    # kept, interpolated and divided bands; compare with values worked out by hand.
    inv = rope_inv_freq(_tiny_llama(scaling=LLAMA3_SCALING)).double()
    base = 1e4 ** -(torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    smooth = (128 / (2 * math.pi / base[1]) - 1) / 3
    want = torch.stack([base[0], (1 - smooth) * base[1] / 8 + smooth * base[1], base[2] / 8, base[3] / 8])
    assert torch.allclose(inv, want, rtol=1e-6), (inv, want)
    print(f"ok: llama3 rope scaling (smooth factor of the middle band {smooth:.3f})")

    # Weight-decay groups.
    flags = decays(GPT2(_tiny_gpt2(tied=False)))
    assert flags["lm_head.weight"] and flags["transformer.h.0.attn.c_attn.weight"]
    assert not any(flags[n] for n in ("transformer.wte.weight", "transformer.wpe.weight",
                                      "transformer.h.0.ln_1.weight", "transformer.h.0.mlp.c_fc.bias",
                                      "transformer.ln_f.bias"))
    flags = decays(Llama(_tiny_llama()))
    assert flags["lm_head.weight"] and flags["model.layers.1.mlp.down_proj.weight"]
    assert not any(flags[n] for n in ("model.embed_tokens.weight", "model.norm.weight",
                                      "model.layers.0.input_layernorm.weight"))
    print("ok: weight-decay groups")

    # Our AdamW against torch.optim.AdamW, with clipping, over 4 steps (bitwise equal expected).
    for cfg in (_tiny_gpt2(), _tiny_llama()):
        ours, theirs = random_init(build_model(cfg), 6), random_init(build_model(cfg), 6)
        opt_ours, opt_theirs = AdamW(ours, 1e-2), torch_adamw(theirs, 1e-2)
        for k in range(4):
            x, y = idx[:, k:k + 16], idx[:, k + 1:k + 17]
            for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
                model.zero_grad()
                lm_loss(model(x), y).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                opt.step()
        worst = max((p - q).abs().max().item() for p, q in zip(ours.parameters(), theirs.parameters()))
        assert worst == 0.0, worst
    print("ok: AdamW matches torch.optim.AdamW exactly (4 clipped steps, GPT-2 and Llama)")

    # Numerical floor of the end-to-end tolerances: the fp32 reference against the same math in
    # fp64 must pass them, or the tolerances would be unfair to any correct fp32 engine.
    samples = TokenSamples(idx.flatten().numpy(), 8)
    for cfg in (_tiny_gpt2(), _tiny_llama(), _tiny_llama(True, LLAMA3_SCALING)):
        m32 = random_init(build_model(cfg), 7)
        m64 = random_init(build_model(cfg), 7).double()
        s = TrainSettings(batch=2)
        h32, h64 = train_reference(m32, samples, s), train_reference(m64, samples, s)
        loss_err = max(abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(h32, h64))
        norm_err = max(abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"] for a, b in zip(h32, h64))
        w_err = {n: rel_err(p.detach().numpy(), q.detach().numpy())
                 for (n, p), (_, q) in zip(m32.named_parameters(), m64.named_parameters())}
        worst = max(w_err, key=w_err.get)
        print(f"ok: {type(cfg).__name__} fp32 vs fp64 after 5 steps: loss {loss_err:.1e}, "
              f"grad_norm {norm_err:.1e}, worst weight {worst} {w_err[worst]:.1e}")
        assert loss_err < TRAIN_LOSS_TOL and norm_err < GRAD_NORM_TOL and w_err[worst] < WEIGHT_TOL


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        _selftest(Path(d))
    print("torch_reference self-tests passed")
