"""Prints what an exported model holds (used by the exporter scripts in this folder)."""
import collections
import os

import onnx


def dims(value_info):
    t = value_info.type.tensor_type
    out = []
    for d in t.shape.dim:
        out.append(d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else "?"))
    return "%s %s [%s]" % (value_info.name, onnx.TensorProto.DataType.Name(t.elem_type).lower(),
                           ", ".join(str(x) for x in out))


def describe(path):
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    g = model.graph
    hist = collections.Counter(n.op_type for n in g.node)
    print("== %s (%d bytes, opset %d)" % (os.path.relpath(path), os.path.getsize(path),
                                          model.opset_import[0].version))
    print("   nodes: %d, initializers: %d (%d weight bytes)" % (
        len(g.node), len(g.initializer), sum(len(t.raw_data) for t in g.initializer)))
    print("   ops: " + ", ".join("%s=%d" % kv for kv in sorted(hist.items())))
    for vi in g.input:
        print("   input  " + dims(vi))
    for vi in g.output:
        print("   output " + dims(vi))
    for vi in inferred.graph.output:
        print("   output (after onnx shape inference) " + dims(vi))
    return model
