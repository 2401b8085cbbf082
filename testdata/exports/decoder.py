#!/usr/bin/python3
"""Exports a tiny Llama-style decoder-only transformer as two ONNX models that share weights.

What it builds (plain torch, written for this test data, random deterministic weights):
  token embedding (vocab 256, hidden 64) -> 2 layers of
    RMSNorm (pow/mean/rsqrt) -> attention with 4 heads of 16, rotary position embedding
    (cos/sin from position ids inside the model, rotate_half by slicing + cat), a causal mask
    built inside the model from the sequence lengths (torch.full + torch.triu, zeros for the past
    columns, expand), a KV cache (cat of past and new keys/values) -> residual
    RMSNorm -> SiLU-gated MLP (intermediate 128) -> residual
  -> final RMSNorm -> lm_head Linear.

Two exports of the SAME module instance, opset 17, so every weight is byte-identical across them:
  decoder_prefill.onnx  input_ids int64 [batch, seq]
                        -> logits [batch, seq, 256], present_{k,v}_{0,1} [batch, 4, seq, 16]
  decoder_decode.onnx   input_ids int64 [batch, seq], past_{k,v}_{0,1} float [batch, 4, past, 16]
                        -> logits [batch, seq, 256], present_{k,v}_{0,1} [batch, 4, total, 16]
Position ids in the decode model are torch.arange(past, past + seq), so the graph carries the
Shape -> Gather -> Add -> Range arithmetic real exporters produce.

Why: test data for ctxgen's handling of real torch.onnx exports -- shape arithmetic on symbolic
dims, dynamic axes made static with --fix-dim (prefill: batch=1 seq=128; decode: batch=1 seq=1
past=127), and weight sharing across models with `ctxgen share`.

Regenerate (from the repository root; needs Debian's python3-torch and python3-onnx):
    /usr/bin/python3 testdata/exports/decoder.py
The .onnx files are written next to this script.
"""
import math
import os
import sys
import warnings

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

from describe import describe

HERE = os.path.dirname(os.path.abspath(__file__))
OPSET = 17

VOCAB = 256
HIDDEN = 64
LAYERS = 2
HEADS = 4
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 128
ROPE_BASE = 10000.0
EPS = 1e-6


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x


class Rotary(nn.Module):
    """cos/sin tables computed from position ids at run time (no precomputed cache)."""

    def __init__(self, head_dim, base=ROPE_BASE):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, position_ids):
        # position_ids [batch, seq] int64 -> cos, sin [batch, 1, seq, head_dim]
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[:, None, :, :], emb.sin()[:, None, :, :]


def rotate_half(x):
    half = x.shape[-1] // 2
    x1 = x[..., :half]
    x2 = x[..., half:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q, k, cos, sin):
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def causal_mask(batch, seq, past, dtype):
    """Additive mask [batch, 1, seq, past + seq]: 0 where a query may attend, dtype-min elsewhere."""
    neg = torch.finfo(dtype).min
    mask = torch.full((seq, seq), neg, dtype=dtype)
    mask = torch.triu(mask, diagonal=1)
    if past is not None:
        mask = torch.cat((torch.zeros(seq, past, dtype=dtype), mask), dim=-1)
    return mask[None, None, :, :].expand(batch, 1, seq, mask.shape[-1])


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def forward(self, x, cos, sin, mask, past_k=None, past_v=None):
        bsz, seq, _ = x.shape
        q = self.q_proj(x).view(bsz, seq, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.k_proj(x).view(bsz, seq, HEADS, HEAD_DIM).transpose(1, 2)
        v = self.v_proj(x).view(bsz, seq, HEADS, HEAD_DIM).transpose(1, 2)
        q, k = apply_rotary(q, k, cos, sin)
        if past_k is not None:
            k = torch.cat((past_k, k), dim=2)
            v = torch.cat((past_v, v), dim=2)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(HEAD_DIM)
        scores = scores + mask
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v)
        out = out.transpose(1, 2).reshape(bsz, seq, HEADS * HEAD_DIM)
        return self.o_proj(out), k, v


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.up_proj = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.down_proj = nn.Linear(INTERMEDIATE, HIDDEN, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = RMSNorm(HIDDEN)
        self.self_attn = Attention()
        self.post_attention_layernorm = RMSNorm(HIDDEN)
        self.mlp = MLP()

    def forward(self, x, cos, sin, mask, past_k=None, past_v=None):
        h, k, v = self.self_attn(self.input_layernorm(x), cos, sin, mask, past_k, past_v)
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k, v


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.rotary = Rotary(HEAD_DIM)
        self.layers = nn.ModuleList([Layer() for _ in range(LAYERS)])
        self.norm = RMSNorm(HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, input_ids, past=None):
        """past: None or a list of (k, v) per layer. Returns logits and a flat list k0, v0, k1, v1."""
        bsz, seq = input_ids.shape
        past_len = past[0][0].shape[2] if past is not None else 0
        position_ids = torch.arange(past_len, past_len + seq, dtype=torch.long).unsqueeze(0)
        position_ids = position_ids.expand(bsz, seq)
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(position_ids)
        mask = causal_mask(bsz, seq, past_len if past is not None else None, x.dtype)
        presents = []
        for i, layer in enumerate(self.layers):
            pk, pv = past[i] if past is not None else (None, None)
            x, k, v = layer(x, cos, sin, mask, pk, pv)
            presents += [k, v]
        return (self.lm_head(self.norm(x)), *presents)


class Prefill(nn.Module):
    def __init__(self, decoder):
        super().__init__()
        self.model = decoder

    def forward(self, input_ids):
        return self.model(input_ids)


class Decode(nn.Module):
    def __init__(self, decoder):
        super().__init__()
        self.model = decoder

    def forward(self, input_ids, past_k_0, past_v_0, past_k_1, past_v_1):
        return self.model(input_ids, [(past_k_0, past_v_0), (past_k_1, past_v_1)])


def build():
    torch.manual_seed(0)
    decoder = Decoder()
    with torch.no_grad():
        # Random, non-trivial norm weights (ones would hide a missing multiply).
        for module in decoder.modules():
            if isinstance(module, RMSNorm):
                module.weight.copy_(1.0 + 0.1 * torch.randn_like(module.weight))
    return decoder.eval()


def export(module, args, path, input_names, output_names, dynamic_axes):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.onnx.export(module, args, path, opset_version=OPSET, input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes,
                          do_constant_folding=True)
    for w in caught:
        print("   exporter warning: %s: %s" % (w.category.__name__, str(w.message).splitlines()[0]))


def check_input_dims(model, expected):
    """expected: {input name: [dim_param or dim_value, ...]}"""
    for vi in model.graph.input:
        got = [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.name in expected and got != expected[vi.name]:
            sys.exit("%s: input %s has dims %s, expected %s" % (model.graph.name, vi.name, got,
                                                                 expected[vi.name]))


def main():
    decoder = build()
    prefill, decode = Prefill(decoder), Decode(decoder)
    present = ["present_%s_%d" % (kv, i) for i in range(LAYERS) for kv in "kv"]
    past = ["past_%s_%d" % (kv, i) for i in range(LAYERS) for kv in "kv"]

    # Trace with sizes that are all distinct and > 1 so no dim gets specialised to a constant.
    gen = torch.Generator().manual_seed(1)
    batch, seq, past_len = 2, 5, 3
    ids_full = torch.randint(0, VOCAB, (batch, past_len + seq), generator=gen)

    with torch.no_grad():
        # Torch sanity check: prefill of the whole sequence == prefill of a prefix + decode of the rest.
        full = prefill(ids_full)
        head = prefill(ids_full[:, :past_len])
        tail = decode(ids_full[:, past_len:], *head[1:])
        err_logits = (full[0][:, past_len:] - tail[0]).abs().max().item()
        err_kv = max((a - b).abs().max().item() for a, b in zip(full[1:], tail[1:]))
        print("torch: logits %s, present %s; prefill vs prefill+decode max |diff| logits %.3g, kv %.3g"
              % (tuple(full[0].shape), tuple(full[1].shape), err_logits, err_kv))
        if err_logits > 1e-4 or err_kv > 1e-4:
            sys.exit("KV cache inconsistent")

    prefill_path = os.path.join(HERE, "decoder_prefill.onnx")
    decode_path = os.path.join(HERE, "decoder_decode.onnx")

    axes = {"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    export(prefill, (ids_full[:, :seq],), prefill_path, ["input_ids"], ["logits"] + present,
           dict(axes, **{n: {0: "batch", 2: "seq"} for n in present}))

    past_tensors = tuple(t.contiguous() for t in head[1:])
    axes = dict(axes, **{n: {0: "batch", 2: "past"} for n in past})
    axes.update({n: {0: "batch", 2: "total"} for n in present})
    export(decode, (ids_full[:, past_len:],) + past_tensors, decode_path, ["input_ids"] + past,
           ["logits"] + present, axes)

    m = describe(prefill_path)
    check_input_dims(m, {"input_ids": ["batch", "seq"]})
    m = describe(decode_path)
    check_input_dims(m, dict({"input_ids": ["batch", "seq"]},
                             **{n: ["batch", HEADS, "past", HEAD_DIM] for n in past}))

    # Every initializer of prefill must exist byte-identically in decode (weight sharing).
    a = {t.raw_data for t in onnx.load(prefill_path).graph.initializer}
    b = {t.raw_data for t in onnx.load(decode_path).graph.initializer}
    print("shared initializers: %d of %d (prefill) / %d (decode) byte-identical"
          % (len(a & b), len(a), len(b)))


if __name__ == "__main__":
    main()
