# python/tests/test_dtypes.py: the ten dtypes from Python: the dtype objects, asarray keeping dtypes, exact values out (numpy, tolist, item), astype, NumPy and PyTorch round trips (copies and DLPack), safetensors PyTorch writes, and the refusals.
import json
import math
import pickle
import struct

import numpy as np
import pytest

import kiln

NAMES = ["bool", "int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
SHORT = {"bool": "bool", "int8": "i8", "uint8": "u8", "int16": "i16", "int32": "i32", "int64": "i64",
         "float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64"}
SIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2,
        "float32": 4, "float64": 8}
INF = math.inf

# Values each dtype holds exactly, with its edges: the limits, the smallest
# subnormal and the largest finite float, -0.0, infinities, an int64 past 2^53.
VALUES = {
    "bool": [True, False, True],
    "int8": [-128, 127, 0, -1],
    "uint8": [0, 255, 7],
    "int16": [-32768, 32767, -2],
    "int32": [-(2**31), 2**31 - 1, 5],
    "int64": [-(2**63), 2**63 - 1, 2**53 + 1],
    "float16": [65504.0, -(2.0**-24), 0.5, -0.0, INF],
    "bfloat16": [3.3895313892515355e38, -(2.0**-133), 1.5, -0.0, -INF],
    "float32": [3.4028234663852886e38, 2.0**-149, -1.5, -0.0, INF],
    "float64": [0.1, 5e-324, -1e300, -0.0, -INF],
}
PY_TYPE = {"bool": bool, "float16": float, "bfloat16": float, "float32": float, "float64": float}


def dt(name):
    return getattr(kiln, name)


def same(a, b):
    """Equal values of the same Python type, -0.0 told from 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return a == b


def all_same(xs, ys):
    return len(xs) == len(ys) and all(same(x, y) for x, y in zip(xs, ys))


def numpy_exports_bool():
    try:
        np.zeros(1, bool).__dlpack__()
        return True
    except (BufferError, TypeError, RuntimeError):
        return False


def test_dtype_objects():
    for name in NAMES:
        d = dt(name)
        assert isinstance(d, kiln.DType)
        assert d.name == name and d.short_name == SHORT[name] and d.itemsize == SIZE[name]
        assert repr(d) == f"kiln.{name}" and str(d) == name
        assert d == name and d == SHORT[name] and d != "complex64"
        assert kiln.zeros(2, dtype=d).dtype is d
        assert kiln.zeros(2, dtype=name).dtype is d
        if name != "bfloat16":
            assert kiln.zeros(2, dtype=np.dtype(name)).dtype is d
    assert len({hash(dt(n)) for n in NAMES}) == 10
    assert kiln.zeros(1, dtype=bool).dtype is kiln.bool
    assert kiln.zeros(1, dtype=float).dtype is kiln.float32
    assert kiln.zeros(1, dtype=np.float16).dtype is kiln.float16
    assert kiln.zeros(1, dtype="<f8").dtype is kiln.float64
    assert kiln.zeros(1, dtype="?").dtype is kiln.bool
    import kiln as k
    assert "bool" not in k.__all__, "a star import must not hide Python's bool"
    with pytest.raises(kiln.DtypeMismatchError, match=r"'complex64' is not one kiln has: kiln has bool, int8"):
        kiln.zeros(1, dtype="complex64")
    with pytest.raises(kiln.DtypeMismatchError, match="uint16"):
        kiln.zeros(1, dtype=np.uint16)


@pytest.mark.parametrize("name", NAMES)
def test_python_values_round_trip(name, cpu1):
    values = VALUES[name]
    t = kiln.tensor(values, dtype=dt(name), device=cpu1)
    assert t.dtype is dt(name) and t.shape == (len(values),) and t.itemsize == SIZE[name]
    assert all_same(t.tolist(), values)
    for v in values:
        item = kiln.tensor([v], dtype=dt(name)).item()
        assert same(item, v), (name, v, item)
        assert type(item) is PY_TYPE.get(name, int)
    # Through astype and back: the wider type holds each value exactly.
    wide = "float64" if "float" in name else "int64" if name != "bool" else "bool"
    assert all_same(t.astype(dt(wide)).astype(dt(name)).tolist(), values)
    # Pickling keeps the dtype (bfloat16 travels as float32).
    back = pickle.loads(pickle.dumps(t))
    assert back.dtype is dt(name) and all_same(back.tolist(), values)
    assert f"dtype={name}" in repr(t) or name == "float32"


def test_python_data_default_dtypes():
    assert kiln.tensor([True, False]).dtype is kiln.bool
    assert kiln.tensor(True).dtype is kiln.bool and kiln.tensor(True).item() is True
    assert kiln.tensor([1, 2]).dtype is kiln.int32
    assert kiln.tensor([1, 2.5]).dtype is kiln.float32
    assert kiln.tensor([True, 2]).dtype is kiln.int32
    # An integer beyond 2^53 is kept exactly in int64.
    assert kiln.tensor([2**62 + 1], dtype=kiln.int64).tolist() == [2**62 + 1]
    with pytest.raises(OverflowError, match=r"kiln.tensor: 300 does not fit in int8 \(-128 to 127\)"):
        kiln.tensor([300], dtype=kiln.int8)
    with pytest.raises(OverflowError, match=r"-1 does not fit in uint8 \(0 to 255\)"):
        kiln.tensor([-1], dtype=kiln.uint8)
    with pytest.raises(OverflowError, match="does not fit in int64"):
        kiln.tensor([2**63], dtype=kiln.int64)
    # Creation values too: no silent saturation or overflow to inf.
    assert kiln.full(2, -128, dtype=kiln.int8).tolist() == [-128, -128]
    assert kiln.full(1, 65504, dtype=kiln.float16).item() == 65504.0
    with pytest.raises(OverflowError, match=r"full: fill_value 300 does not fit in int8 \(-128 to 127\)"):
        kiln.full(2, 300, dtype=kiln.int8)
    with pytest.raises(OverflowError, match=r"fill_value 65520 does not fit in float16 \(its largest magnitude is 65504\)"):
        kiln.full(2, 65520, dtype=kiln.float16)
    with pytest.raises(OverflowError, match="does not fit in bfloat16"):
        kiln.full(2, 1e39, dtype=kiln.bfloat16)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "bfloat16"])
def test_numpy_round_trip(name, cpu1):
    a = np.array(VALUES[name], dtype=name)
    # asarray keeps the dtype it is given, the bits too.
    t = kiln.asarray(a, device=cpu1)
    assert t.dtype is dt(name)
    for out in (t.numpy(), np.asarray(t)):
        assert out.dtype == a.dtype and out.tobytes() == a.tobytes()
    assert all_same(t.tolist(), a.tolist())
    # Non-contiguous and big-endian arrays keep it too.
    strided = np.repeat(a, 2)[::2]
    assert kiln.asarray(strided).dtype is dt(name)
    assert kiln.asarray(strided).numpy().tobytes() == a.tobytes()
    if SIZE[name] > 1:
        swapped = a.astype(a.dtype.newbyteorder(">"))
        assert kiln.asarray(swapped).dtype is dt(name)
        assert kiln.asarray(swapped).numpy().tobytes() == a.tobytes()
    # A NumPy scalar keeps its dtype.
    assert kiln.asarray(a[0]).dtype is dt(name)
    # DLPack both ways without a copy (NumPy < 1.25 exchanges no bool).
    if name == "bool" and not numpy_exports_bool():
        with pytest.raises((BufferError, TypeError, RuntimeError)):
            kiln.from_dlpack(a)
        return
    view = kiln.from_dlpack(a)
    assert view.dtype is dt(name) and view.numpy().tobytes() == a.tobytes()
    a[0] = a[2]
    assert same(view.tolist()[0], a.tolist()[2]), "from_dlpack views the array's memory"
    back = np.from_dlpack(t)
    assert back.dtype == a.dtype and back.tobytes() == t.numpy().tobytes()


def test_numpy_asked_for_another_dtype():
    a = np.array([1.7, -1.7, 300.0])
    assert kiln.asarray(a, dtype=kiln.float32).dtype is kiln.float32
    assert kiln.asarray(a, dtype=kiln.int16).tolist() == [1, -1, 300]
    assert kiln.asarray(np.array([0.0, -0.0, np.nan, 0.5]), dtype=kiln.bool).tolist() == [False, False, True, True]
    with pytest.raises(OverflowError, match=r"element 2 \(300\) does not fit in int8 \(-128 to 127\)"):
        kiln.asarray(a, dtype=kiln.int8)
    with pytest.raises(OverflowError, match=r"element 1 \(4294967296\) does not fit in int32"):
        kiln.asarray(np.array([1, 2**32], dtype=np.int64), dtype=kiln.int32)
    # Types kiln lacks: refused unless dtype= names the conversion.
    with pytest.raises(TypeError, match=r"a uint16 array has no kiln dtype .* pass dtype="):
        kiln.asarray(np.arange(3, dtype=np.uint16))
    assert kiln.asarray(np.arange(3, dtype=np.uint16), dtype=kiln.int32).tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match="complex128"):
        kiln.asarray(np.ones(2, np.complex128))
    # Out of a NumPy array into bfloat16: kiln's rounding (to nearest even).
    halfway = 1.0 + 2.0**-8  # between 1 and the next bfloat16, 1 + 2^-7
    assert kiln.asarray(np.array([halfway, 1.0 + 3 * 2.0**-8]), dtype=kiln.bfloat16).tolist() == [1.0, 1.0 + 2.0**-6]


def test_bfloat16_and_numpy():
    t = kiln.tensor([1.5, -2.25, 3.3895313892515355e38], dtype=kiln.bfloat16)
    with pytest.raises(TypeError, match=r"NumPy has no bfloat16: .*t.astype\(kiln.float32\).numpy\(\)"):
        t.numpy()
    with pytest.raises(TypeError, match="NumPy has no bfloat16"):
        np.asarray(t)
    expect = np.array([1.5, -2.25, 3.3895313892515355e38], np.float32)
    assert np.asarray(t, dtype=np.float32).tobytes() == expect.tobytes()
    assert t.astype(kiln.float32).numpy().tobytes() == expect.tobytes()
    assert np.asarray(t, dtype=np.float64).tolist() == expect.astype(np.float64).tolist()
    assert "dtype=bfloat16" in repr(t)


def test_astype_every_pair():
    for src in NAMES:
        t = kiln.tensor([0, 1], dtype=dt(src))
        for dst in NAMES:
            out = t.astype(dt(dst))
            assert out.dtype is dt(dst)
            expect = [False, True] if dst == "bool" else [0.0, 1.0] if "float" in dst else [0, 1]
            assert all_same(out.tolist(), expect), (src, dst, out.tolist())
    # The one rule (docs/dtypes.md): toward zero, saturating, NaN -> 0; modulo 2^bits between integers.
    f = kiln.tensor([-1.7, 2.9, 1e10, -1e10, math.nan], dtype=kiln.float64)
    assert f.astype(kiln.int32).tolist() == [-1, 2, 2**31 - 1, -(2**31), 0]
    assert kiln.tensor([300, -129], dtype=kiln.int64).astype(kiln.int8).tolist() == [44, 127]
    assert kiln.tensor([65520.0, 1.0 + 2.0**-11], dtype=kiln.float32).astype(kiln.float16).tolist() == [INF, 1.0]


def test_float_roundings_match_numpy_and_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(20)
    x = np.concatenate([rng.standard_normal(500) * 10.0 ** rng.integers(-8, 8, 500),
                        [0.0, -0.0, np.inf, -np.inf, 65504.0, 65520.0, 2.0**-25, 3 * 2.0**-26, 1e-40]])
    f16 = kiln.tensor(x, dtype=kiln.float64).astype(kiln.float16).numpy()
    with np.errstate(over="ignore"):
        assert f16.tobytes() == x.astype(np.float16).tobytes()
    bf16 = kiln.tensor(x.astype(np.float32)).astype(kiln.bfloat16)
    theirs = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
    assert torch.equal(torch.from_dlpack(bf16).view(torch.int16), theirs.view(torch.int16))


TORCH = ["bool", "int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


@pytest.mark.parametrize("name", TORCH)
def test_torch_round_trip(name, cpu1):
    torch = pytest.importorskip("torch")
    tdt = getattr(torch, name)
    x = torch.tensor(VALUES[name], dtype=tdt)
    # A copy (kiln.asarray), in the tensor's own dtype.
    t = kiln.asarray(x, device=cpu1)
    assert t.dtype is dt(name)
    assert all_same(t.tolist(), x.tolist())
    try:
        x.__dlpack__()
    except RuntimeError as e:  # PyTorch before 2.1 exchanges no bool
        assert name == "bool" and "Bool" in str(e)
        assert torch.equal(torch.from_numpy(t.numpy()), x)
        return
    # DLPack both ways, no copy: one memory.
    view = kiln.from_dlpack(x)
    assert view.dtype is dt(name)
    x[0] = x[2]
    assert same(view.tolist()[0], x.tolist()[2])
    back = torch.from_dlpack(t)
    assert back.dtype == tdt and all_same(back.tolist(), t.tolist())
    assert back.data_ptr() == torch.from_dlpack(t).data_ptr()
    again = torch.from_dlpack(view)
    assert again.data_ptr() == x.data_ptr() and torch.equal(again, x)


def test_gpu_devices_keep_storage_and_refuse_compute():
    """A device whose backend serves f32/i32 only stores the other dtypes and refuses their ops."""
    gpus = [d for d in kiln.devices() if d.backend != "cpu"]
    if not gpus:
        pytest.skip("no device of another backend than the CPU's")
    dev = gpus[0]
    values = np.array([1.0, -2.5, 65504.0])
    t = kiln.asarray(values, dtype=kiln.float16, device=dev)  # converted on the CPU, copied there
    assert t.dtype is kiln.float16 and t.device is dev
    assert t.tolist() == [1.0, -2.5, 65504.0]
    assert kiln.asarray(values, device=dev).dtype is kiln.float64
    # Converting there is an op: refused naming the dtype where the backend
    # does not serve f16 yet, exact where it does.
    try:
        wide = t.astype(kiln.float32)
    except kiln.UnsupportedError as e:
        assert "f16" in str(e), str(e)
    else:
        assert wide.tolist() == [1.0, -2.5, 65504.0]


def st_write(path, tensors):
    """A safetensors file as the format says (8-byte header length, JSON, data), from PyTorch tensors' bytes."""
    torch = pytest.importorskip("torch")
    names = {torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32",
             torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32",
             torch.float64: "F64"}
    header, blobs, at = {}, [], 0
    for key, x in tensors.items():
        x = x.contiguous()
        raw = (x.view(torch.int16) if x.dtype == torch.bfloat16 else x).numpy().tobytes()
        header[key] = {"dtype": names[x.dtype], "shape": list(x.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def st_read(path):
    """{name: torch tensor} of a safetensors file, read by the spec."""
    torch = pytest.importorskip("torch")
    dtypes = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
              "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32,
              "F64": torch.float64}
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        dtype = dtypes[info["dtype"]]
        flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.zeros(0, dtype=dtype)
        out[key] = flat.reshape(info["shape"])
    return out


def test_safetensors_every_dtype_with_torch(tmp_path, cpu1):
    torch = pytest.importorskip("torch")
    if not kiln.HAS_NN:
        pytest.skip("kiln built without libkiln-nn")
    from kiln import nn
    tensors = {name: torch.tensor(VALUES[name], dtype=getattr(torch, name)) for name in TORCH}
    tensors["bf16_matrix"] = torch.arange(6, dtype=torch.float32).reshape(2, 3).to(torch.bfloat16) / 3
    path = str(tmp_path / "torch.safetensors")
    st_write(path, tensors)
    # PyTorch's bf16 checkpoint loads into bf16 tensors, bits as saved.
    loaded = nn.load_safetensors(path, cpu1)
    assert list(loaded) == list(tensors)
    for key, x in tensors.items():
        assert loaded[key].dtype is dt(str(x.dtype).replace("torch.", "")), key
        assert loaded[key].shape == tuple(x.shape)
        assert all_same(loaded[key].tolist(), x.tolist()), key
    # kiln writes them back; the spec's reader sees the same tensors, dtypes included.
    again = str(tmp_path / "kiln.safetensors")
    nn.save_safetensors(again, loaded)
    back = st_read(again)
    for key, x in tensors.items():
        assert back[key].dtype == x.dtype and torch.equal(back[key], x), key
    # A model's parameters are float32 and nothing converts on loading: a bf16
    # checkpoint is refused, naming the tensor, its dtype and what to do.
    model = nn.Sequential(nn.Linear(3, 2, seed=1))
    state = {"0.weight": torch.zeros(2, 3, dtype=torch.bfloat16), "0.bias": torch.zeros(2, dtype=torch.bfloat16)}
    bf16_ckpt = str(tmp_path / "bf16_model.safetensors")
    st_write(bf16_ckpt, state)
    with pytest.raises(kiln.DtypeMismatchError,
                       match=r'tensor "0.(weight|bias)": the file holds BF16 \[.*\], the tensor to load into is f32 .*'
                             r"save the checkpoint as F32 \(in PyTorch: \{k: v.to\(torch.float32\)"):
        model.load(bf16_ckpt)
    st_write(bf16_ckpt, {k: v.to(torch.float32) for k, v in state.items()})
    model.load(bf16_ckpt)
    assert model.state_dict()["0.weight"].tolist() == [[0.0] * 3] * 2
