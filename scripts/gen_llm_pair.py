#!/usr/bin/python3
"""Writes a transformer-shaped pair of ONNX models that share every weight under different names:
prefill.onnx (sequence 128) and decode.onnx (sequence 1), each with its own external data file,
or with --embedded its weights inside the .onnx (raw_data). --models N (with --embedded) writes
N models: the pair, then seq{K}.onnx for K = 64, 32, ... (sequence K, other names again).

    gen_llm_pair.py OUTDIR [--size-mb 500] [--hidden 1024] [--embedded [--models N]]

Each layer: LayerNorm, Q/K/V/O projections with softmax attention, LayerNorm, MLP (up 4x, Relu,
down), residual adds; about 12 * hidden^2 float32 weights per layer, layers added until the size is
reached. Every weight is distinct within a model and byte-identical across the models, so the unique
weight bytes equal one model's weights. External weights are written straight to their file, never
held whole in memory (embedded ones are: protobuf serialises a whole model). Needs Debian's
python3-onnx and python3-numpy.
"""
import argparse
import contextlib
import os

import numpy as np
import onnx
from onnx import TensorProto, helper

SCHEMES = {
    "prefill": dict(seq=128, name="model.layers.{i}.{w}.weight"),
    "decode": dict(seq=1, name="decoder.block{i}.{w}"),
}


def scheme(kind):
    if kind in SCHEMES:
        return SCHEMES[kind]
    seq = int(kind[len("seq"):])
    return dict(seq=seq, name="s%d.layer{i}.{w}" % seq)


def kinds(models):
    if not 2 <= models <= 8:
        raise SystemExit("--models: 2 to 8")
    return list(SCHEMES) + [f"seq{64 >> k}" for k in range(models - 2)]


def layer_weights(hidden):
    return [("q", (hidden, hidden)), ("k", (hidden, hidden)), ("v", (hidden, hidden)), ("o", (hidden, hidden)),
            ("up", (hidden, 4 * hidden)), ("down", (4 * hidden, hidden)), ("ln1", (hidden,)), ("ln2", (hidden,))]


def build(kind, layers, hidden, outdir, embedded):
    names = scheme(kind)
    seq = names["seq"]
    data_name = kind + ".weights"
    inits, nodes = [], []
    offset = 0
    with contextlib.nullcontext() if embedded else open(os.path.join(outdir, data_name), "wb") as data:
        def tensor(i, w, shape):
            nonlocal offset
            name = names["name"].format(i=i, w=w)
            # Same seed in both models: identical bytes under different names.
            rng = np.random.default_rng(1000 * i + sum(map(ord, w)))
            arr = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
            if w.startswith("ln"):
                arr = arr + np.float32(1.0)
            raw = arr.tobytes()
            if embedded:
                offset += len(raw)
                inits.append(TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape), raw_data=raw))
                return name
            pad = (-offset) % 64
            data.write(b"\0" * pad)
            offset += pad
            data.write(raw)
            t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape))
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(len(raw)))):
                entry = t.external_data.add()
                entry.key, entry.value = k, v
            offset += len(raw)
            inits.append(t)
            return name

        x = "hidden_in"
        for i in range(layers):
            w = {k: tensor(i, k, shape) for k, shape in layer_weights(hidden)}
            p = f"l{i}."
            nodes += [
                helper.make_node("LayerNormalization", [x, w["ln1"]], [p + "n1"], axis=-1),
                helper.make_node("MatMul", [p + "n1", w["q"]], [p + "q"]),
                helper.make_node("MatMul", [p + "n1", w["k"]], [p + "k"]),
                helper.make_node("MatMul", [p + "n1", w["v"]], [p + "v"]),
                helper.make_node("Transpose", [p + "k"], [p + "kt"], perm=[1, 0]),
                helper.make_node("MatMul", [p + "q", p + "kt"], [p + "s"]),
                helper.make_node("Softmax", [p + "s"], [p + "a"], axis=-1),
                helper.make_node("MatMul", [p + "a", p + "v"], [p + "ctx"]),
                helper.make_node("MatMul", [p + "ctx", w["o"]], [p + "attn"]),
                helper.make_node("Add", [x, p + "attn"], [p + "res1"]),
                helper.make_node("LayerNormalization", [p + "res1", w["ln2"]], [p + "n2"], axis=-1),
                helper.make_node("MatMul", [p + "n2", w["up"]], [p + "up"]),
                helper.make_node("Relu", [p + "up"], [p + "act"]),
                helper.make_node("MatMul", [p + "act", w["down"]], [p + "down"]),
                helper.make_node("Add", [p + "res1", p + "down"], [p + "out"]),
            ]
            x = p + "out"
        nodes.append(helper.make_node("Identity", [x], ["hidden_out"]))
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("hidden_in", TensorProto.FLOAT, [seq, hidden])],
                              [helper.make_tensor_value_info("hidden_out", TensorProto.FLOAT, [seq, hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="ctxgen-bench")
    model.ir_version = 8
    onnx.save(model, os.path.join(outdir, kind + ".onnx"))
    return offset


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--size-mb", type=float, default=500)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--embedded", action="store_true", help="weights inside the .onnx files")
    ap.add_argument("--models", type=int, default=2, help="with --embedded: how many models (2..8)")
    args = ap.parse_args()
    if args.models != 2 and not args.embedded:
        ap.error("--models needs --embedded")
    per_layer = sum(int(np.prod(s)) for _, s in layer_weights(args.hidden)) * 4
    layers = max(1, round(args.size_mb * 1e6 / per_layer))
    os.makedirs(args.outdir, exist_ok=True)
    for kind in kinds(args.models):
        size = build(kind, layers, args.hidden, args.outdir, args.embedded)
    print(f"{layers} layers, hidden {args.hidden}: {size} weight bytes per model")


if __name__ == "__main__":
    main()
