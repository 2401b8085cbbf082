#!/usr/bin/env python3
"""Writes the ONNX models of the ORT interop tests into a folder the test has prepared.

The test writes the context binaries first (it needs ctxgen's C++ writer): model_ref.bin holds
three graphs, g_add (y = x + W, x: float[2,3]), g_mm (y = Relu(x @ W2), x: float[2,3],
y: float[2,4]) and g_pair (s = a + b, r = Relu(a), all float[2,3]), with W and W2 also saved as
W.raw / W2.raw (float32, little-endian). This script
writes EPContext models over those graphs, plain ONNX twins for ORT's CPU EP to compare against,
and one model per way of getting an EPContext node wrong.

usage: make_models.py FOLDER --ep-name NAME --sdk-version V --hardware H --compatibility-info INFO
"""

import argparse
import os
import re

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSETS = [helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)]


def tensor(name, dims, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


class Writer:
    def __init__(self, folder, ep_name, sdk_version, hardware, compatibility_info):
        self.folder = folder
        self.ep_name = ep_name
        self.sdk_version = sdk_version
        self.hardware = hardware
        self.compatibility_info = compatibility_info
        self.w = np.fromfile(os.path.join(folder, "W.raw"), dtype="<f4").reshape(2, 3)
        self.w2 = np.fromfile(os.path.join(folder, "W2.raw"), dtype="<f4").reshape(3, 4)

    def ep_context(self, name, inputs, outputs, main=1, cache=None, embed=0, partition=None, **overrides):
        attrs = {
            "main_context": main,
            "embed_mode": embed,
            "source": self.ep_name,
            "ep_sdk_version": self.sdk_version,
            "hardware_architecture": self.hardware,
            "partition_name": partition if partition is not None else name,
        }
        if cache is not None:
            attrs["ep_cache_context"] = cache
        attrs.update(overrides)
        return helper.make_node("EPContext", inputs, outputs, name=name, domain="com.microsoft", **attrs)

    def save(self, relative, nodes, inputs, outputs, initializers=(), value_info=(), metadata=None):
        graph = helper.make_graph(nodes, os.path.splitext(os.path.basename(relative))[0], inputs, outputs,
                                  initializer=list(initializers), value_info=list(value_info))
        model = helper.make_model(graph, opset_imports=OPSETS, producer_name="ctxgen-ort-test")
        if metadata:
            helper.set_model_props(model, metadata)
        model.ir_version = 8
        path = os.path.join(self.folder, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        onnx.save(model, path)

    def single(self, relative, x_dims=(2, 3), x_elem=TensorProto.FLOAT, metadata=None, **node_args):
        """x -> EPContext(g_add) -> y."""
        node_args.setdefault("cache", "model_ref.bin")
        node_args.setdefault("partition", "g_add")
        self.save(relative, [self.ep_context("add_node", ["X"], ["Y"], **node_args)],
                  [tensor("X", list(x_dims), x_elem)], [tensor("Y", [2, 3])], metadata=metadata)

    def write_all(self):
        w = numpy_helper.from_array(self.w, "W")
        w2 = numpy_helper.from_array(self.w2, "W2")
        with open(os.path.join(self.folder, "model_ref.bin"), "rb") as f:
            payload = f.read()

        # Plain twins, run by ORT's CPU EP as the reference.
        self.save("single_plain.onnx", [helper.make_node("Add", ["X", "W"], ["Y"])],
                  [tensor("X", [2, 3])], [tensor("Y", [2, 3])], [w])
        self.save("mm_plain.onnx",
                  [helper.make_node("MatMul", ["X", "W2"], ["T"]), helper.make_node("Relu", ["T"], ["Y"])],
                  [tensor("X", [2, 3])], [tensor("Y", [2, 4])], [w2])
        self.save("pair_plain.onnx", [helper.make_node("Add", ["X", "X"], ["Y"])],
                  [tensor("X", [2, 3])], [tensor("Y", [2, 3])])
        self.save("multi_plain.onnx",
                  [helper.make_node("Add", ["X", "W"], ["A"]), helper.make_node("Neg", ["A"], ["B"]),
                   helper.make_node("MatMul", ["B", "W2"], ["T"]), helper.make_node("Relu", ["T"], ["Y"])],
                  [tensor("X", [2, 3])], [tensor("Y", [2, 4])], [w, w2])

        # Models that load.
        self.single("single_ctx.onnx")
        self.single("embed_ctx.onnx", cache=payload, embed=1)
        self.save("mm_ctx.onnx",
                  [self.ep_context("mm_node", ["X"], ["Y"], cache="model_ref.bin", partition="g_mm")],
                  [tensor("X", [2, 3])], [tensor("Y", [2, 4])])
        self.save("mm_nomain_ctx.onnx", [self.ep_context("mm_node", ["X"], ["Y"], main=0, partition="g_mm")],
                  [tensor("X", [2, 3])], [tensor("Y", [2, 4])])
        self.single("dynamic_ctx.onnx", x_dims=("batch", 3))
        # What ORT's compile API records for a compiled model: ep_compatibility_info.<EP>.
        key = "ep_compatibility_info." + self.ep_name
        self.single("compat_ctx.onnx", metadata={key: self.compatibility_info})
        self.single("stale_compat_ctx.onnx", metadata={key: re.sub(r"^ctxgen-context-binary=\d+;", "ctxgen-context-binary=0;", self.compatibility_info)})
        # X feeds both graph inputs and output R is never read: ORT's fused node has one input
        # and may drop R, so the EP must match values by name, not position.
        self.save("pair_ctx.onnx",
                  [self.ep_context("pair_node", ["X", "X"], ["Y", "R"], cache="model_ref.bin", partition="g_pair")],
                  [tensor("X", [2, 3])], [tensor("Y", [2, 3])], value_info=[tensor("R", [2, 3])])
        # Two EPContext nodes on one binary with a CPU node between; the second names its graph
        # by partition_name only. ORT cannot infer EPContext output types, so every EPContext
        # output that is not a graph output needs a value_info, read or not.
        self.save("multi_ctx.onnx",
                  [self.ep_context("add_node", ["X"], ["A"], cache="model_ref.bin", partition="g_add"),
                   helper.make_node("Neg", ["A"], ["B"], name="cpu_neg"),
                   self.ep_context("mm_node", ["B"], ["Y"], main=0, partition="g_mm")],
                  [tensor("X", [2, 3])], [tensor("Y", [2, 4])], value_info=[tensor("A", [2, 3])])

        # Bad ep_cache_context paths. The folders and files they point at are made by the test.
        self.single("path_empty_ctx.onnx", cache="")
        self.single("path_absolute_ctx.onnx", cache=os.path.abspath(os.path.join(self.folder, "model_ref.bin")))
        self.single("sub/path_dotdot_ctx.onnx", cache="../model_ref.bin")
        self.single("sub_link/path_symlink_ctx.onnx", cache="link.bin")
        self.single("path_missing_ctx.onnx", cache="missing.bin")
        self.single("path_emptyfile_ctx.onnx", cache="empty.bin")
        self.single("path_folder_ctx.onnx", cache="sub")
        self.single("path_dangling_ctx.onnx", cache="dangling.bin")
        # Symlinks that stay inside the folder, which load.
        self.single("path_relative_link_ctx.onnx", cache="relative_link.bin")
        self.single("path_absolute_link_ctx.onnx", cache="absolute_link.bin")

        # Made by or for someone else, or not matching the graph.
        self.single("identity_ctx.onnx", cache="other_sdk.bin")
        self.single("other_cpu_ctx.onnx", cache="other_cpu.bin")
        self.single("version_ctx.onnx", cache="future_version.bin")
        self.single("node_version_ctx.onnx", ep_sdk_version="ctxgen-ref 0.1")
        self.single("node_hardware_ctx.onnx", hardware_architecture="npu-x")
        self.single("shape_ctx.onnx", x_dims=(2, 4))
        self.single("type_ctx.onnx", x_elem=TensorProto.DOUBLE)
        self.single("missing_graph_ctx.onnx", partition="g_nope")
        self.save("output_count_ctx.onnx",
                  [self.ep_context("add_node", ["X"], ["Y", "Z"], cache="model_ref.bin", partition="g_add")],
                  [tensor("X", [2, 3])], [tensor("Y", [2, 3])], value_info=[tensor("Z", [2, 3])])
        self.single("foreign_ctx.onnx", source="QNNExecutionProvider")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder")
    parser.add_argument("--ep-name", required=True)
    parser.add_argument("--sdk-version", required=True)
    parser.add_argument("--hardware", required=True)
    parser.add_argument("--compatibility-info", required=True)
    args = parser.parse_args()
    Writer(args.folder, args.ep_name, args.sdk_version, args.hardware, args.compatibility_info).write_all()


if __name__ == "__main__":
    main()
