#!/usr/bin/python3
"""Writes the small ONNX models ctxgen's tests use into OUTDIR (default: this folder).

Each model exercises one thing: several partitions with CPU islands between them, weights in
Constant nodes, weights inside If subgraphs, external data, a symbolic batch dimension, dots in
folder and file names. Deterministic: the same script writes the same bytes.
Needs Debian's python3-onnx and python3-numpy (run with /usr/bin/python3).
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 13)]


def rng(seed):
    return np.random.default_rng(seed)


def weight(name, shape, seed):
    return numpy_helper.from_array(rng(seed).standard_normal(shape).astype(np.float32) * 0.5, name)


def save(model, outdir, name, **kwargs):
    onnx.checker.check_model(model)
    path = os.path.join(outdir, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    onnx.save(model, path, **kwargs)
    return path


def model(graph, opset=None):
    m = helper.make_model(graph, opset_imports=opset or OPSET, producer_name="ctxgen-testdata")
    m.ir_version = 8
    return m


def cnn():
    """The bundled example: Conv+BN+Relu, Conv+Relu, pooling, Gemm, Softmax; all on `ref`."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"], ["n1"], name="bn1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("MaxPool", ["r2"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=1),
    ]
    var = np.abs(rng(5).standard_normal(8)).astype(np.float32) + 0.5
    inits = [
        weight("w1", [8, 3, 3, 3], 1), weight("b1", [8], 2), weight("bn_s", [8], 3), weight("bn_b", [8], 4),
        weight("bn_m", [8], 6), numpy_helper.from_array(var, "bn_v"),
        weight("w2", [16, 8, 3, 3], 7), weight("fc_w", [10, 16], 8), weight("fc_b", [10], 9),
    ]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return model(g)


def islands():
    """MatMul chains cut by CPU-only ops (Floor, Round): three partitions, two CPU islands, and a
    side branch that must not make a partition depend on itself through the CPU."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="mm1"),
        helper.make_node("Relu", ["m1"], ["r1"], name="relu1"),
        helper.make_node("Floor", ["r1"], ["f1"], name="floor1"),
        helper.make_node("MatMul", ["f1", "w2"], ["m2"], name="mm2"),
        helper.make_node("Add", ["m2", "r1"], ["a2"], name="add2"),
        helper.make_node("Round", ["a2"], ["q"], name="round"),
        helper.make_node("MatMul", ["q", "w3"], ["m3"], name="mm3"),
        helper.make_node("Tanh", ["m3"], ["y"], name="tanh"),
    ]
    inits = [weight("w1", [8, 8], 11), weight("w2", [8, 8], 12), weight("w3", [8, 4], 13)]
    g = helper.make_graph(nodes, "islands", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
                           helper.make_tensor_value_info("f1", TensorProto.FLOAT, [2, 8])], inits)
    return model(g)


def folded_shapes():
    """Shape of a runtime value, folded by ctxgen but a node with an edge in ONNX Runtime's graph:
    `shared` also feeds a CPU-only op (Floor) through a Cast, `through_cpu` reads it from a CPU-only
    op whose input comes from the partition, `split` concatenates shapes from both sides of a CPU-only
    op. A fused node must be a valid cut of ORT's graph."""
    def graph(name, nodes, outputs):
        return model(helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                                       [helper.make_tensor_value_info(n, t, d) for n, t, d in outputs]))
    shared = graph("shared", [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Shape", ["a"], ["s"], name="shape"),
        helper.make_node("Reshape", ["a", "s"], ["y"], name="reshape"),
        helper.make_node("Cast", ["s"], ["sf"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Floor", ["sf"], ["z"], name="floor"),
    ], [("y", TensorProto.FLOAT, [2, 8]), ("z", TensorProto.FLOAT, [2])])
    through_cpu = graph("through_cpu", [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Floor", ["a"], ["c"], name="floor"),
        helper.make_node("Shape", ["c"], ["s"], name="shape"),
        helper.make_node("Reshape", ["a", "s"], ["y"], name="reshape"),
    ], [("y", TensorProto.FLOAT, [2, 8]), ("c", TensorProto.FLOAT, [2, 8])])
    # A Concat of a shape from before a CPU-only op and one from after it: both shapes are folded
    # into the Concat's value and only it is kept.
    split = graph("split", [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Shape", ["a"], ["s1"], name="shape1"),
        helper.make_node("Floor", ["a"], ["c"], name="floor"),
        helper.make_node("Shape", ["c"], ["s2"], name="shape2"),
        helper.make_node("Concat", ["s1", "s2"], ["s3"], name="concat", axis=0),
        helper.make_node("Slice", ["s3", "zero", "two"], ["s4"], name="slice"),
        helper.make_node("Reshape", ["c", "s4"], ["y"], name="reshape"),
    ], [("y", TensorProto.FLOAT, [2, 8]), ("a", TensorProto.FLOAT, [2, 8])])
    split.graph.initializer.extend([helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
                                    helper.make_tensor("two", TensorProto.INT64, [1], [2])])
    return shared, through_cpu, split


def constants():
    """Weights in Constant nodes: a tensor value and a value_floats list."""
    w = weight("unused", [4, 4], 21)
    nodes = [
        helper.make_node("Constant", [], ["w"], name="const_w", value=w),
        helper.make_node("Constant", [], ["bias"], name="const_b", value_floats=[0.5, -0.5, 1.0, 2.0]),
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Add", ["m", "bias"], ["y"], name="add"),
    ]
    g = helper.make_graph(nodes, "constants", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])])
    return model(g)


def subgraph():
    """An If whose branches hold their own weights (initializer and Constant) and read an outer
    value; compiled nodes before and after it."""
    def branch(name, seed):
        return helper.make_graph(
            [helper.make_node("Constant", [], [name + "_c"], value=weight(name + "_c", [4, 4], seed + 1)),
             helper.make_node("MatMul", ["h", name + "_w"], [name + "_m"]),
             helper.make_node("MatMul", [name + "_m", name + "_c"], [name + "_out"])],
            name, [], [helper.make_tensor_value_info(name + "_out", TensorProto.FLOAT, [2, 4])],
            [weight(name + "_w", [4, 4], seed)])
    nodes = [
        helper.make_node("MatMul", ["x", "w_in"], ["h"], name="mm_in"),
        helper.make_node("If", ["cond"], ["b"], name="if", then_branch=branch("then", 31), else_branch=branch("else", 33)),
        helper.make_node("Relu", ["b"], ["y"], name="relu"),
    ]
    g = helper.make_graph(nodes, "subgraph",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                           helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [weight("w_in", [4, 4], 30)])
    return model(g)


def external(outdir):
    """Weights in an external data file beside the model; one of them feeds a CPU node."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="mm1"),
        helper.make_node("Floor", ["m1"], ["f"], name="floor"),
        helper.make_node("Mod", ["f", "scale"], ["s"], name="mod_on_cpu", fmod=1),
        helper.make_node("MatMul", ["s", "w2"], ["y"], name="mm2"),
    ]
    inits = [weight("w1", [16, 16], 41), weight("w2", [16, 8], 42), weight("scale", [16], 43)]
    g = helper.make_graph(nodes, "external", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits)
    return save(model(g), outdir, "external.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                location="external.weights", size_threshold=0)


def weightless(outdir):
    """For --weightless: a Conv and a MatMul whose weights ref lays out anew ([K, N] to [N, K], the
    Conv's blocked layout), all in external data at offsets onnx does not align."""
    nodes = [
        helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "fc_w"], ["m"], name="fc"),
        helper.make_node("Add", ["m", "fc_b"], ["y"], name="bias"),
    ]
    inits = [weight("conv_w", [8, 3, 3, 3], 51), weight("conv_b", [8], 52), weight("fc_w", [512, 24], 53),
             weight("fc_b", [24], 54)]
    g = helper.make_graph(nodes, "weightless", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 24])], inits)
    return save(model(g), outdir, "weightless.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                location="weightless.weights", size_threshold=0)


def dynamic():
    """A symbolic batch dimension: nothing is static until --fix-dim batch=N."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Sigmoid", ["m"], ["y"], name="sigmoid"),
    ]
    g = helper.make_graph(nodes, "dynamic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [weight("w", [8, 4], 51)])
    return model(g)


def unsupported():
    """Nothing here runs on `ref`."""
    g = helper.make_graph([helper.make_node("Floor", ["x"], ["y"], name="floor")], "unsupported",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    return model(g)


def block(prefix, x, seq, weights, nodes, inits, style):
    """One MLP block y = Relu(x @ W1 + b) @ W2, its weights named after `prefix`. `style` says where
    the weights live: "init" (initializers) or "const" (Constant nodes)."""
    names = {k: prefix + k for k in weights}
    for k, arr in weights.items():
        if style == "const":
            nodes.append(helper.make_node("Constant", [], [names[k]], value=numpy_helper.from_array(arr, names[k])))
        else:
            inits.append(numpy_helper.from_array(arr, names[k]))
    nodes += [
        helper.make_node("MatMul", [x, names["w1"]], [prefix + "h"]),
        helper.make_node("Add", [prefix + "h", names["b"]], [prefix + "hb"]),
        helper.make_node("Relu", [prefix + "hb"], [prefix + "r"]),
        helper.make_node("MatMul", [prefix + "r", names["w2"]], [prefix + "out"]),
    ]
    return prefix + "out"


def mlp(name, seq, weights, style="init", cpu_scale=None):
    """Two blocks; with `cpu_scale`, CPU-only Floor and Mod with that tensor sit between them, so a
    weight is needed by a CPU node."""
    nodes, inits = [], []
    h = block(name + ".layer0.", "x", seq, weights[0], nodes, inits, style)
    if cpu_scale is not None:
        nodes += [helper.make_node("Floor", [h], [name + ".floor"]),
                  helper.make_node("Mod", [name + ".floor", name + ".scale"], [name + ".scaled"], fmod=1)]
        inits.append(numpy_helper.from_array(cpu_scale, name + ".scale"))
        h = name + ".scaled"
    y = block(name + ".layer1.", h, seq, weights[1], nodes, inits, style)
    nodes.append(helper.make_node("Identity", [y], ["y"]))
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [seq, 16])], inits)
    return model(g)


def mlp_weights(seed):
    r = rng(seed)
    return [{"w1": r.standard_normal((16, 32)).astype(np.float32), "b": r.standard_normal(32).astype(np.float32),
             "w2": r.standard_normal((32, 16)).astype(np.float32)} for _ in range(2)]


def share_groups(outdir):
    """Groups of models for `ctxgen share`: weights shared fully (under other names, at other
    shapes), partly (a fine-tune), not at all, and across storage kinds."""
    base = mlp_weights(100)
    save(mlp("prefill", 8, base), outdir, "share/full/prefill.onnx")
    save(mlp("decode", 1, base), outdir, "share/full/decode.onnx")

    tuned = [dict(layer) for layer in base]
    tuned[1]["w2"] = tuned[1]["w2"] + np.float32(0.01)
    save(mlp("base", 4, base), outdir, "share/partial/base.onnx")
    save(mlp("tuned", 4, tuned), outdir, "share/partial/tuned.onnx")

    save(mlp("a", 4, base), outdir, "share/none/a.onnx")
    save(mlp("b", 4, mlp_weights(200)), outdir, "share/none/b.onnx")

    save(mlp("init", 2, base), outdir, "share/kinds/init.onnx")
    save(mlp("const", 2, base, style="const"), outdir, "share/kinds/const.onnx")
    save(mlp("ext", 2, base), outdir, "share/kinds/ext.onnx", save_as_external_data=True,
         all_tensors_to_one_file=True, location="ext.weights", size_threshold=0)

    scale = rng(300).standard_normal(16).astype(np.float32)
    save(mlp("cpu1", 4, base, cpu_scale=scale), outdir, "share/fallback/cpu1.onnx")
    save(mlp("cpu2", 1, base, cpu_scale=scale), outdir, "share/fallback/cpu2.onnx")


def tied():
    """A tied embedding as exporters write it: the table for Gather, and its transpose as a separate
    initializer for the output projection. Packing the projection's weight to [N, K] makes it the
    table's bytes again, so the context binary holds the table once."""
    table = rng(400).standard_normal((32, 16)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "table_t"], ["logits"])]
    g = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, [6])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [6, 32])],
                          [numpy_helper.from_array(table, "table"),
                           numpy_helper.from_array(np.ascontiguousarray(table.T), "table_t")])
    return model(g)


def vad():
    """A voice-activity detector shaped like Silero VAD: its whole compute sits in the branches of an
    If on the sample rate input, so nothing compiles until --fix-value sr=16000 (or 8000) makes the
    condition constant."""
    def branch(tag, k, seed):
        nodes = [
            helper.make_node("Unsqueeze", ["x", "axis1"], [tag + ".u"]),
            helper.make_node("Conv", [tag + ".u", tag + ".w1", tag + ".b1"], [tag + ".c1"], strides=[k], kernel_shape=[k]),
            helper.make_node("Relu", [tag + ".c1"], [tag + ".r1"]),
            helper.make_node("ReduceMean", [tag + ".r1"], [tag + ".m"], axes=[2], keepdims=0),
            helper.make_node("Gemm", [tag + ".m", tag + ".w2"], [tag + ".g"]),
            helper.make_node("Sigmoid", [tag + ".g"], [tag + ".prob"]),
        ]
        inits = [weight(tag + ".w1", [8, 1, k], seed), weight(tag + ".b1", [8], seed + 1), weight(tag + ".w2", [8, 1], seed + 2)]
        return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(tag + ".prob", TensorProto.FLOAT, [1, 1])],
                                 inits)
    nodes = [
        helper.make_node("Equal", ["sr", "sr16k"], ["is16k"], name="is_16k"),
        helper.make_node("If", ["is16k"], ["prob"], name="by_rate", then_branch=branch("r16k", 16, 600),
                         else_branch=branch("r8k", 8, 610)),
    ]
    g = helper.make_graph(nodes, "vad",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512]),
                           helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                          [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 1])],
                          [numpy_helper.from_array(np.array(16000, np.int64), "sr16k"),
                           numpy_helper.from_array(np.array([1], np.int64), "axis1")])
    return model(g)


def save_unchecked(m, outdir, name):
    """For models newer than this onnx (1.12: IR 8, opset 17) knows: its checker would refuse them."""
    path = os.path.join(outdir, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    onnx.save(m, path)


def modern_model(nodes, inputs, outputs, inits, opset, ir_version=10):
    g = helper.make_graph(nodes, "modern", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="ctxgen-testdata")
    m.ir_version = ir_version
    return m


def modern(outdir):
    """Models written as current exporters (onnx >= 1.16) write them: IR 10, opsets 18 to 21, ops
    whose inputs or attributes changed after opset 17. Plus versions ONNX Runtime 1.29 cannot load."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 8, 8])
    axes = numpy_helper.from_array(np.array([2, 3], np.int64), "axes")
    ones = numpy_helper.from_array(np.full(8, 1.5, np.float32), "scale")
    tenth = numpy_helper.from_array(np.full(8, 0.1, np.float32), "bias")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("GroupNormalization", ["c", "scale", "bias"], ["g"], num_groups=2),  # 21: per channel
        helper.make_node("Split", ["g"], ["s0", "s1"], axis=1, num_outputs=2),                # 18: num_outputs
        helper.make_node("Add", ["s0", "s1"], ["a"]),
        helper.make_node("ReduceMean", ["a", "axes"], ["m"], keepdims=1),                      # 18: axes input
        helper.make_node("Sub", ["a", "m"], ["y"]),
    ]
    save_unchecked(modern_model(nodes, [x], [y], [weight("w", [8, 4, 3, 3], 500), ones, tenth, axes], 21),
                   outdir, "modern/ir10_opset21.onnx")

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(np.array([1, 2], np.int64), "pads"),
             numpy_helper.from_array(np.array([3], np.int64), "pad_axes"),
             numpy_helper.from_array(np.array([10, 12], np.int64), "sizes"),
             numpy_helper.from_array(np.array([6, 4], np.int64), "split"),
             numpy_helper.from_array(np.array([2], np.int64), "max_axes")]
    nodes = [
        helper.make_node("Pad", ["x", "pads", "", "pad_axes"], ["p"], mode="reflect"),         # 18: axes input
        helper.make_node("Resize", ["p", "", "", "sizes"], ["r"], mode="linear", axes=[2, 3],  # 18: axes
                         coordinate_transformation_mode="half_pixel_symmetric"),                # 19
        helper.make_node("Split", ["r", "split"], ["r0", "r1"], axis=2),
        helper.make_node("ReduceMax", ["r0", "max_axes"], ["mx"], keepdims=1),                 # 18: axes input
        helper.make_node("Mul", ["r1", "mx"], ["t"]),
        helper.make_node("AveragePool", ["t"], ["y"], kernel_shape=[2, 2], strides=[1, 2]),     # 19
    ]
    save_unchecked(modern_model(nodes, [x], [y], inits, 19), outdir, "modern/opset19.onnx")

    relu = [helper.make_node("Relu", ["x"], ["y"])]
    io = ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    save_unchecked(modern_model(relu, *io, [], 23), outdir, "modern/opset23.onnx")
    save_unchecked(modern_model(relu, *io, [], 99), outdir, "modern/opset99.onnx")
    save_unchecked(modern_model(relu, *io, [], 21, ir_version=99), outdir, "modern/ir99.onnx")
    # Invalid from opset 18 on (axes became an input); onnx 1.12 would read it with ReduceMean-13.
    old_axes = [helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=1)]
    io = ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1])])
    save_unchecked(modern_model(old_axes, *io, [], 21), outdir, "modern/axes_attribute.onnx")
    # Unsqueeze takes axes as an input from opset 13 on; onnx 1.12's own message would not say so.
    unsqueeze = [helper.make_node("Unsqueeze", ["x"], ["y"], axes=[0])]
    io = ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3])])
    save_unchecked(modern_model(unsqueeze, *io, [], 13, ir_version=7), outdir, "modern/unsqueeze_axes_attribute.onnx")


def bad(outdir):
    """Models of the damaged-input catalogue (tests/e2e/errors_test.cc): each one broke ctxgen once."""
    def io(x_dims, y_dims=None):
        return ([helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_dims)])
    # onnx 1.12's shape inference dereferenced a null type for a name nothing defines (fuzzing).
    relu = helper.make_node("Relu", ["ghost"], ["y"])
    save_unchecked(model(helper.make_graph([relu], "undefined", *io([2, 2]))), outdir, "bad/undefined_input.onnx")
    conv = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1], strides=[0, 0])
    save_unchecked(model(helper.make_graph([conv], "conv_zero_stride", *io([1, 1, 4, 4]),
                                           [numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w")])),
                   outdir, "bad/conv_zero_stride.onnx")
    # 2^40 elements: compiled, then failed to allocate at run time.
    huge = helper.make_node("Relu", ["x"], ["y"])
    save(model(helper.make_graph([huge], "huge", *io([1024, 1024, 1024, 1024], [1024, 1024, 1024, 1024]))),
         outdir, "bad/huge_input.onnx")
    # ceil_mode windows where onnx 1.12 and ONNX Runtime disagree on the output size.
    pool = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[7, 7], pads=[1, 1, 1, 1], ceil_mode=1)
    save_unchecked(model(helper.make_graph([pool], "ceil_pool", *io([1, 1, 16, 16]))), outdir, "bad/ceil_pool.onnx")
    # ONNX Runtime's CPU Div divides the lowest int64 by -1 without a check (SIGFPE): it killed
    # `ctxgen verify`, which ran ORT in its own process. ctxgen folds the Div (wrapping) itself.
    lowest = numpy_helper.from_array(np.array([np.iinfo(np.int64).min], np.int64), "lowest")
    minus_one = numpy_helper.from_array(np.array([-1], np.int64), "minus_one")
    div = [helper.make_node("Div", ["lowest", "minus_one"], ["q"]), helper.make_node("Add", ["x", "q"], ["y"])]
    save(model(helper.make_graph(div, "int_min_div", [helper.make_tensor_value_info("x", TensorProto.INT64, [4])],
                                 [helper.make_tensor_value_info("y", TensorProto.INT64, [4])], [lowest, minus_one])),
         outdir, "bad/int_min_div.onnx")
    # onnx 1.12 took the kernel shape from a weight of more spatial dims than the input has and
    # dereferenced null (fuzzing): directly, through DequantizeLinear (QDQ), and from a Transpose.
    w4 = numpy_helper.from_array(np.ones((8, 8, 3, 3), np.float32), "w")
    conv = helper.make_node("Conv", ["x", "w"], ["y"])
    save_unchecked(model(helper.make_graph([conv], "conv_rank", *io([1, 8, 5]), [w4])), outdir, "bad/conv_rank.onnx")
    wq = numpy_helper.from_array(np.ones((8, 8, 3, 3), np.int8), "wq")
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "scale")
    qdq = [helper.make_node("DequantizeLinear", ["wq", "scale"], ["w"]), helper.make_node("Conv", ["x", "w"], ["y"])]
    save_unchecked(model(helper.make_graph(qdq, "conv_rank_qdq", *io([1, 8, 5]), [wq, scale])), outdir,
                   "bad/conv_rank_qdq.onnx")
    wt = numpy_helper.from_array(np.ones((3, 3, 8, 8), np.float32), "wt")
    transposed = [helper.make_node("Transpose", ["wt"], ["w"], perm=[2, 3, 0, 1]), helper.make_node("Conv", ["x", "w"], ["y"])]
    save_unchecked(model(helper.make_graph(transposed, "conv_rank_computed", *io([1, 8, 5]), [wt])), outdir,
                   "bad/conv_rank_computed.onnx")
    # An op no ONNX opset defines, at an opset newer than onnx 1.12 checks.
    unknown = helper.make_node("FrobnicateV2", ["x"], ["y"])
    save_unchecked(modern_model([unknown], *io([2, 2], [2, 2]), [], 20), outdir, "bad/unknown_op.onnx")


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    save(cnn(), outdir, "cnn.onnx")
    save(islands(), outdir, "islands.onnx")
    save(constants(), outdir, "constants.onnx")
    shared, through_cpu, split = folded_shapes()
    save(shared, outdir, "folded/shared.onnx")
    save(through_cpu, outdir, "folded/through_cpu.onnx")
    save(split, outdir, "folded/split.onnx")
    save(subgraph(), outdir, "subgraph.onnx")
    external(outdir)
    weightless(outdir)
    save(dynamic(), outdir, "dynamic.onnx")
    save(unsupported(), outdir, "unsupported.onnx")
    save(cnn(), outdir, "dir.v1/model.v2.onnx")
    share_groups(outdir)
    modern(outdir)
    save(vad(), outdir, "vad.onnx")
    save(tied(), outdir, "tied.onnx")
    bad(outdir)
    # A stride of 0 made onnx 1.12's shape inference divide by zero (SIGFPE) before ctxgen saw it.
    pool = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[0, 0])
    save_unchecked(model(helper.make_graph([pool], "zero_stride", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])),
                   outdir, "bad/zero_stride.onnx")


if __name__ == "__main__":
    main()
