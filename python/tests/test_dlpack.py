# python/tests/test_dlpack.py: DLPack both ways with NumPy and PyTorch: shared memory (a write through one side is read through the other), both protocol versions, capsule rules, devices.
import ctypes
import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kiln
from conftest import host


def data_pointer(array):
    return array.__array_interface__["data"][0]


def test_numpy_to_kiln_shares_memory_both_ways():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = kiln.from_dlpack(a)
    assert t.shape == (3, 4) and t.dtype == kiln.float32 and t.device == "cpu:0"
    a[1, 2] = 100.0  # write through NumPy ...
    assert host(t)[1, 2] == 100.0  # ... read through kiln
    t.add_(kiln.ones((3, 4)))  # write through kiln (in place, enqueued) ...
    t.device.synchronize()
    assert a[0, 0] == 1.0 and a[1, 2] == 101.0  # ... read through NumPy


def test_kiln_to_numpy_shares_memory():
    t = kiln.zeros((2, 5))
    a = np.from_dlpack(t)
    assert a.shape == (2, 5) and a.dtype == np.float32
    t.add_(kiln.full((2, 5), 3.0))
    t.device.synchronize()
    assert (a == 3.0).all(), "NumPy reads what kiln wrote: no copy was made"


def test_round_trip_numpy_kiln_numpy_copies_nothing():
    a = np.arange(6, dtype=np.float32)
    b = np.from_dlpack(kiln.from_dlpack(a))
    assert data_pointer(b) == data_pointer(a)
    a[3] = -1.0
    assert b[3] == -1.0


def test_views_keep_their_strides():
    t = kiln.arange(12, dtype=kiln.float32).reshape(3, 4).T
    a = np.from_dlpack(t)
    np.testing.assert_array_equal(a, np.arange(12, dtype=np.float32).reshape(3, 4).T)
    assert a.strides == (4, 16)
    back = kiln.from_dlpack(np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2])
    assert back.shape == (3, 2) and back.strides == (4, 2)
    assert back.tolist() == [[0.0, 2.0], [4.0, 6.0], [8.0, 10.0]]


def test_int32_empty_and_scalars():
    assert kiln.from_dlpack(np.arange(3, dtype=np.int32)).tolist() == [0, 1, 2]
    assert kiln.from_dlpack(np.zeros((0, 3), np.float32)).shape == (0, 3)
    assert kiln.from_dlpack(np.array(2.5, np.float32)).item() == 2.5
    assert np.from_dlpack(kiln.arange(4)).tolist() == [0, 1, 2, 3]
    # Types kiln lacks are named in words, not DLPack codes.
    with pytest.raises(kiln.DtypeMismatchError, match="holds complex64, which kiln does not have"):
        kiln.from_dlpack(np.ones(3, np.complex64))
    with pytest.raises(kiln.DtypeMismatchError, match="holds uint16, which kiln does not have"):
        kiln.from_dlpack(np.ones(3, np.uint16))


def test_the_producer_is_released_when_kiln_is_done():
    a = np.ones(16, np.float32)
    before = sys.getrefcount(a)
    t = kiln.from_dlpack(a)
    assert sys.getrefcount(a) == before + 1, "kiln's import holds the array through NumPy's DLPack tensor"
    del t
    gc.collect()
    assert sys.getrefcount(a) == before


def test_torch_shares_memory_both_ways():
    torch = pytest.importorskip("torch")
    x = torch.arange(6, dtype=torch.float32)
    t = kiln.from_dlpack(x)
    x[0] = 42.0  # PyTorch writes, kiln reads
    assert t.tolist()[0] == 42.0
    t.add_(kiln.ones(6))  # kiln writes, PyTorch reads
    t.device.synchronize()
    assert x.tolist() == [43.0, 2.0, 3.0, 4.0, 5.0, 6.0]

    k = kiln.zeros((2, 3))
    y = torch.from_dlpack(k)
    assert y.shape == (2, 3) and y.dtype == torch.float32 and y.device.type == "cpu"
    y += 7.0  # PyTorch writes into kiln's memory
    assert k.tolist() == [[7.0] * 3] * 2
    assert y.data_ptr() == torch.from_dlpack(k).data_ptr()
    # The legacy capsule form, as torch.utils.dlpack writes it.
    z = torch.ones(4)
    c = kiln.from_dlpack(torch.utils.dlpack.to_dlpack(z))
    z[1] = 9.0
    assert c.tolist() == [1.0, 9.0, 1.0, 1.0]


def test_capsule_names_follow_the_protocol():
    t = kiln.ones(3)
    legacy = t.__dlpack__()
    versioned = t.__dlpack__(max_version=(1, 0))
    old = t.__dlpack__(max_version=(0, 8))

    def name(capsule):
        get = ctypes.pythonapi.PyCapsule_GetName
        get.restype, get.argtypes = ctypes.c_char_p, [ctypes.py_object]
        return get(capsule).decode()

    assert name(legacy) == "dltensor" and name(old) == "dltensor"
    assert name(versioned) == "dltensor_versioned"
    assert t.__dlpack_device__() == (1, 0)
    u = kiln.from_dlpack(versioned)
    assert name(versioned) == "used_dltensor_versioned" and u.tolist() == [1.0, 1.0, 1.0]
    kiln.from_dlpack(legacy)
    assert name(legacy) == "used_dltensor"
    with pytest.raises(ValueError):
        kiln.from_dlpack(legacy)
    del old  # never consumed: its destructor gives the tensor back


class VersionedOnly:
    """A producer that speaks DLPack 1.x only (as NumPy 2 and PyTorch 2 prefer)."""

    def __init__(self, t):
        self.t = t
        self.asked = []

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.asked.append(max_version)
        if max_version is None or max_version[0] < 1:
            raise BufferError("this producer needs max_version >= (1, 0)")
        return self.t.__dlpack__(max_version=max_version)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


class LegacyOnly:
    """A producer whose __dlpack__ has no max_version (NumPy 1.x, PyTorch 1.x)."""

    def __init__(self, t):
        self.t = t
        self.calls = 0

    def __dlpack__(self, stream=None):
        self.calls += 1
        return self.t.__dlpack__()


def test_consumer_asks_for_the_versioned_form_and_falls_back():
    src = kiln.arange(4, dtype=kiln.float32)
    v = VersionedOnly(src)
    assert kiln.from_dlpack(v).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert v.asked == [(1, 0)]
    legacy = LegacyOnly(src)
    assert kiln.from_dlpack(legacy).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert kiln.from_dlpack(legacy).tolist() == [0.0, 1.0, 2.0, 3.0]
    # The try with max_version fails before the body runs; then the legacy form is remembered for the type.
    assert legacy.calls == 2


def test_copy_and_device_options(cpu1):
    a = np.ones(3, np.float32)
    c = kiln.from_dlpack(a, copy=True)
    a[0] = 5.0
    assert c.tolist() == [1.0, 1.0, 1.0]
    d = kiln.from_dlpack(a, device=cpu1)
    assert d.device is cpu1 and d.tolist() == [5.0, 1.0, 1.0]
    with pytest.raises(BufferError):
        kiln.from_dlpack(a, device=cpu1, copy=False)
    t = kiln.ones(2)
    copied = t.__dlpack__(max_version=(1, 0), copy=True)
    assert kiln.from_dlpack(copied).tolist() == [1.0, 1.0]
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0), copy=False)
    with pytest.raises(TypeError):
        kiln.from_dlpack([1, 2, 3])


def test_kiln_tensor_from_kiln_shares(cpu1):
    t = kiln.zeros(2, device=cpu1)
    u = kiln.from_dlpack(t)
    assert u is not t and u.device is cpu1
    t.add_(kiln.ones(2, device=cpu1))
    assert u.tolist() == [1.0, 1.0]


def test_opencl_tensors_name_their_device():
    cl = [d for d in kiln.devices() if d.backend == "opencl" and "oclgrind" not in d.name.lower()]
    if not cl:
        pytest.skip("no OpenCL device")
    t = kiln.ones(4, device=cl[0])
    assert t.__dlpack_device__()[0] == 4  # kDLOpenCL
    u = kiln.from_dlpack(t.__dlpack__())
    assert u.device is cl[0] and u.tolist() == [1.0] * 4


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_exchanges_leak_nothing():
    torch = pytest.importorskip("torch")
    x = np.ones(64, np.float32)
    k = kiln.ones(64)
    tt = torch.ones(64)
    refs = sys.getrefcount(x)

    def rounds(n):
        for _ in range(n):
            np.from_dlpack(kiln.from_dlpack(x))
            torch.from_dlpack(k)
            kiln.from_dlpack(tt)
            kiln.from_dlpack(k.__dlpack__(max_version=(1, 0)))
            k.__dlpack__()  # never consumed

    rounds(2000)
    before = rss_bytes()
    rounds(20000)
    gc.collect()
    grown = rss_bytes() - before
    assert sys.getrefcount(x) == refs
    assert grown < 4 * 1024 * 1024, f"resident memory grew by {grown} bytes over 20000 rounds"


def test_a_consumer_that_fails_does_not_free_twice():
    # PyTorch refuses an OpenCL tensor after it ran the capsule's deleter,
    # and leaves the capsule's name as it was; its destructor must not hand
    # the tensor back a second time (the process used to abort on a double
    # free). Run in a child so that a fault fails this test only.
    cl = [d for d in kiln.devices() if d.backend == "opencl" and "oclgrind" not in d.name.lower()]
    if not cl:
        pytest.skip("no OpenCL device")
    pytest.importorskip("torch")
    code = textwrap.dedent(f"""
        import gc, kiln, torch
        t = kiln.arange(6, dtype=kiln.float32, device={cl[0].selector!r})
        for i in range(20):
            try:
                torch.from_dlpack(t)
            except RuntimeError:
                pass
            capsule = t.__dlpack__(max_version=(1, 0) if i % 2 else None)
            try:
                torch.utils.dlpack.from_dlpack(capsule)
            except RuntimeError:
                pass
            del capsule
            gc.collect()
        print(t.tolist())
    """)
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                           env=dict(os.environ, MALLOC_CHECK_="3", MALLOC_PERTURB_="165"))
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip() == "[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]"


def test_a_capsule_hands_its_tensor_back_once():
    # The protocol's paths, each must end with the tensor released once:
    # nobody takes the capsule; a consumer renames it and frees later; a
    # consumer frees it before the capsule goes.
    t = kiln.ones(4)
    for versioned in (False, True):
        kw = {"max_version": (1, 0)} if versioned else {}
        t.__dlpack__(**kw)  # never consumed: the destructor releases it
        a = np.from_dlpack(t)   # consumed: NumPy releases it with the array
        del a
        c = t.__dlpack__(**kw)
        k = kiln.from_dlpack(c)  # kiln consumes, renames; the capsule outlives nothing
        assert "used_" in repr(c)
        del c, k
    assert t.tolist() == [1.0] * 4


def test_a_deleter_called_without_renaming_is_not_called_again():
    # What PyTorch does on a failed import, without PyTorch: the consumer
    # calls the managed tensor's deleter (twice, even) and leaves the capsule
    # named "dltensor"; dropping the capsule must not call it once more.
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import ctypes, gc, kiln
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        deleter_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
        t = kiln.arange(4, dtype=kiln.float32)
        for name, kw, offset in ((b"dltensor", {}, 56), (b"dltensor_versioned", {"max_version": (1, 0)}, 16)):
            for _ in range(50):
                capsule = t.__dlpack__(**kw)
                managed = get(capsule, name)
                # The deleter follows dl_tensor (48 bytes) and manager_ctx in
                # the legacy form; version (8) and manager_ctx in the versioned one.
                deleter = deleter_type(ctypes.c_void_p.from_address(managed + offset).value)
                deleter(managed)
                deleter(managed)
                del capsule
                gc.collect()
        print(t.tolist())
    """)], capture_output=True, text=True, timeout=240,
        env=dict(os.environ, MALLOC_CHECK_="3", MALLOC_PERTURB_="165"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[0.0, 1.0, 2.0, 3.0]"
