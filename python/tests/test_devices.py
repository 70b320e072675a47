# python/tests/test_devices.py: device discovery and selection from Python: devices(), device(), try_gpu, try_all_gpus, backends, properties.
import pickle

import pytest

import kiln


def test_devices_lists_the_cpu_devices():
    devices = kiln.devices()
    assert devices, "kiln always has the CPU"
    selectors = [d.selector for d in devices]
    assert "cpu:0" in selectors and "cpu:1" in selectors
    assert [d.index for d in devices] == list(range(len(devices)))
    # GPUs come before the CPU.
    types = [d.type for d in devices]
    assert types == sorted(types, key=lambda t: t != "gpu")


def test_device_objects_are_unique():
    assert kiln.device("cpu:0") is kiln.device("cpu:0")
    assert kiln.device("cpu:0") is kiln.devices()[[d.selector for d in kiln.devices()].index("cpu:0")]
    assert kiln.device(0) is kiln.devices()[0]
    assert kiln.device() is kiln.default_device()
    assert kiln.device(kiln.device("cpu:1")) is kiln.device("cpu:1")


def test_device_compares_with_its_selector():
    d = kiln.device("cpu:1")
    assert d == "cpu:1" and d != "cpu:0"
    assert str(d) == "cpu:1" and repr(d) == "device('cpu:1')"
    assert {d: 1}["cpu:1"] == 1
    assert d.backend == "cpu" and d.type == "cpu" and d.name


def test_try_gpu_falls_back_to_the_cpu():
    gpus = [d for d in kiln.devices() if d.type == "gpu"]
    assert kiln.num_gpus() == len(gpus)
    assert kiln.try_gpu(len(gpus) + 10).type == "cpu"
    if gpus:
        assert kiln.try_gpu() is gpus[0]
        assert kiln.try_all_gpus() == gpus
    else:
        assert kiln.try_gpu() is kiln.device("cpu")
        assert kiln.try_all_gpus() == [kiln.device("cpu")]
    with pytest.raises(ValueError):
        kiln.try_gpu(-1)


def test_info_and_properties():
    d = kiln.device("cpu:0")
    info = d.info()
    assert info["selector"] == "cpu:0" and info["backend"] == "cpu"
    assert info["memory_bytes"] > 0 and info["compute_units"] > 0
    assert "native" == d.providers("matmul")[0]
    stats = d.memory_stats()
    assert set(stats) == {"in_use_bytes", "pooled_bytes", "peak_bytes", "allocations"}
    assert d.dlpack == (1, 0)
    d.synchronize()
    kiln.synchronize()
    kiln.synchronize("cpu:1")


def test_backends_report_their_state():
    backends = {b["name"]: b for b in kiln.backends()}
    assert backends["cpu"]["state"] == "loaded"
    for b in backends.values():
        assert b["state"] in ("loaded", "no device", "unavailable", "abi mismatch")
        if b["state"] != "loaded":
            assert b["reason"]


def test_bad_selectors_raise_kiln_errors():
    with pytest.raises(kiln.InvalidArgumentError) as e:
        kiln.device("cpu:zero:1")
    assert "cpu:zero:1" in str(e.value)
    assert isinstance(e.value, ValueError) and isinstance(e.value, kiln.Error)
    with pytest.raises(kiln.NotFoundError) as e:
        kiln.device("cpu:7")
    assert isinstance(e.value, LookupError) and e.value.status_name == "NOT_FOUND"
    with pytest.raises(kiln.NotFoundError):
        kiln.device(99)
    with pytest.raises(TypeError):
        kiln.device(1.5)


def test_device_pickles_by_selector():
    assert pickle.loads(pickle.dumps(kiln.device("cpu:1"))) is kiln.device("cpu:1")


def test_policy_and_providers():
    assert kiln.policy() in ("vendor", "portable", "fastest")
    before = kiln.policy()
    kiln.set_policy("portable")
    try:
        a = kiln.ones((8, 8))
        (a @ a).numpy()
        assert kiln.last_provider() == "native"
    finally:
        kiln.set_policy(before)
    with pytest.raises(kiln.InvalidArgumentError):
        kiln.set_policy("quickest")
    with pytest.raises(kiln.InvalidArgumentError):
        kiln.set_providers("matmul=nonsense")
    kiln.set_providers("")
    assert "matmul" in kiln.op_names()


def test_initialize_after_start_is_refused():
    kiln.devices()
    with pytest.raises(kiln.InvalidArgumentError):
        kiln.initialize(policy="portable")
