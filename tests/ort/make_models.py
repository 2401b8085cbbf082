#!/usr/bin/env python3
"""Writes the ONNX models of the ORT interop tests into a folder the test has prepared.

The test writes the context binaries first (it needs ctxgen's C++ writer): model_ref.bin holds
two graphs, g_add (y = x + W, x: float[2,3]) and g_mm (y = Relu(x @ W2), x: float[2,3],
y: float[2,4]), with W and W2 also saved as W.raw / W2.raw (float32, little-endian). This script
writes EPContext models over those graphs, plain ONNX twins for ORT's CPU EP to compare against,
and one model per way of getting an EPContext node wrong.

usage: make_models.py FOLDER --ep-name NAME --sdk-version V --hardware H
"""

import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSETS = [helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)]


def tensor(name, dims, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


class Writer:
    def __init__(self, folder, ep_name, sdk_version, hardware):
        self.folder = folder
        self.ep_name = ep_name
        self.sdk_version = sdk_version
        self.hardware = hardware
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

    def save(self, relative, nodes, inputs, outputs, initializers=()):
        graph = helper.make_graph(nodes, os.path.splitext(os.path.basename(relative))[0], inputs, outputs,
                                  initializer=list(initializers))
        model = helper.make_model(graph, opset_imports=OPSETS, producer_name="ctxgen-ort-test")
        model.ir_version = 8
        path = os.path.join(self.folder, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        onnx.save(model, path)

    def single(self, relative, x_dims=(2, 3), x_elem=TensorProto.FLOAT, **node_args):
        """x -> EPContext(g_add) -> y."""
        node_args.setdefault("cache", "model_ref.bin")
        node_args.setdefault("partition", "g_add")
        self.save(relative, [self.ep_context("add_node", ["X"], ["Y"], **node_args)],
                  [tensor("X", list(x_dims), x_elem)], [tensor("Y", [2, 3])])

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
        # Two EPContext nodes on one binary with a CPU node between; the second names its graph
        # by partition_name only.
        self.save("multi_ctx.onnx",
                  [self.ep_context("add_node", ["X"], ["A"], cache="model_ref.bin", partition="g_add"),
                   helper.make_node("Neg", ["A"], ["B"], name="cpu_neg"),
                   self.ep_context("mm_node", ["B"], ["Y"], main=0, partition="g_mm")],
                  [tensor("X", [2, 3])], [tensor("Y", [2, 4])])

        # Bad ep_cache_context paths. The folders and files they point at are made by the test.
        self.single("path_empty_ctx.onnx", cache="")
        self.single("path_absolute_ctx.onnx", cache=os.path.abspath(os.path.join(self.folder, "model_ref.bin")))
        self.single("sub/path_dotdot_ctx.onnx", cache="../model_ref.bin")
        self.single("sub_link/path_symlink_ctx.onnx", cache="link.bin")
        self.single("path_missing_ctx.onnx", cache="missing.bin")
        self.single("path_emptyfile_ctx.onnx", cache="empty.bin")
        self.single("path_folder_ctx.onnx", cache="sub")

        # Made by or for someone else, or not matching the graph.
        self.single("identity_ctx.onnx", cache="other_sdk.bin")
        self.single("version_ctx.onnx", cache="future_version.bin")
        self.single("node_version_ctx.onnx", ep_sdk_version="ctxgen-ref 0.1")
        self.single("node_hardware_ctx.onnx", hardware_architecture="npu-x")
        self.single("shape_ctx.onnx", x_dims=(2, 4))
        self.single("type_ctx.onnx", x_elem=TensorProto.DOUBLE)
        self.single("missing_graph_ctx.onnx", partition="g_nope")
        self.single("foreign_ctx.onnx", source="QNNExecutionProvider")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder")
    parser.add_argument("--ep-name", required=True)
    parser.add_argument("--sdk-version", required=True)
    parser.add_argument("--hardware", required=True)
    args = parser.parse_args()
    Writer(args.folder, args.ep_name, args.sdk_version, args.hardware).write_all()


if __name__ == "__main__":
    main()
