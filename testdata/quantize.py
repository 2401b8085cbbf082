#!/usr/bin/python3
"""Writes quantized variants of the float test models into testdata/quantized/.

Why: ctxgen must read what ONNX Runtime's quantization tools write -- QDQ graphs with per-channel
int8 weights, 16-bit Q/DQ in the com.microsoft domain, QOperator graphs of QLinear* operators,
float16 graphs with Cast boundaries and MatMulNBits -- and these models have exactly that layout
(names, dtypes, shapes, node placement) without needing the onnxruntime Python package, which this
machine does not have. The layout rules are ONNX Runtime's (onnxruntime/python/tools/quantization
and onnxconverter-common's float16.py), re-implemented here for the ops these models contain;
testdata/quantized/README.md says which rule comes from where.

Variants, written as <stem>_<variant>.onnx:
  qdq_u8s8    quantize_static(QDQ, activations QUInt8, weights QInt8, per_channel=True)
  qdq_a16w8   get_qnn_qdq_config(activation_type=QUInt16, weight_type=QUInt8) + quantize
  qop         quantize_static(QOperator, activations QUInt8, weights QInt8, per_channel=True)
  fp16        onnxconverter-common convert_float_to_float16(keep_io_types=True)
  matmulnbits MatMulNBitsQuantizer(block_size=32, is_symmetric=False, op_types_to_quantize=(MatMul, Gather)),
              decoders only: MatMulNBits and a GatherBlockQuantized embedding, opset 21
  qdq_int4    MatMulNBitsQuantizer(block_size=32, is_symmetric=True, quant_format=QDQ), decoders only:
              int4 weights through DequantizeLinear (opset 21)

Calibration is ORT's MinMax: the FLOAT model runs in the real ONNX Runtime library of this
repository (third_party/onnxruntime, through its C API with ctypes) on a few fixed-seed inputs, with
every float intermediate exposed as a graph output. The script then runs every variant and its float
original on a calibration input and on a held-out input and prints how far the outputs moved.

Run from anywhere with Debian's python3 (python3-onnx 1.12 and numpy only):
    /usr/bin/python3 testdata/quantize.py
Same bytes on every run.
"""
import collections
import copy
import ctypes
import os
import re
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXPORTS = os.path.join(HERE, "exports")
OUT = os.path.join(HERE, "quantized")
ORT_LIB = os.path.join(ROOT, "third_party", "onnxruntime", "lib", "libonnxruntime.so.1")
ORT_HEADER = os.path.join(ROOT, "third_party", "onnxruntime", "include", "onnxruntime_c_api.h")
ORT_API_VERSION = 29
MS_DOMAIN = "com.microsoft"

NP_TYPE = {TensorProto.FLOAT: np.float32, TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8,
           TensorProto.UINT16: np.uint16, TensorProto.INT16: np.int16, TensorProto.INT32: np.int32,
           TensorProto.INT64: np.int64, TensorProto.BOOL: np.bool_, TensorProto.FLOAT16: np.float16,
           TensorProto.DOUBLE: np.float64}
ONNX_TYPE = {np.dtype(v): k for k, v in NP_TYPE.items()}


# ---------------------------------------------------------------------------------------------
# ONNX Runtime through its C API. The function table's layout is read from the header so the
# slot numbers can never drift from the library's version.

def ort_api_slots(header):
    """Slot of each function pointer in `struct OrtApi`, counted in declaration order."""
    text = open(header).read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    body = text[text.index("struct OrtApi {") + len("struct OrtApi {"):]
    body = body[:body.index("\n};")]
    names = []
    for decl in body.split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        m = (re.match(r"ORT_API2_STATUS\((\w+)", decl) or re.match(r"ORT_API_T\([^,]+,\s*(\w+)", decl)
             or re.search(r"\(\s*ORT_API_CALL\s*\*\s*(\w+)\s*\)", decl))
        release = re.match(r"ORT_CLASS_RELEASE\((\w+)\)", decl)
        if m:
            names.append(m.group(1))
        elif release:
            names.append("Release" + release.group(1))
        else:
            raise RuntimeError("unrecognised member of struct OrtApi: " + decl[:100])
    if len(set(names)) != len(names):
        raise RuntimeError("duplicate member names in struct OrtApi")
    return {name: i for i, name in enumerate(names)}


class Ort:
    """The few OrtApi functions needed to run a model held in memory on the CPU EP."""

    def __init__(self):
        lib = ctypes.CDLL(ORT_LIB)
        slots = ort_api_slots(ORT_HEADER)

        class ApiBase(ctypes.Structure):
            _fields_ = [("GetApi", ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)),
                        ("GetVersionString", ctypes.CFUNCTYPE(ctypes.c_char_p))]

        lib.OrtGetApiBase.restype = ctypes.POINTER(ApiBase)
        base = lib.OrtGetApiBase().contents
        self.version = base.GetVersionString().decode()
        api = base.GetApi(ORT_API_VERSION)
        if not api:
            raise RuntimeError("ONNX Runtime %s does not provide C API version %d" % (self.version, ORT_API_VERSION))
        table = (ctypes.c_void_p * len(slots)).from_address(api)
        P, PP, I64P, SZ = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t

        def fn(name, restype, *argtypes):
            return ctypes.CFUNCTYPE(restype, *argtypes)(table[slots[name]])

        def status_fn(name, *argtypes):  # ORT_API2_STATUS functions return OrtStatus*, NULL on success
            f = fn(name, P, *argtypes)
            return lambda *args: self._check(name, f(*args))

        self._error_message = fn("GetErrorMessage", ctypes.c_char_p, P)
        self._release_status = fn("ReleaseStatus", None, P)
        self._create_env = status_fn("CreateEnv", ctypes.c_int, ctypes.c_char_p, PP)
        self._create_options = status_fn("CreateSessionOptions", PP)
        self._set_threads = status_fn("SetIntraOpNumThreads", P, ctypes.c_int)
        self._set_level = status_fn("SetSessionGraphOptimizationLevel", P, ctypes.c_int)
        self._create_session = status_fn("CreateSessionFromArray", P, ctypes.c_char_p, SZ, P, PP)
        self._create_cpu_info = status_fn("CreateCpuMemoryInfo", ctypes.c_int, ctypes.c_int, PP)
        self._create_tensor = status_fn("CreateTensorWithDataAsOrtValue", P, P, SZ, I64P, SZ, ctypes.c_int, PP)
        self._run = status_fn("Run", P, P, ctypes.POINTER(ctypes.c_char_p), PP, SZ,
                              ctypes.POINTER(ctypes.c_char_p), SZ, PP)
        self._type_and_shape = status_fn("GetTensorTypeAndShape", P, PP)
        self._element_type = status_fn("GetTensorElementType", P, ctypes.POINTER(ctypes.c_int))
        self._dims_count = status_fn("GetDimensionsCount", P, ctypes.POINTER(SZ))
        self._dims = status_fn("GetDimensions", P, I64P, SZ)
        self._data = status_fn("GetTensorMutableData", P, PP)
        self._release_info = fn("ReleaseTensorTypeAndShapeInfo", None, P)
        self._release_value = fn("ReleaseValue", None, P)
        self._release_options = fn("ReleaseSessionOptions", None, P)
        self.release_session = fn("ReleaseSession", None, P)

        self.env, self.cpu = ctypes.c_void_p(), ctypes.c_void_p()
        self._create_env(3, b"quantize", ctypes.byref(self.env))  # 3: ORT_LOGGING_LEVEL_ERROR
        self._create_cpu_info(1, 0, ctypes.byref(self.cpu))  # OrtArenaAllocator, OrtMemTypeDefault

    def _check(self, what, status):
        if status:
            message = self._error_message(status).decode(errors="replace")
            self._release_status(status)
            raise RuntimeError("ONNX Runtime %s: %s" % (what, message))

    def session(self, model_bytes, optimize):
        """optimize=False is what ORT's calibrator uses (ORT_DISABLE_ALL); True is ORT's default."""
        options, session = ctypes.c_void_p(), ctypes.c_void_p()
        self._create_options(ctypes.byref(options))
        try:
            self._set_threads(options, 1)  # the machine is shared; one thread is plenty here
            self._set_level(options, 99 if optimize else 0)  # ORT_ENABLE_ALL / ORT_DISABLE_ALL
            self._create_session(self.env, model_bytes, len(model_bytes), options, ctypes.byref(session))
        finally:
            self._release_options(options)
        return session

    def run(self, session, feeds, output_names):
        arrays = [np.ascontiguousarray(a) for a in feeds.values()]  # must outlive Run: ORT borrows them
        inputs = (ctypes.c_void_p * len(arrays))()
        outputs = (ctypes.c_void_p * len(output_names))()
        try:
            for i, a in enumerate(arrays):
                value = ctypes.c_void_p()
                shape = (ctypes.c_int64 * a.ndim)(*a.shape)
                self._create_tensor(self.cpu, a.ctypes.data, a.nbytes, shape, a.ndim, ONNX_TYPE[a.dtype],
                                    ctypes.byref(value))
                inputs[i] = value
            in_names = (ctypes.c_char_p * len(arrays))(*[n.encode() for n in feeds])
            out_names = (ctypes.c_char_p * len(output_names))(*[n.encode() for n in output_names])
            self._run(session, None, in_names, inputs, len(arrays), out_names, len(output_names), outputs)
            return [self._to_numpy(v) for v in outputs]
        finally:
            for v in list(inputs) + list(outputs):
                if v:
                    self._release_value(v)

    def _to_numpy(self, value):
        info, elem, rank, data = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_size_t(), ctypes.c_void_p()
        self._type_and_shape(value, ctypes.byref(info))
        try:
            self._element_type(info, ctypes.byref(elem))
            self._dims_count(info, ctypes.byref(rank))
            dims = (ctypes.c_int64 * rank.value)()
            self._dims(info, dims, rank.value)
        finally:
            self._release_info(info)
        dtype, shape = np.dtype(NP_TYPE[elem.value]), tuple(dims)
        count = int(np.prod(shape, dtype=np.int64))
        if count == 0:
            return np.zeros(shape, dtype)
        self._data(value, ctypes.byref(data))
        return np.frombuffer(ctypes.string_at(data, count * dtype.itemsize), dtype).reshape(shape).copy()


# ---------------------------------------------------------------------------------------------
# Graph helpers

def load_export(stem):
    return onnx.load(os.path.join(EXPORTS, stem + ".onnx"))


def with_fixed_inputs(model, feeds):
    """A copy whose graph inputs have the static shapes of `feeds` (ORT then needs no symbolic dims)."""
    m = copy.deepcopy(model)
    for vi in m.graph.input:
        if vi.name in feeds:
            dims = vi.type.tensor_type.shape.dim
            for d, n in zip(dims, feeds[vi.name].shape):
                d.Clear()
                d.dim_value = n
    return m


def elem_types(model):
    """Element type of every tensor onnx's shape inference can type, plus initializers."""
    g = model.graph
    types = {t.name: t.data_type for t in g.initializer}
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def data_nodes(graph):
    """Names of the nodes that compute on the values of the graph inputs, not only on their shapes.

    The rest (Shape -> Gather -> Concat, Range, the causal mask, the rotary cos/sin tables) is the
    exporter's shape arithmetic: a compiler folds it into constants once dims are fixed, so it is
    kept as exported and never quantized (it is given to ORT's tool as nodes_to_exclude).
    """
    live = {vi.name for vi in graph.input}
    names = set()
    for node in graph.node:
        if node.op_type not in ("Shape", "Size") and any(i in live for i in node.input if i):
            names.add(node.name)
            live.update(node.output)
    return names


def unquantizable_nodes(graph, ranges):
    """Nodes reading or writing a tensor that reaches float32's lowest value (the additive causal
    mask). No 8- or 16-bit scale can hold -3.4e38 and the scores next to it, so these nodes are
    excluded, as ORT users do with nodes_to_exclude; decode's mask is all zeros and stays quantized."""
    huge = {t for t, (lo, hi) in ranges.items() if max(abs(float(lo)), abs(float(hi))) >= 1e30}
    return {n.name for n in graph.node if huge.intersection(list(n.input) + list(n.output))}


def fold_batchnorm(model):
    """Conv -> BatchNormalization folded into the Conv, as ORT's ConvBNFusion (the optimizer run by
    quant_pre_process) does: float32 arithmetic, initializers ConvBnFusion_W_<W> and
    ConvBnFusion_BN_B_<B>, the Conv taking over the BatchNormalization's output."""
    m = copy.deepcopy(model)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    uses = collections.Counter(i for n in g.node for i in n.input)
    outputs = {o.name for o in g.output}
    folded = []
    for bn in [n for n in g.node if n.op_type == "BatchNormalization"]:
        conv = producer.get(bn.input[0])
        if (conv is None or conv.op_type != "Conv" or uses[bn.input[0]] != 1 or bn.input[0] in outputs
                or not all(i in inits for i in list(bn.input[1:5]) + list(conv.input[1:]))):
            continue
        eps = np.float32(next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5))
        gamma, beta, mean, var = (numpy_helper.to_array(inits[i]) for i in bn.input[1:5])
        scale = gamma / np.sqrt(var + eps)
        w = numpy_helper.to_array(inits[conv.input[1]])
        w = w * scale.reshape((-1,) + (1,) * (w.ndim - 1))
        if len(conv.input) > 2:
            b = (numpy_helper.to_array(inits[conv.input[2]]) - mean) * scale + beta
        else:
            b = beta - mean * scale
        w_name, b_name = "ConvBnFusion_W_" + conv.input[1], "ConvBnFusion_BN_B_" + bn.input[2]
        g.initializer.extend([numpy_helper.from_array(w.astype(np.float32), w_name),
                              numpy_helper.from_array(b.astype(np.float32), b_name)])
        del conv.input[1:]
        conv.input.extend([w_name, b_name])
        conv.output[0] = bn.output[0]
        folded.append(bn)
    for bn in folded:
        g.node.remove(bn)
    remove_unused_initializers(g)
    return m


def remove_unused_initializers(graph):
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for t in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(t)


def ort_topological_sort(graph):
    """ONNXModel.topological_sort of ORT's quantization tool, which every quantized model goes
    through on save, so node order matches what the tool writes."""
    nodes = list(graph.node)
    deps = [0] * len(nodes)
    waiting = {}
    order = []
    for idx, node in enumerate(nodes):
        deps[idx] = sum(1 for i in node.input if i)
        if deps[idx] == 0:
            order.append(node)
            continue
        for i in node.input:
            if i:
                waiting.setdefault(i, []).append(idx)

    def release(name):
        for idx in waiting.get(name, []):
            deps[idx] -= 1
            if deps[idx] == 0:
                order.append(nodes[idx])

    for name in sorted(set([t.name for t in graph.initializer] + [i.name for i in graph.input])):
        release(name)
    start = 0
    while start < len(order):
        for o in order[start].output:
            release(o)
        start += 1
    if len(order) != len(nodes):
        raise RuntimeError("graph is not a DAG")
    del graph.node[:]
    graph.node.extend(order)


def set_opset(model, domain, version):
    for op in model.opset_import:
        if op.domain == domain:
            op.version = version
            return
    model.opset_import.extend([helper.make_opsetid(domain, version)])


# ---------------------------------------------------------------------------------------------
# Calibration: ORT's MinMaxCalibrater, with ORT itself computing the float intermediates.

def calibrate(ort, model, feeds_list):
    """Per float tensor, (min, max) over all calibration inputs, as float32."""
    fixed = onnx.shape_inference.infer_shapes(with_fixed_inputs(model, feeds_list[0]))
    types = elem_types(fixed)
    g = fixed.graph
    outputs = {o.name for o in g.output}
    names = []
    for node in g.node:
        for o in node.output:
            if types.get(o) == TensorProto.FLOAT and o not in names:
                names.append(o)
    vis = {vi.name: vi for vi in g.value_info}
    g.output.extend([vis[n] for n in names if n not in outputs])
    session = ort.session(fixed.SerializeToString(), optimize=False)
    ranges = {}
    try:
        for feeds in feeds_list:
            values = dict(zip(names, ort.run(session, feeds, names)))
            values.update((k, v) for k, v in feeds.items() if v.dtype == np.float32)
            for name, v in values.items():
                if v.size:
                    lo, hi = v.min(), v.max()
                    if name in ranges:
                        lo, hi = min(lo, ranges[name][0]), max(hi, ranges[name][1])
                    ranges[name] = (np.float32(lo), np.float32(hi))
    finally:
        ort.release_session(session)
    return ranges


# ---------------------------------------------------------------------------------------------
# Quantization parameters: quant_utils.py (compute_scale_zp, quantize_nparray,
# get_qmin_qmax_for_qType), reproduced to the dtype of every intermediate so the bytes match.

Q_RANGE = {TensorProto.UINT8: (0, 255), TensorProto.INT8: (-128, 127),
           TensorProto.UINT16: (0, 65535), TensorProto.INT16: (-32768, 32767)}
Q_RANGE_SYMMETRIC = {TensorProto.UINT8: (0, 254), TensorProto.INT8: (-127, 127),
                     TensorProto.UINT16: (0, 65534), TensorProto.INT16: (-32767, 32767)}


def scale_zero_point(rmin, rmax, qtype, symmetric, min_real_range=None):
    """compute_scale_zp: the range widened to hold 0 (so 0 is exact), optionally widened to
    min_real_range and symmetrised; scale computed in float64 and stored as float32."""
    lo, hi = (Q_RANGE_SYMMETRIC if symmetric else Q_RANGE)[qtype]
    qdtype = NP_TYPE[qtype]
    rmin = np.minimum(np.float32(rmin), np.float32(0))
    rmax = np.maximum(np.float32(rmax), np.float32(0))
    if min_real_range is not None:
        rmax = max(rmax, rmin + np.float32(min_real_range))
    if symmetric:
        absmax = np.maximum(np.abs(rmin), np.abs(rmax))
        rmin, rmax = -absmax, absmax
    scale = np.float64(rmax - rmin) / (np.float64(hi) - np.float64(lo))
    if scale < np.finfo(np.float32).tiny:
        return np.array(0, qdtype), np.array(1.0, np.float32)
    if symmetric:
        zero_point = np.round((lo + hi) / 2.0)
    else:
        zero_point = np.round(np.float64(lo) - np.float64(rmin) / scale)
    return np.array(zero_point, qdtype), np.array(scale, np.float32)


def quantize_values(x, scale, zero_point, qtype):
    """quantize_nparray: float32 division, round half to even, clip to the type's full range."""
    lo, hi = Q_RANGE[qtype]
    q = np.round(x.astype(np.float32) / np.float32(scale)) + np.float32(zero_point)
    return np.clip(q, lo, hi).astype(NP_TYPE[qtype])


def data_scale_zero_point(data, qtype, symmetric, min_real_range=None):
    """compute_data_quant_params: a weight's own min and max."""
    return scale_zero_point(data.min(), data.max(), qtype, symmetric, min_real_range)


# ---------------------------------------------------------------------------------------------
# QDQ quantizer: ORT's QDQQuantizer (qdq_quantizer.py, base_quantizer.py, registry.py,
# operators/*.py) for the op types these models contain.

# quantize_static's default op_types_to_quantize: QLinearOpsRegistry + QDQRegistry keys.
ORT_DEFAULT_OP_TYPES = {
    "ArgMax", "Conv", "Gemm", "MatMul", "Add", "Mul", "Relu", "Clip", "LeakyRelu", "Sigmoid", "MaxPool",
    "GlobalAveragePool", "Split", "Pad", "Reshape", "Squeeze", "Unsqueeze", "Resize", "AveragePool",
    "Concat", "Softmax", "Where", "Gather", "Transpose", "EmbedLayerNormalization", "ConvTranspose",
    "Slice", "GatherElements", "InstanceNormalization", "LayerNormalization", "BatchNormalization",
    "TopK", "CumSum"}


class QdqQuantizer:
    """Marks tensors node by node (each op type's rule), then writes, in the tool's order: Q/DQ for
    tensors with their own parameters, Q/DQ for tensors sharing an input's parameters (Reshape,
    Transpose, MaxPool...), DequantizeLinear for biases; then drops the float initializers and
    sorts the graph as the tool does when it saves."""

    def __init__(self, model, ranges, activation_type, weight_type, per_channel, weight_symmetric,
                 op_types, nodes_to_exclude, min_real_range=None, overrides=None, contrib_domain=False):
        # The tool works on a shape-inferred copy tagged with this property, and keeps both.
        self.model = onnx.shape_inference.infer_shapes(model)
        helper.set_model_props(self.model, {"onnx.infer": "onnxruntime.quant"})
        self.graph = self.model.graph
        self.opset = next(o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx"))
        if per_channel and self.opset < 13:
            raise ValueError("per-channel QDQ needs opset 13 (DequantizeLinear's axis)")
        self.types = elem_types(self.model)
        self.activation_type, self.weight_type = activation_type, weight_type
        self.per_channel, self.weight_symmetric = per_channel, weight_symmetric
        self.op_types, self.nodes_to_exclude = set(op_types), set(nodes_to_exclude)
        self.min_real_range = min_real_range
        self.overrides = overrides or {}
        self.domain = MS_DOMAIN if contrib_domain else None
        self.ranges = dict(ranges)
        self.tensors = collections.OrderedDict()  # name -> (kind, per-channel axis, shared-params provider)
        self.biases = collections.OrderedDict()  # bias -> (node input, weight, beta)
        self.quantized = {}  # name -> (scale initializer, zero-point initializer)
        self.to_remove = []
        self.handlers = {
            "Conv": self._conv, "ConvTranspose": self._conv, "Gemm": self._gemm, "MatMul": self._matmul,
            "Relu": self._removable_activation, "Clip": self._removable_activation,
            "Reshape": self._direct8, "Transpose": self._direct8, "Squeeze": self._direct8,
            "Unsqueeze": self._direct8, "AveragePool": self._direct8, "Slice": self._direct8,
            "TopK": self._direct8, "MaxPool": self._direct8, "Resize": self._direct8,
            "Gather": self._gather, "GatherElements": self._gather, "Where": self._where}
        for op in ("Pad", "Split", "InstanceNormalization", "LayerNormalization", "BatchNormalization", "CumSum"):
            self.handlers[op] = self._not_written

    # -- the run, in quantize_model's order
    def quantize(self):
        self._adjust_ranges()
        self.params = {t: self._activation_params(t, r) for t, r in self.ranges.items()}
        for node in list(self.graph.node):
            if self._selected(node):
                self.handlers.get(node.op_type, self._default)(node)
        self._quantize_own_params()
        self._quantize_shared_params()
        for bias, info in self.biases.items():
            self._quantize_bias(bias, *info)
        for node in self.to_remove:
            self.graph.node.remove(node)
        remove_unused_initializers(self.graph)
        self.model.producer_name, self.model.producer_version = "onnx.quantize", "0.1.0"
        if self.domain:
            set_opset(self.model, MS_DOMAIN, 1)
        ort_topological_sort(self.graph)
        return self.model

    def _selected(self, node):
        return (node.op_type in self.op_types and node.name not in self.nodes_to_exclude
                and node.op_type not in ("QuantizeLinear", "DequantizeLinear"))

    def _adjust_ranges(self):
        """adjust_tensor_ranges: a removable Relu/Clip hands its output range to its input, and a
        Softmax output is [0, 1]."""
        consumers = collections.Counter(i for n in self.graph.node for i in n.input)
        for node in self.graph.node:
            if node.op_type in ("Clip", "Relu"):
                if (self._selected(node) and consumers[node.input[0]] == 1
                        and node.input[0] in self.ranges and node.output[0] in self.ranges):
                    self.ranges[node.input[0]] = self.ranges[node.output[0]]
            elif node.op_type == "Softmax":
                self.ranges[node.output[0]] = (np.float32(0), np.float32(1))

    def _activation_params(self, name, rng):
        """calc_quant_params: overrides first, else the calibrated range, asymmetric."""
        o = self.overrides.get(name, {})
        qtype = o.get("quant_type", self.activation_type)
        if "scale" in o:
            return np.array(o["zero_point"], NP_TYPE[qtype]), np.array(o["scale"], np.float32), qtype
        zp, scale = scale_zero_point(rng[0], rng[1], qtype, o.get("symmetric", False), self.min_real_range)
        return zp, scale, qtype

    # -- marking tensors (QDQQuantizer.quantize_*_tensor)
    def _float(self, name):
        return bool(name) and self.types.get(name) in (TensorProto.FLOAT, TensorProto.FLOAT16)

    def _initializer(self, name):
        return next((t for t in self.graph.initializer if t.name == name), None)

    def _mark(self, name, kind="activation"):
        if self._float(name) and name not in self.tensors:
            self.tensors[name] = (kind, None, None)

    def _mark_shared(self, output, input_name):
        if self._float(output):
            self.tensors[output] = ("activation", None, input_name)

    def _mark_per_channel(self, name, axis):
        init = self._initializer(name)
        if init is not None and init.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16):
            self.tensors[name] = ("weight", axis, None)

    def _mark_bias(self, bias, input_name, weight, beta=1.0):
        init = self._initializer(bias)
        if init is not None and init.data_type == TensorProto.FLOAT and bias not in self.biases:
            self.biases[bias] = (input_name, weight, beta)

    def _marked(self, name):
        return name in self.tensors or name in self.biases

    # -- operators (operators/*.py, QDQ classes)
    def _default(self, node):  # QDQOperatorBase: every float input and output
        for name in list(node.input) + list(node.output):
            self._mark(name)

    def _not_written(self, node):
        raise NotImplementedError("QDQ layout of %s is not reproduced here" % node.op_type)

    def _conv(self, node):  # QDQConv: per-channel weights on axis 0 (ConvTranspose: 1)
        self._mark(node.input[0])
        self._mark(node.output[0])
        if self.per_channel and self._initializer(node.input[1]) is not None:
            self._mark_per_channel(node.input[1], 0 if node.op_type == "Conv" else 1)
        else:
            self._mark(node.input[1], "weight")
        if len(node.input) > 2 and node.input[2]:
            self._mark_bias(node.input[2], node.input[0], node.input[1])

    def _gemm(self, node):  # QDQGemm: weight axis 0 when transB (B is [N, K]), else 1
        self._mark(node.input[0])
        self._mark(node.output[0])
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        if self.per_channel and self._initializer(node.input[1]) is not None:
            self._mark_per_channel(node.input[1], 0 if trans_b else 1)
        else:
            self._mark(node.input[1], "weight")
        if len(node.input) > 2 and self._initializer(node.input[2]) is not None:
            beta = next((a for a in node.attribute if a.name == "beta"), None)
            self._mark_bias(node.input[2], node.input[0], node.input[1], beta.f if beta else 1.0)
            if beta is not None:
                beta.f = 1.0  # the bias carries beta from now on

    def _matmul(self, node):  # QDQMatMul: a constant input is per-channel on axis 1 (N of [K, N])
        for name in list(node.input) + list(node.output):
            if self.per_channel and self._initializer(name) is not None:
                self._mark_per_channel(name, 1)
            else:
                self._mark(name)

    def _removable_activation(self, node):  # QDQRemovableActivation
        if not self._marked(node.input[0]):
            return
        if self._replace_upstream_output(node.input[0], node.output[0]):
            self.to_remove.append(node)
        else:
            self._mark(node.input[0])
        self._mark(node.output[0])

    def _replace_upstream_output(self, upstream, output):
        """try_replacing_upstream_output: the producer writes the activation's output directly, so
        Relu/Clip vanish and their clipping lives in the output's quantization range."""
        consumers = sum(1 for n in self.graph.node for i in n.input if i == upstream)
        io = {v.name for v in list(self.graph.input) + list(self.graph.output)}
        if output not in self.params or consumers != 1 or upstream in io:
            return False
        for n in self.graph.node:
            for k, o in enumerate(n.output):
                if o == upstream:
                    n.output[k] = output
        self.tensors.pop(upstream, None)
        return True

    def _direct8(self, node):  # QDQDirect8BitOp (MaxPool from opset 12, Resize from 11)
        if (node.op_type == "MaxPool" and self.opset < 12) or (node.op_type == "Resize" and self.opset < 11):
            return
        if self._marked(node.input[0]):
            self._mark_shared(node.output[0], node.input[0])

    def _gather(self, node):  # QDQGather: a constant table is quantized like an activation
        init = self._initializer(node.input[0])
        if init is not None and init.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16):
            self._mark(node.input[0])
            self._mark_shared(node.output[0], node.input[0])
        elif self._marked(node.input[0]):
            self._mark_shared(node.output[0], node.input[0])

    def _where(self, node):  # QDQWhere
        if self._marked(node.input[1]) and self._marked(node.input[2]):
            for name in node.output:
                self._mark(name)

    # -- writing Q/DQ
    def _replace_input(self, old, new):
        for n in self.graph.node:
            for k, i in enumerate(n.input):
                if i == old:
                    n.input[k] = new

    def _qdq(self, name, scale, zero_point):
        """One Q and one DQ per tensor, shared by all its consumers (DedicatedQDQPair=False). A graph
        output keeps its name on the DQ's output."""
        q_in, dq_out = name, name + "_DequantizeLinear_Output"
        if name in {o.name for o in self.graph.output}:
            q_in, dq_out = name + "_QuantizeLinear_Input", name
            for n in self.graph.node:
                for k, o in enumerate(n.output):
                    if o == name:
                        n.output[k] = q_in
        else:
            self._replace_input(name, dq_out)
        q_out = name + "_QuantizeLinear_Output"
        self.graph.node.extend([
            helper.make_node("QuantizeLinear", [q_in, scale, zero_point], [q_out], name + "_QuantizeLinear",
                             domain=self.domain),
            helper.make_node("DequantizeLinear", [q_out, scale, zero_point], [dq_out], name + "_DequantizeLinear",
                             domain=self.domain)])
        self.quantized[name] = (scale, zero_point)

    def _quantize_own_params(self):  # _quantize_normal_tensors
        for name, (kind, axis, provider) in list(self.tensors.items()):
            if name in self.quantized or provider is not None:
                continue
            if self._initializer(name) is not None:
                self._dequantized_initializer(name, kind, axis)
            else:
                if name not in self.params:
                    raise ValueError("no calibration range for " + name)
                zp, scale, qtype = self.params[name]
                self.graph.initializer.extend([
                    helper.make_tensor(name + "_zero_point", qtype, [], [int(zp)]),
                    helper.make_tensor(name + "_scale", TensorProto.FLOAT, [], [float(scale)])])
                self._qdq(name, name + "_scale", name + "_zero_point")
            del self.tensors[name]

    def _quantize_shared_params(self):  # _quantize_sharing_param_tensors
        while self.tensors:
            ready = [(n, p) for n, (_, _, p) in self.tensors.items() if p in self.quantized]
            if not ready:
                raise RuntimeError("tensors sharing parameters with unquantized ones: %s" % list(self.tensors))
            for name, provider in ready:
                del self.tensors[name]
                self._qdq(name, *self.quantized[provider])

    def _dequantized_initializer(self, name, kind, axis):
        """An initializer is stored quantized and feeds one DequantizeLinear; ORT's names:
        <w>_quantized, <w>_scale, <w>_zero_point, <w>_DequantizeLinear(_Output)."""
        w = numpy_helper.to_array(self._initializer(name))
        o = self.overrides.get(name, {})
        if axis is not None:
            qtype = self.weight_type if kind == "weight" else self.activation_type
            if qtype == TensorProto.UINT8:
                qtype = TensorProto.INT8  # the tool forces per-channel 8-bit weights to int8
            symmetric = o.get("symmetric", self.weight_symmetric or qtype == TensorProto.INT8)
            zps, scales, channels = [], [], []
            for c in range(w.shape[axis]):
                data = w.take(c, axis).ravel()
                zp, scale = data_scale_zero_point(data, qtype, symmetric, self.min_real_range)
                zps.append(zp)
                scales.append(scale)
                channels.append(np.expand_dims(quantize_values(w.take(c, axis), scale, zp, qtype), axis))
            q = np.concatenate(channels, axis)
            scale_t = helper.make_tensor(name + "_scale", TensorProto.FLOAT, [len(scales)], [float(s) for s in scales])
            zp_t = helper.make_tensor(name + "_zero_point", qtype, [len(zps)], [int(z) for z in zps])
        else:
            qtype = o.get("quant_type", self.weight_type if kind == "weight" else self.activation_type)
            default_symmetric = self.weight_symmetric if qtype == self.weight_type else False
            zp, scale = data_scale_zero_point(w.ravel(), qtype, o.get("symmetric", default_symmetric),
                                              self.min_real_range)
            q = quantize_values(w, scale, zp, qtype)
            scale_t = helper.make_tensor(name + "_scale", TensorProto.FLOAT, [], [float(scale)])
            zp_t = helper.make_tensor(name + "_zero_point", qtype, [], [int(zp)])
        self.graph.initializer.extend([numpy_helper.from_array(q, name + "_quantized"), scale_t, zp_t])
        dq_out = name + "_DequantizeLinear_Output"
        self._replace_input(name, dq_out)
        self.graph.node.extend([helper.make_node(
            "DequantizeLinear", [name + "_quantized", name + "_scale", name + "_zero_point"], [dq_out],
            name + "_DequantizeLinear", axis=axis, domain=self.domain)])
        self.quantized[name] = (name + "_scale", name + "_zero_point")

    def _quantize_bias(self, bias, input_name, weight, beta):
        """quantize_bias_static: int32, zero point 0, scale = input scale * weight scale * beta, so
        an integer kernel adds it to the accumulator as is."""
        init = self._initializer(bias)
        b = numpy_helper.to_array(init)
        value = lambda n: numpy_helper.to_array(self._initializer(n))
        scale = value(self.quantized[input_name][0]) * value(self.quantized[weight][0]) * beta
        q = np.round(b.astype(np.float64) / scale.astype(np.float64))
        if np.abs(q).max() > np.iinfo(np.int32).max:
            # The tool would widen the weight scale first (QDQDisableWeightAdjustForInt32Bias=False).
            raise NotImplementedError("bias %s overflows int32" % bias)
        scale = np.asarray(scale, np.float32).reshape(-1)
        zp = (numpy_helper.from_array(np.zeros(scale.shape, np.int32), bias + "_quantized_zero_point")
              if scale.size > 1 else helper.make_tensor(bias + "_quantized_zero_point", TensorProto.INT32, [], [0]))
        self.graph.initializer.remove(init)
        self.graph.initializer.extend([numpy_helper.from_array(q.astype(np.int32).reshape(b.shape), bias + "_quantized"),
                                       numpy_helper.from_array(scale, bias + "_quantized_scale"), zp])
        self.graph.node.extend([helper.make_node(
            "DequantizeLinear", [bias + "_quantized", bias + "_quantized_scale", bias + "_quantized_zero_point"],
            [bias], bias + "_DequantizeLinear", axis=0 if scale.size > 1 else None, domain=self.domain)])


def quantize_u8s8(model, ranges, excluded):
    """quantize_static(quant_format=QDQ, activation_type=QUInt8, weight_type=QInt8, per_channel=True)
    with its defaults: op types = all the tool knows, weights symmetric (signed type), activations
    asymmetric, Relu/Clip removed."""
    return QdqQuantizer(model, ranges, TensorProto.UINT8, TensorProto.INT8, per_channel=True,
                        weight_symmetric=True, op_types=ORT_DEFAULT_OP_TYPES, nodes_to_exclude=excluded).quantize()


def quantize_a16w8(model, ranges, excluded):
    """get_qnn_qdq_config(activation_type=QUInt16, weight_type=QUInt8): every op type but Cast,
    MinimumRealRange 1e-4, per-tensor weights, unsigned weights asymmetric; a MatMul/LayerNorm
    initializer next to a 16-bit activation is overridden to the 8-bit weight type (the tool would
    otherwise give it the activation type); Sigmoid outputs fixed at scale 1/65536, zero point 0;
    16-bit Q/DQ below opset 21 go to the com.microsoft domain."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    overrides = {}
    for node in g.node:
        if node.name in excluded:
            continue
        if node.op_type in ("MatMul", "LayerNormalization"):
            inputs = node.input[:2]
            if any(i in inits for i in inputs) and any(i and i not in inits for i in inputs):
                for i in inputs:
                    if i in inits:
                        overrides[i] = {"quant_type": TensorProto.UINT8, "symmetric": False}
        elif node.op_type == "Sigmoid":
            overrides[node.output[0]] = {"quant_type": TensorProto.UINT16, "scale": 1.0 / 65536.0, "zero_point": 0}
    op_types = {n.op_type for n in g.node} - {"Cast"}
    return QdqQuantizer(model, ranges, TensorProto.UINT16, TensorProto.UINT8, per_channel=False,
                        weight_symmetric=False, op_types=op_types, nodes_to_exclude=excluded,
                        min_real_range=0.0001, overrides=overrides, contrib_domain=True).quantize()


# ---------------------------------------------------------------------------------------------
# QOperator quantizer: ORT's ONNXQuantizer (onnx_quantizer.py, base_quantizer.py, registry.py's
# QLinearOpsRegistry, operators/*.py QLinear* classes) for the op types these models contain.

class QOperatorQuantizer(QdqQuantizer):
    """Walks the nodes in order. A node of a QLinearOpsRegistry type becomes its QLinear*/QGemm form
    reading and writing uint8 tensors `<t>_quantized`; an input not yet quantized gets a
    QuantizeLinear `<t>_QuantizeLinear` (first use decides, later uses share it); data-movement ops
    run on the uint8 tensor as is; every other node stays float, preceded by a DequantizeLinear
    `<t>_DequantizeLinear` writing the float name for each quantized input, and so does each graph
    output at the end. Initializers are created in the tool's order; unused ones are dropped."""

    def quantize(self):
        self._adjust_ranges()
        self.params = {t: self._activation_params(t, r) for t, r in self.ranges.items()}
        self.qvalues = {}  # float name -> (uint8 name, scale name, zero-point name)
        inits = {t.name for t in self.graph.initializer}
        self.generated = {i.name for i in self.graph.input if i.name not in inits}
        self.new_nodes = []
        handlers = {"Conv": self._qconv, "Gemm": self._qgemm, "MatMul": self._qmatmul,
                    "Add": self._qbinary, "Mul": self._qbinary, "Concat": self._qconcat,
                    "Relu": self._qfold, "Clip": self._qfold, "Sigmoid": self._qactivation,
                    "LeakyRelu": self._qactivation, "Softmax": self._qsoftmax, "Gather": self._qgather,
                    "Reshape": self._qdirect, "Squeeze": self._qdirect, "Unsqueeze": self._qdirect,
                    "Transpose": self._qdirect, "MaxPool": self._qdirect, "Resize": self._qdirect}
        for op in ("ArgMax", "GlobalAveragePool", "Split", "Pad", "AveragePool", "Where", "EmbedLayerNormalization"):
            handlers[op] = self._not_written
        for node in list(self.graph.node):
            count = len(self.new_nodes)
            handler = handlers.get(node.op_type) if self._should_quantize(node) else None
            if handler is None or handler(node) is False:
                self._float_node(node)
            for n in self.new_nodes[count:]:
                self.generated.update(n.output)
        for o in self.graph.output:  # _dequantize_outputs
            self._dequantize(o.name)
        del self.graph.node[:]
        self.graph.node.extend(self.new_nodes)
        remove_unused_initializers(self.graph)  # clean_initializers
        self.model.producer_name, self.model.producer_version = "onnx.quantize", "0.1.0"
        if any(n.domain == MS_DOMAIN for n in self.graph.node):
            set_opset(self.model, MS_DOMAIN, 1)
        ort_topological_sort(self.graph)
        return self.model

    def _should_quantize(self, node):
        """Each QLinear class's should_quantize: the node is selected and its input 0 is float (MatMul
        and Gemm: either input; Gather: only a float initializer table)."""
        if not self._selected(node):
            return False
        if node.op_type in ("MatMul", "Gemm"):
            return self._float(node.input[0]) or self._float(node.input[1])
        if node.op_type == "Gather":
            return self._initializer(node.input[0]) is not None and self._float(node.input[0])
        return self._float(node.input[0])

    # -- parameters and inputs (ONNXQuantizer._get_quantization_params, __quantize_inputs)
    def _add_initializer(self, tensor):  # ONNXModel.add_initializer: first one of a name wins
        if self._initializer(tensor.name) is None:
            self.graph.initializer.extend([tensor])

    def _output_params(self, name, scale=None, zero_point=None):
        """`<t>_zero_point` and `<t>_scale` scalars from the calibrated range (or the fixed values
        given); None when the tensor has no range (the node then stays float)."""
        if name not in self.params:
            return None
        zp, s, qtype = self.params[name]
        if scale is not None:
            zp, s, qtype = np.array(zero_point), np.array(scale, np.float32), self.activation_type
        self._add_initializer(helper.make_tensor(name + "_zero_point", qtype, [], [int(zp)]))
        self._add_initializer(helper.make_tensor(name + "_scale", TensorProto.FLOAT, [], [float(s)]))
        return name + "_scale", name + "_zero_point"

    def _inputs(self, node, indices, weight_axis=None, weight=False):
        """(uint8 name, scale, zero point) per input, plus the QuantizeLinear nodes to add first.
        Initializers are stored quantized: per channel on weight_axis with the weight type, else per
        tensor (weight type for a weight, uint8 asymmetric for an initializer used as an activation)."""
        quantized, nodes = [], []
        for k in indices:
            name = node.input[k]
            if name not in self.qvalues:
                if self._initializer(name) is not None:
                    if weight and self.per_channel and weight_axis is not None:
                        self._per_channel_initializer(name, self.weight_type, weight_axis)
                    else:
                        self._per_tensor_initializer(name, self.weight_type if weight else self.activation_type)
                else:
                    params = self._output_params(name)
                    if params is None:
                        return None, None
                    q = name + "_quantized"
                    nodes.append(helper.make_node("QuantizeLinear", [name, *params], [q], name + "_QuantizeLinear"))
                    self.qvalues[name] = (q,) + params
            quantized.append(self.qvalues[name])
        return quantized, nodes

    def _per_tensor_initializer(self, name, qtype):  # quantize_initializer_impl
        w = numpy_helper.to_array(self._initializer(name))
        symmetric = self.weight_symmetric if qtype == self.weight_type else False
        zp, scale = data_scale_zero_point(w.ravel(), qtype, symmetric)
        self.graph.initializer.extend([
            helper.make_tensor(name + "_scale", TensorProto.FLOAT, [], [float(scale)]),
            helper.make_tensor(name + "_zero_point", qtype, [], [int(zp)]),
            numpy_helper.from_array(quantize_values(w, scale, zp, qtype), name + "_quantized")])
        self.qvalues[name] = (name + "_quantized", name + "_scale", name + "_zero_point")

    def _per_channel_initializer(self, name, qtype, axis):  # quantize_weight_per_channel_impl
        w = numpy_helper.to_array(self._initializer(name))
        axis = axis % w.ndim
        zps, scales, channels = [], [], []
        for c in range(w.shape[axis]):
            zp, scale = data_scale_zero_point(w.take(c, axis).ravel(), qtype, self.weight_symmetric)
            zps.append(int(zp))
            scales.append(float(scale))
            channels.append(np.expand_dims(quantize_values(w.take(c, axis), scale, zp, qtype), axis))
        self.graph.initializer.extend([
            helper.make_tensor(name + "_scale", TensorProto.FLOAT, [len(scales)], scales),
            helper.make_tensor(name + "_zero_point", qtype, [len(zps)], zps),
            numpy_helper.from_array(np.concatenate(channels, axis), name + "_quantized")])
        self.qvalues[name] = (name + "_quantized", name + "_scale", name + "_zero_point")

    def _int32_bias(self, bias, input_name, weight, beta=1.0):
        """quantize_bias_static: int32 `<b>_quantized`, scale input scale x weight scale x beta, clipped
        to int32 (the tool only warns). Its `_quantized_scale`/`_quantized_zero_point` initializers
        go unused in this format and are cleaned away, so they are not written."""
        value = lambda n: numpy_helper.to_array(self._initializer(n))
        b = value(bias)
        scale = value(self.qvalues[input_name][1]) * value(self.qvalues[weight][1]) * beta
        q = np.round(b.astype(np.float64) / scale.astype(np.float64))
        q = np.clip(q, np.iinfo(np.int32).min, np.iinfo(np.int32).max).astype(np.int32)
        self.graph.initializer.extend([numpy_helper.from_array(q.reshape(b.shape), bias + "_quantized")])
        return bias + "_quantized"

    def _dequantize(self, name):
        """_dequantize_value: a quantized tensor a float consumer or a graph output needs, once."""
        if name in self.qvalues and name not in self.generated:
            dq = name + "_DequantizeLinear"
            if not any(n.name == dq for n in self.new_nodes):
                self.new_nodes.append(helper.make_node("DequantizeLinear", list(self.qvalues[name]), [name], dq))

    def _float_node(self, node):  # QuantOperatorBase.quantize
        for name in node.input:
            self._dequantize(name)
        self.new_nodes.append(node)

    def _emit(self, node, op_type, inputs, nodes, params, domain=None, drop=(), **extra):
        """The QLinear node `<name>_quant` writing `<output>_quantized` with the node's attributes."""
        out = node.output[0]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name not in drop}
        attrs.update(extra)
        nodes.append(helper.make_node(op_type, inputs, [out + "_quantized"], node.name + "_quant" if node.name else "",
                                      domain=domain, **attrs))
        self.qvalues[out] = (out + "_quantized",) + params
        self.new_nodes.extend(nodes)

    @staticmethod
    def _flat(quantized):
        return [name for triple in quantized for name in triple]

    # -- operators (operators/*.py, QLinear classes)
    def _qconv(self, node):  # QLinearConv: per-channel int8 weights on axis 0
        params = self._output_params(node.output[0])
        x, nodes = self._inputs(node, [0])
        w, w_nodes = self._inputs(node, [1], weight_axis=0, weight=True)
        if params is None or x is None or w is None:
            return False
        nodes += w_nodes
        inputs = self._flat(x + w) + list(params)
        if len(node.input) == 3:
            inputs.append(self._int32_bias(node.input[2], node.input[0], node.input[1]))
        self._emit(node, "QLinearConv", inputs, nodes, params)

    def _qgemm(self, node):  # QLinearGemm -> com.microsoft QGemm; B per channel on axis 0 if transB
        params = self._output_params(node.output[0])
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        x, nodes = self._inputs(node, [0])
        w, w_nodes = self._inputs(node, [1], weight_axis=0 if trans_b else 1, weight=True)
        if params is None or x is None or w is None:
            return False
        nodes += w_nodes
        bias = ""
        if len(node.input) == 3:
            if self._initializer(node.input[2]) is None:
                return False
            beta = next((a.f for a in node.attribute if a.name == "beta"), 1.0)
            bias = self._int32_bias(node.input[2], node.input[0], node.input[1], beta)
        self._emit(node, "QGemm", self._flat(x + w) + [bias] + list(params), nodes, params, MS_DOMAIN, drop=("beta",))

    def _qmatmul(self, node):  # QLinearMatMul: a constant B per channel on its last axis (N of [K, N])
        x, nodes = self._inputs(node, [0])
        w, w_nodes = self._inputs(node, [1], weight_axis=-1, weight=True)
        params = self._output_params(node.output[0])
        if params is None or x is None or w is None:
            return False
        self._emit(node, "QLinearMatMul", self._flat(x + w) + list(params), nodes + w_nodes, params)

    def _qbinary(self, node):  # QLinearBinaryOp -> com.microsoft QLinearAdd / QLinearMul
        params = self._output_params(node.output[0])
        xs, nodes = self._inputs(node, [0, 1])
        if params is None or xs is None:
            return False
        self._emit(node, "QLinear" + node.op_type, self._flat(xs) + list(params), nodes, params, MS_DOMAIN)

    def _qconcat(self, node):  # QLinearConcat (com.microsoft): output parameters first
        params = self._output_params(node.output[0])
        xs, nodes = self._inputs(node, range(len(node.input)))
        if params is None or xs is None:
            return False
        self._emit(node, "QLinearConcat", list(params) + self._flat(xs), nodes, params, MS_DOMAIN)

    def _qactivation(self, node):  # QLinearActivation -> com.microsoft QLinearSigmoid / QLinearLeakyRelu
        params = self._output_params(node.output[0])
        x, nodes = self._inputs(node, [0])
        if params is None or x is None:
            return False
        self._emit(node, "QLinear" + node.op_type, self._flat(x) + list(params), nodes, params, MS_DOMAIN)

    def _qfold(self, node):
        """QLinearActivation.QuantizeClipRelu: after a quantized producer the Relu/Clip disappears; its
        output is the producer's uint8 tensor, whose range is already the Relu's (_adjust_ranges)."""
        if node.input[0] not in self.qvalues:
            return False
        self.qvalues[node.output[0]] = self.qvalues[node.input[0]]

    def _qsoftmax(self, node):  # QLinearSoftmax (com.microsoft): output fixed at 1/256, zero point 0
        params = self._output_params(node.output[0], 1 / 256.0, 0)
        x, nodes = self._inputs(node, [0])
        if params is None or x is None:
            return False
        self._emit(node, "QLinearSoftmax", self._flat(x) + list(params), nodes, params, MS_DOMAIN, opset=self.opset)

    def _qgather(self, node):  # GatherQuant: the float table stored as uint8, the output shares its parameters
        x, nodes = self._inputs(node, [0])
        self._share(node, x[0], nodes)

    def _qdirect(self, node):
        """Direct8BitOp (Reshape, Squeeze, Unsqueeze, Transpose; QMaxPool from opset 12, QResize from
        11): the same node on the uint8 input, output `<t>_quantized` with the input's parameters;
        left float, without DequantizeLinear, when its input is not quantized."""
        if node.input[0] not in self.qvalues:
            self.new_nodes.append(node)
            return
        if (node.op_type == "MaxPool" and self.opset < 12) or (node.op_type == "Resize" and self.opset < 11):
            return False
        self._share(node, self.qvalues[node.input[0]], [])

    def _share(self, node, quantized, nodes):
        q = copy.deepcopy(node)
        q.input[0], q.output[0] = quantized[0], node.output[0] + "_quantized"
        self.qvalues[node.output[0]] = (q.output[0],) + tuple(quantized[1:])
        self.new_nodes.extend(nodes + [q])


def quantize_qop(model, ranges, excluded):
    """quantize_static(quant_format=QOperator, activation_type=QUInt8, weight_type=QInt8,
    per_channel=True): same defaults as qdq_u8s8 (op types, symmetric int8 weights, asymmetric uint8
    activations), QLinear* operators instead of Q/DQ pairs."""
    return QOperatorQuantizer(model, ranges, TensorProto.UINT8, TensorProto.INT8, per_channel=True,
                              weight_symmetric=True, op_types=ORT_DEFAULT_OP_TYPES,
                              nodes_to_exclude=excluded).quantize()


# ---------------------------------------------------------------------------------------------
# float16: onnxconverter-common's convert_float_to_float16(keep_io_types=True)

FP16_OP_BLOCK_LIST = {
    "ArrayFeatureExtractor", "Binarizer", "CastMap", "CategoryMapper", "DictVectorizer", "FeatureVectorizer",
    "Imputer", "LabelEncoder", "LinearClassifier", "LinearRegressor", "Normalizer", "OneHotEncoder",
    "RandomUniformLike", "SVMClassifier", "SVMRegressor", "Scaler", "TreeEnsembleClassifier",
    "TreeEnsembleRegressor", "ZipMap", "NonMaxSuppression", "TopK", "RoiAlign", "Resize", "Range", "CumSum",
    "Min", "Max", "Upsample"}


def to_float16_array(a, min_positive=1e-7, max_finite=1e4):
    """convert_np_to_float16: magnitudes clamped into [1e-7, 1e4] (0, inf and NaN kept), so the
    causal mask's float32 lowest becomes -1e4, not -inf."""
    a = np.asarray(a, np.float32)
    a = np.where((0 < a) & (a < min_positive), min_positive, a)
    a = np.where((-min_positive < a) & (a < 0), -min_positive, a)
    a = np.where((max_finite < a) & (a < np.inf), max_finite, a)
    a = np.where((-np.inf < a) & (a < -max_finite), -max_finite, a)
    return a.astype(np.float16)


def tensor_to_float16(t):
    return numpy_helper.from_array(to_float16_array(numpy_helper.to_array(t)), t.name)


def convert_float16(model):
    m = onnx.shape_inference.infer_shapes(copy.deepcopy(model))
    g = m.graph
    FLOAT, HALF = TensorProto.FLOAT, TensorProto.FLOAT16
    value_info = {vi.name: vi for vi in g.value_info}

    def add_value_info(like, name, elem_type):
        vi = g.value_info.add()
        vi.CopyFrom(like)
        vi.name, vi.type.tensor_type.elem_type = name, elem_type
        value_info[name] = vi

    # Graph inputs stay float32: one Cast per consumer, named <input>_cast_to_<consumer>.
    for gi in [i for i in g.input if i.type.tensor_type.elem_type == FLOAT]:
        for node in [n for n in g.node if gi.name in n.input]:
            cast = gi.name + "_cast_to_" + node.name
            g.node.extend([helper.make_node("Cast", [gi.name], [cast], cast, to=HALF)])
            add_value_info(gi, cast, HALF)
            for k, i in enumerate(node.input):
                if i == gi.name:
                    node.input[k] = cast
    blocked = [n for n in g.node if n.op_type in FP16_OP_BLOCK_LIST]
    blocked_outputs = {o for n in blocked for o in n.output}
    # Tensors in attributes (Constant, ConstantOfShape) of nodes that run in float16.
    for node in g.node:
        if node.op_type in FP16_OP_BLOCK_LIST:
            continue
        for attr in node.attribute:
            if attr.HasField("t") and attr.t.data_type == FLOAT:
                attr.t.CopyFrom(tensor_to_float16(attr.t))
            for k, t in enumerate(attr.tensors):
                if t.data_type == FLOAT:
                    attr.tensors[k].CopyFrom(tensor_to_float16(t))
        # A Cast to float32 would leave its consumers with mixed types; onnxconverter-common up to
        # 1.13 and ORT's transformers/float16.py retarget it, and so do we.
        if node.op_type == "Cast":
            for attr in node.attribute:
                if attr.name == "to" and attr.i == FLOAT:
                    attr.i = HALF
    for vi in g.value_info:
        if vi.name not in blocked_outputs and vi.type.tensor_type.elem_type == FLOAT:
            vi.type.tensor_type.elem_type = HALF
    # Blocked ops run in float32 between Casts.
    for node in blocked:
        for k, name in enumerate(node.input):
            vi = value_info.get(name)
            if vi is not None and vi.type.tensor_type.elem_type == HALF:
                cast = node.name + "_input_cast_" + str(k)
                add_value_info(vi, cast, FLOAT)
                g.node.extend([helper.make_node("Cast", [name], [cast], node.name + "_input_cast" + str(k), to=FLOAT)])
                node.input[k] = cast
        for k, name in enumerate(node.output):
            vi = value_info.get(name) or next((o for o in g.output if o.name == name), None)
            if vi is not None and vi.type.tensor_type.elem_type == FLOAT:
                cast = node.name + "_output_cast_" + str(k)
                add_value_info(vi, cast, FLOAT)
                vi.type.tensor_type.elem_type = HALF
                g.node.extend([helper.make_node("Cast", [cast], [name], node.name + "_output_cast" + str(k), to=HALF)])
                node.output[k] = cast
    blocked_inputs = {i for n in blocked for i in n.input}
    for k, t in enumerate(g.initializer):
        if t.data_type == FLOAT and t.name not in blocked_inputs:
            g.initializer[k].CopyFrom(tensor_to_float16(t))
    # Graph outputs stay float32: <producer>_cast_to_<output> feeds a Cast back to float32. A node
    # that also reads the output inside the graph (the decoders' present_k -> Transpose) reads the
    # float16 tensor; onnxconverter-common leaves it on the float32 output, which ORT rejects.
    for go in [o for o in g.output if o.type.tensor_type.elem_type == FLOAT]:
        for node in [n for n in g.node if go.name in n.output]:
            cast = node.name + "_cast_to_" + go.name
            for n in g.node:
                for k, i in enumerate(n.input):
                    if i == go.name:
                        n.input[k] = cast
            g.node.extend([helper.make_node("Cast", [cast], [go.name], cast, to=FLOAT)])
            add_value_info(go, cast, HALF)
            for k, o in enumerate(node.output):
                if o == go.name:
                    node.output[k] = cast
    converter_sort(g)
    # onnxconverter-common then drops Cast(to float16) -> Cast(to float32) pairs; none arise here.
    producer = {o: n for n in g.node for o in n.output}
    for n in g.node:
        up = producer.get(n.input[0]) if n.op_type == "Cast" and n.attribute[0].i == FLOAT else None
        if up is not None and up.op_type == "Cast" and up.attribute[0].i == HALF:
            raise NotImplementedError("Cast pair %s -> %s would be removed" % (up.name, n.name))
    return m


def converter_sort(graph):
    """onnxconverter-common's sort_graph_node: repeatedly take the first node none of whose
    inputs is still to be produced."""
    pending = list(graph.node)
    produced_later = {o for n in pending for o in n.output}
    order = []
    while pending:
        node = next(n for n in pending if not any(i in produced_later for i in n.input))
        order.append(node)
        pending.remove(node)
        produced_later.difference_update(node.output)
    del graph.node[:]
    graph.node.extend(order)


# ---------------------------------------------------------------------------------------------
# MatMulNBits: matmul_nbits_quantizer.py's DefaultWeightOnlyQuantizer (QOperator format), whose
# numbers come from MLAS's BlockwiseQuantizer (range2scalezp, quantizeAndTranspose).

def round_half_away(x):
    """C's roundf."""
    x = np.asarray(x, np.float64)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def blockwise_4bit(w, block_size):
    """B [K, N] -> packed [N, k_blocks, block_size/2] uint8 (low nibble first), scales
    [N * k_blocks] float32, zero points [N * ceil(k_blocks/2)] uint8 (low nibble first, a missing
    high nibble is 8); each block is block_size consecutive rows of one column."""
    k, n = w.shape
    k_blocks = (k + block_size - 1) // block_size
    w = np.pad(w.astype(np.float32), ((0, k_blocks * block_size - k), (0, 0)))
    blocks = w.T.reshape(n, k_blocks, block_size)
    lo = np.minimum(blocks.min(axis=2), np.float32(0))
    hi = np.maximum(blocks.max(axis=2), np.float32(0))
    scale = ((hi - lo) / np.float32(15)).astype(np.float32)
    safe = np.where(scale != 0, scale, np.float32(1))
    zp_fp = np.where(scale != 0, np.float32(0) - lo / safe, lo).astype(np.float32)
    zp = np.clip(round_half_away(zp_fp), 0, 15).astype(np.uint8)
    reciprocal = np.where(scale != 0, np.float32(1) / safe, np.float32(0)).astype(np.float32)
    v = (blocks * reciprocal[:, :, None]).astype(np.float32) + zp[:, :, None].astype(np.float32)
    q = np.clip(round_half_away(v), 0, 15).astype(np.uint8)
    packed = (q[:, :, 0::2] | (q[:, :, 1::2] << 4)).astype(np.uint8)
    zp_pairs = np.full((n, (k_blocks + 1) // 2 * 2), 8, np.uint8)
    zp_pairs[:, :k_blocks] = zp
    zero_points = (zp_pairs[:, 0::2] | (zp_pairs[:, 1::2] << 4)).astype(np.uint8).ravel()
    return packed, scale.ravel(), zero_points


ONNX_INT4, ONNX_UINT4 = 22, 21  # TensorProto.INT4 / UINT4, which onnx 1.12 does not name


def pack_4bit(values):
    """Values in [-8, 15] -> bytes, two a byte over the flat array, the first in the low nibble
    (pack_int8_to_int4)."""
    flat = np.asarray(values).astype(np.int16).ravel() & 0xF
    if flat.size % 2:
        flat = np.append(flat, 0)
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8).tobytes()


def tensor_4bit(name, values, qtype):
    t = TensorProto()
    t.name = name
    t.data_type = qtype
    t.dims.extend(np.asarray(values).shape)
    t.raw_data = pack_4bit(values)
    return t


def to_opset21(model):
    """The default domain at opset 21, which int4 needs. ONNX Runtime's tool only relabels the
    opset ("the generated model may not be a valid model"): these exports' ReduceMean, whose axes
    became an input at opset 18, would not load. So the model takes the form an exporter at that
    opset writes -- the axes an int64 initializer -- the only change these models need."""
    g = model.graph
    for node in g.node:
        if node.op_type != "ReduceMean":
            continue
        axes = [a for a in node.attribute if a.name == "axes"]
        if axes:
            name = node.output[0] + "_axes"
            g.initializer.append(numpy_helper.from_array(np.array(axes[0].ints, np.int64), name))
            node.input.append(name)
            node.attribute.remove(axes[0])
    set_opset(model, "", 21)


def gather_4bit(data, block_size):
    """quantize_ndarray for a Gather table (quantize axis 1, asymmetric): per block of block_size
    columns of a row, min and max widened to 0, scale (max - min) / 15, zero point and values
    rounded half to even (numpy) and clamped to [0, 15]; a block of zeros gets zero point 8."""
    v, d = data.shape
    blocks = data.astype(np.float32).reshape(v, d // block_size, block_size)
    lo = np.minimum(blocks.min(axis=2, keepdims=True), 0)
    hi = np.maximum(blocks.max(axis=2, keepdims=True), 0)
    scale = ((hi - lo) / np.float32(15.0)).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1), scale)
    zp = np.where(scale == 0, 8, (-lo / safe).round()).clip(0, 15).astype(np.uint8)
    q = np.where(scale == 0, 8, (blocks / safe + zp).round()).clip(0, 15).astype(np.uint8)
    return q.reshape(v, d), scale.reshape(v, d // block_size), zp.reshape(v, d // block_size)


def qdq_symmetric_4bit(w, block_size):
    """quantize_qdq_matmul_4bits, symmetric (MLAS's range2scale as this script reads it): per block
    of block_size rows of a column, the one of min and max (widened to 0) of larger magnitude
    divided by -8 is the scale, values round(w / scale) (halves away from zero) clamped to [-8, 7].
    Returns the int4 values [K, N] and the scales [K / block_size, N]."""
    k, n = w.shape
    k_blocks = (k + block_size - 1) // block_size
    blocks = np.pad(w.astype(np.float32), ((0, k_blocks * block_size - k), (0, 0))).reshape(k_blocks, block_size, n)
    lo = np.minimum(blocks.min(axis=1), np.float32(0))
    hi = np.maximum(blocks.max(axis=1), np.float32(0))
    scale = (np.where(np.abs(hi) > np.abs(lo), hi, lo) / np.float32(-8)).astype(np.float32)
    reciprocal = np.where(scale != 0, np.float32(1) / np.where(scale != 0, scale, np.float32(1)), np.float32(0))
    q = np.clip(round_half_away(blocks * reciprocal.astype(np.float32)[:, None, :]), -8, 7).astype(np.int8)
    return q.reshape(k_blocks * block_size, n)[:k], scale


def quantize_qdq_int4(model, block_size=32):
    """MatMulNBitsQuantizer(block_size=32, is_symmetric=True, quant_format=QDQ): each MatMul of a
    2-D initializer B reads it through a DequantizeLinear of an int4 B (axis 0, block_size)."""
    m = copy.deepcopy(model)
    to_opset21(m)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    nodes = []
    for node in g.node:
        b = inits.get(node.input[1]) if node.op_type == "MatMul" else None
        if b is None or len(b.dims) != 2:
            nodes.append(node)
            continue
        q, scales = qdq_symmetric_4bit(numpy_helper.to_array(b), block_size)
        g.initializer.extend([tensor_4bit(b.name + "_DQ_Q4", q, ONNX_INT4),
                              numpy_helper.from_array(scales, b.name + "_DQ_scales")])
        nodes.append(helper.make_node("DequantizeLinear", [b.name + "_DQ_Q4", b.name + "_DQ_scales"],
                                      [b.name + "_DQ_Q4_output"], node.name + "_DQ_Q4" if node.name else "",
                                      axis=0, block_size=block_size))
        nodes.append(helper.make_node("MatMul", [node.input[0], b.name + "_DQ_Q4_output"], [node.output[0]],
                                      node.name + "_matmul_Q4" if node.name else ""))
    del g.node[:]
    g.node.extend(nodes)
    remove_unused_initializers(g)
    return m


def quantize_matmulnbits(model, block_size=32):
    m = copy.deepcopy(model)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    set_opset(m, MS_DOMAIN, 1)
    to_opset21(m)  # op_types_to_quantize has Gather: the tool moves the model to opset 21 for uint4
    nodes = []
    for node in g.node:
        table = inits.get(node.input[0]) if node.op_type == "Gather" else None
        if table is not None and len(table.dims) == 2:
            q, scales, zero_points = gather_4bit(numpy_helper.to_array(table), block_size)
            g.initializer.extend([tensor_4bit(table.name + "_Q4", q, ONNX_UINT4),
                                  numpy_helper.from_array(scales, table.name + "_scales"),
                                  tensor_4bit(table.name + "_zero_points", zero_points, ONNX_UINT4)])
            axis = [a.i for a in node.attribute if a.name == "axis"]
            nodes.append(helper.make_node(
                "GatherBlockQuantized", [table.name + "_Q4", node.input[1], table.name + "_scales", table.name + "_zero_points"],
                [node.output[0]], node.name + "_Q4" if node.name else "", domain=MS_DOMAIN,
                gather_axis=axis[0] if axis else 0, quantize_axis=1, block_size=block_size))
            continue
        b = inits.get(node.input[1]) if node.op_type == "MatMul" else None
        if b is None or len(b.dims) != 2:
            nodes.append(node)
            continue
        w = numpy_helper.to_array(b)
        packed, scales, zero_points = blockwise_4bit(w, block_size)
        g.initializer.extend([numpy_helper.from_array(packed, b.name + "_Q4"),
                              numpy_helper.from_array(scales, b.name + "_scales"),
                              numpy_helper.from_array(zero_points, b.name + "_zero_points")])
        # accuracy_level is written only when set; the tool's default is None.
        nodes.append(helper.make_node(
            "MatMulNBits", [node.input[0], b.name + "_Q4", b.name + "_scales", b.name + "_zero_points"],
            [node.output[0]], node.name + "_Q4" if node.name else "", domain=MS_DOMAIN,
            K=w.shape[0], N=w.shape[1], bits=4, block_size=block_size))
    del g.node[:]
    g.node.extend(nodes)
    remove_unused_initializers(g)
    return m


# ---------------------------------------------------------------------------------------------
# Inputs (fixed seeds) and the whole run

def image_inputs(seed, count):
    rng = np.random.default_rng(seed)
    return [{"image": rng.random((1, 3, 32, 32), dtype=np.float32)} for _ in range(count)]


def prefill_inputs(seed, count, seq=16):
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.integers(0, 256, (1, seq), dtype=np.int64)} for _ in range(count)]


def decode_inputs(seed, count, past=15):
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(count):
        f = {"input_ids": rng.integers(0, 256, (1, 1), dtype=np.int64)}
        for name in ("past_k_0", "past_v_0", "past_k_1", "past_v_1"):
            f[name] = rng.standard_normal((1, 4, past, 16), dtype=np.float32)
        feeds.append(f)
    return feeds


CALIBRATION_COUNT = 8
MODELS = [("cnn_upsample", image_inputs), ("decoder_prefill", prefill_inputs), ("decoder_decode", decode_inputs)]


def save(model, name):
    # onnx 1.12's checker knows neither opset 21 nor the 4-bit types: ONNX Runtime checks those
    # models when compare() loads them.
    if all(op.version <= 17 for op in model.opset_import if op.domain == ""):
        onnx.checker.check_model(model)
    data = model.SerializeToString()
    path = os.path.join(OUT, name + ".onnx")
    with open(path, "wb") as f:
        f.write(data)
    return path


def compare(ort, reference, candidate, feeds):
    """Per output: max |candidate - float| relative to the float output's range."""
    names = [o.name for o in reference.graph.output]
    results = []
    for m in (reference, candidate):
        s = ort.session(m.SerializeToString(), optimize=True)
        try:
            results.append(ort.run(s, feeds, names))
        finally:
            ort.release_session(s)
    return [(n, float(np.abs(c.astype(np.float32) - f).max() / max(float(f.max() - f.min()), 1e-12)))
            for n, f, c in zip(names, *results)]


def describe(model):
    ops = collections.Counter((n.domain + "::" if n.domain else "") + n.op_type for n in model.graph.node)
    return "%d nodes: %s" % (len(model.graph.node), ", ".join("%s=%d" % kv for kv in sorted(ops.items())))


def main():
    os.makedirs(OUT, exist_ok=True)
    ort = Ort()
    print("ONNX Runtime %s (C API %d) from %s" % (ort.version, ORT_API_VERSION, os.path.relpath(ORT_LIB, ROOT)))
    for seed, (stem, make_inputs) in enumerate(MODELS):
        original = load_export(stem)
        model = fold_batchnorm(original)
        calibration = make_inputs(1000 + seed, CALIBRATION_COUNT)
        ranges = calibrate(ort, model, calibration)
        excluded = {n.name for n in model.graph.node} - data_nodes(model.graph)
        excluded |= unquantizable_nodes(model.graph, ranges)
        variants = [("qdq_u8s8", quantize_u8s8(model, ranges, excluded)),
                    ("qdq_a16w8", quantize_a16w8(model, ranges, excluded)),
                    ("qop", quantize_qop(model, ranges, excluded)),
                    ("fp16", convert_float16(original))]
        if stem.startswith("decoder"):
            variants.append(("matmulnbits", quantize_matmulnbits(original)))
            variants.append(("qdq_int4", quantize_qdq_int4(original)))
        # Rounding alone shows on an input the ranges were taken from; a held-out input adds the
        # clipping of values beyond those ranges (MinMax over 8 inputs), which dominates there.
        checks = [("calibration input", calibration[0]), ("held-out input", make_inputs(2000 + seed, 1)[0])]
        for variant, q in variants:
            path = save(q, "%s_%s" % (stem, variant))
            print("%s (%d bytes) %s" % (os.path.relpath(path, ROOT), os.path.getsize(path), describe(q)))
            for what, feeds in checks:
                try:
                    diffs = compare(ort, original, q, feeds)
                    print("    max |variant - float| / float range, %s: %s" %
                          (what, ", ".join("%s %.4f" % d for d in diffs)))
                except RuntimeError as e:
                    print("    does not run in ONNX Runtime's CPU EP: %s" % e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
