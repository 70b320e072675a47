#!/usr/bin/env python3
# tests/nn/check_kiln_file.py: a file kiln wrote, read by Python's json and struct, NumPy, PyTorch and the safetensors library where present.
"""Usage: check_kiln_file.py WRITE_SAMPLE

Runs the write_sample helper into a temporary folder (removed at the end) and
reads its output with every reader this Python has: its own spec-following
reader always (json + struct), NumPy, PyTorch (torch.frombuffer) and Hugging
Face's safetensors package when they import. The values are the formulas of
write_sample.c."""
import json
import os
import struct
import subprocess
import sys
import tempfile

EXPECT = {
    "layer.weight": ("F32", [2, 3], [-1.5 + 0.5 * i for i in range(6)]),
    "layer.bias": ("F32", [4], [0.25 - 2.0 * i for i in range(4)]),
    "conv.weight": ("F32", [2, 1, 2, 2], [100.0 + 0.125 * i for i in range(8)]),
    "labels": ("I32", [7], [i - 5 for i in range(7)]),
}


def read_by_spec(path):
    """The format as its documentation states it, nothing more."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0, "header length %d is not a multiple of 8" % n
    header_text = raw[8:8 + n].decode("utf-8")
    assert header_text.startswith("{") and header_text.rstrip(" ") == header_text.rstrip(), repr(header_text[-8:])
    header = json.loads(header_text)
    assert header.pop("__metadata__") == {"format": "pt"}
    data = raw[8 + n:]
    out, spans = {}, []
    for name, info in header.items():
        begin, end = info["data_offsets"]
        spans.append((begin, end))
        code = {"F32": "f", "I32": "i"}[info["dtype"]]
        count = (end - begin) // 4
        out[name] = (info["dtype"], info["shape"], list(struct.unpack("<%d%s" % (count, code), data[begin:end])))
    spans.sort()
    at = 0
    for begin, end in spans:
        assert begin == at, "data not contiguous at %d" % begin
        at = end
    assert at == len(data), "%d bytes after the data" % (len(data) - at)
    return out, list(header.keys())


def same(got, name):
    dtype, shape, values = EXPECT[name]
    assert got[0] == dtype and list(got[1]) == shape, (name, got[0], got[1])
    assert [float(v) for v in got[2]] == [float(v) for v in values], (name, got[2], values)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix="kiln-nn-py-") as tmp:
        path = os.path.join(tmp, "kiln.safetensors")
        subprocess.run([sys.argv[1], path], check=True)
        readers = []
        tensors, order = read_by_spec(path)
        # The reference writer's order: F32 by name, then I32.
        assert order == ["conv.weight", "layer.bias", "layer.weight", "labels"], order
        for name in EXPECT:
            same(tensors[name], name)
        readers.append("json+struct")
        try:
            import numpy as np
        except ImportError:
            np = None
        if np is not None:
            raw = open(path, "rb").read()
            (n,) = struct.unpack("<Q", raw[:8])
            header = json.loads(raw[8:8 + n])
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                begin, end = info["data_offsets"]
                arr = np.frombuffer(raw[8 + n + begin:8 + n + end], dtype={"F32": "<f4", "I32": "<i4"}[info["dtype"]])
                arr = arr.reshape(info["shape"])
                same((info["dtype"], list(arr.shape), arr.ravel().tolist()), name)
            readers.append("numpy " + np.__version__)
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            raw = bytearray(open(path, "rb").read())
            (n,) = struct.unpack("<Q", raw[:8])
            header = json.loads(bytes(raw[8:8 + n]))
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                begin, end = info["data_offsets"]
                dtype = {"F32": torch.float32, "I32": torch.int32}[info["dtype"]]
                t = torch.frombuffer(raw, dtype=dtype, offset=8 + n + begin, count=(end - begin) // 4)
                t = t.reshape(info["shape"])
                same((info["dtype"], list(t.shape), t.flatten().tolist()), name)
            readers.append("torch " + torch.__version__)
        try:
            from safetensors import safe_open
            import safetensors
        except ImportError:
            safe_open = None
        if safe_open is not None:
            with safe_open(path, framework="pt" if torch is not None else "numpy") as f:
                assert f.metadata() == {"format": "pt"}
                for name in f.keys():
                    t = f.get_tensor(name)
                    dtype = {"float32": "F32", "int32": "I32"}[str(t.dtype).replace("torch.", "")]
                    values = t.flatten().tolist() if torch is not None else t.ravel().tolist()
                    same((dtype, list(t.shape), values), name)
            readers.append("safetensors " + safetensors.__version__)
        print("kiln's file read by:", ", ".join(readers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
