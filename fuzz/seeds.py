#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets into OUT/<target>/ from the project's test models.

model_load      the models testdata/generate.py writes and the committed exports (small ones)
embedded_weights  the same models
context_binary  the .bin files ctxgen compiles from those models
ref_program     every program inside those .bin files (docs/context-binary-format.md §5)
command_line    NUL-separated argument lists
manifest        share manifests
cache_entry     the compile cache entry of testdata/cnn.onnx (the model that target compiles)
object_header   objects compile --object makes of the small test models
"""
import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile

MAX_SEED_BYTES = 256 * 1024  # larger seeds slow every execution that mutates them


def seed_models(source, scratch):
    models = os.path.join(scratch, "models")
    subprocess.run([sys.executable, os.path.join(source, "testdata", "generate.py"), models], check=True)
    found = []
    for root in (models, os.path.join(source, "testdata")):
        for folder, _, files in os.walk(root):
            found += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".onnx")]
    return [m for m in found if os.path.getsize(m) <= MAX_SEED_BYTES]


def compile_binaries(ctxgen, models, scratch):
    binaries = []
    # The voice-activity model once more, compiled for one sample rate: a graph with a fixed input;
    # the model with external data once more, weightless: a binary naming its source data.
    runs = [[model, "--allow-empty"] for model in models]
    runs += [[model, "--fix-value", "sr=16000"] for model in models if os.path.basename(model) == "vad.onnx"]
    runs += [[model, "--weightless"] for model in models if os.path.basename(model) == "weightless.onnx"]
    for i, args in enumerate(runs):
        out = os.path.join(scratch, "out%d" % i)
        run = subprocess.run([ctxgen, "-q", "compile"] + args + ["--output-dir", out],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if run.returncode != 0:
            continue
        binaries += [os.path.join(out, f) for f in sorted(os.listdir(out)) if f.endswith(".bin")]
    return binaries


def programs_of(path):
    """The program payloads of a context binary, read by the layout of format version 3."""
    data = open(path, "rb").read()
    graph_table, = struct.unpack_from("<Q", data, 48)
    graph_count, = struct.unpack_from("<I", data, 80)
    at = graph_table
    programs = []

    def string():
        nonlocal at
        n, = struct.unpack_from("<I", data, at)
        at += 4 + n

    def ios(with_values=False):
        nonlocal at
        count, = struct.unpack_from("<I", data, at)
        at += 4
        for _ in range(count):
            string()
            _, rank = struct.unpack_from("<iI", data, at)
            at += 8 + 8 * rank
            if with_values:
                string()  # a fixed input's value

    for _ in range(graph_count):
        string()
        ios()
        ios()
        ios(with_values=True)
        offset, size, _ = struct.unpack_from("<QQQ", data, at)
        at += 24
        ids, = struct.unpack_from("<I", data, at)
        at += 4 + 4 * ids
        programs.append(data[offset:offset + size])
    return programs


ARGUMENTS = [
    ["compile", "m.onnx", "-e", "ref", "--output-dir", "out", "--force"],
    ["share", "a.onnx,b.onnx", "--fix-dim", "batch=1", "--input-shape", "a:x=1x3x224x224", "--report", "r.json"],
    ["share", "a.onnx", "b.onnx", "--fix-value", "b:sr=16000", "--external-initializers-file", "w.data", "-v"],
    ["compile", "m.onnx", "--target-cpu", "avx2,avx512_core", "--output-dir", "dist"],
    ["compile", "m.onnx", "--embed", "--stop-after", "specialise", "-o", "x_ctx.onnx", "--node-name-prefix", "p_"],
    ["verify", "m_ctx.onnx", "--reference", "m.onnx", "--rtol", "1e-3", "--atol", "1e-4", "--input-shape", "x=1x2"],
    ["inspect", "m_ctx.onnx", "--json"],
    ["--list-backends"],
]

MANIFESTS = [
    '{"models": [{"path": "prefill.onnx", "fix_dim": {"seq": 128}, "input_shape": {"ids": [1, 128]}}, '
    '{"path": "decode.onnx", "fix_value": {"sr": [16000]}}], "output_dir": "dist", "backend": "ref", "target_cpu": "avx2", '
    '"fix_dim": {"batch": 1}, "node_name_prefix": "g_", "external_initializers_file": "w.data", "embed": false}',
    '{"models": [{"path": "a.onnx"}], "fix_value": {"sr": 16000, "flag": true}}',
    # What testers once got past the reader: a NUL inside a path, a duplicate key, a manifest
    # naming itself as an output.
    '{"models": [{"path": "cnn.onnx\\u0000/tp.onnx"}]}',
    '{"models": [{"path": "a.onnx"}], "output_dir": "x", "output_dir": "y"}',
    '{"models": [{"path": "a.onnx", "input_shape": {"x": [1, -1, 4294967296]}}], "external_initializers_file": "fuzz.json"}',
]


def write(folder, name, data):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ctxgen", required=True, help="the ctxgen binary that compiles the seed binaries")
    parser.add_argument("--source", required=True, help="the repository")
    parser.add_argument("--out", required=True, help="folder of the corpora")
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as scratch:
        models = seed_models(args.source, scratch)
        for i, model in enumerate(models):
            for target in ("model_load", "embedded_weights"):
                write(os.path.join(args.out, target), "%03d.onnx" % i, open(model, "rb").read())
        binaries = compile_binaries(args.ctxgen, models, scratch)
        if not binaries:
            sys.exit("seeds.py: ctxgen compiled none of the test models")
        for i, binary in enumerate(binaries):
            data = open(binary, "rb").read()
            if len(data) <= MAX_SEED_BYTES:
                write(os.path.join(args.out, "context_binary"), "%03d.bin" % i, data)
            for k, program in enumerate(programs_of(binary)):
                write(os.path.join(args.out, "ref_program"), "%03d_%d.prog" % (i, k), program)
        cache = os.path.join(scratch, "cache")
        subprocess.run([args.ctxgen, "-q", "compile", os.path.join(args.source, "testdata", "cnn.onnx"), "--output-dir",
                        os.path.join(scratch, "cached"), "--cache", cache], check=True)
        for folder, _, files in os.walk(os.path.join(cache, "entries")):
            for f in files:
                write(os.path.join(args.out, "cache_entry"), f, open(os.path.join(folder, f), "rb").read())
        for i, model in enumerate(models):
            made = os.path.join(scratch, "object%d.ctxo" % i)
            run = subprocess.run([args.ctxgen, "-q", "compile", model, "--allow-empty", "--object", made],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if run.returncode == 0 and os.path.getsize(made) <= MAX_SEED_BYTES:
                write(os.path.join(args.out, "object_header"), "%03d.ctxo" % i, open(made, "rb").read())
    for i, argv in enumerate(ARGUMENTS):
        write(os.path.join(args.out, "command_line"), "args%d" % i, "\0".join(argv).encode())
    for i, text in enumerate(MANIFESTS):
        write(os.path.join(args.out, "manifest"), "%d.json" % i, text.encode())
    write(args.out, ".seeded", b"")


if __name__ == "__main__":
    main()
