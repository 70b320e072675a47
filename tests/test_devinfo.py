#!/usr/bin/env python3
"""tests/test_devinfo.py: devinfo's formats and exit codes: table, --json (parsed), -v, --check, --help, bad variables."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

TIMEOUT = 300

failures = []


def fail(message):
    failures.append(message)
    print("FAIL: " + message)


def expect(condition, message):
    if not condition:
        fail(message)
    return condition


class Devinfo:
    def __init__(self, exe, cache_dir):
        self.exe = exe
        self.env = dict(os.environ)
        # The selection variables are the test's to set; the backend list and
        # plugin path stay as the harness gave them.
        for name in ("KILN_DEVICE", "KILN_POLICY", "KILN_PROVIDER", "KILN_CPU_DEVICES", "KILN_LOG"):
            self.env.pop(name, None)
        self.env["KILN_CACHE_DIR"] = cache_dir

    def run(self, *args, **extra_env):
        env = dict(self.env)
        env.update(extra_env)
        proc = subprocess.run([self.exe, *args], env=env, capture_output=True, text=True,
                              timeout=TIMEOUT, errors="replace")
        return proc

    def json(self, **extra_env):
        proc = self.run("--json", **extra_env)
        where = "devinfo --json" + "".join(f" [{k}={v}]" for k, v in extra_env.items())
        if not expect(proc.returncode == 0, f"{where} exited {proc.returncode}; stderr: {proc.stderr}"):
            return None
        try:
            return json.loads(proc.stdout)
        except json.JSONDecodeError as err:
            fail(f"{where} printed JSON that does not parse ({err}):\n{proc.stdout}")
            return None


BACKEND_KEYS = {"name": str, "status": str, "reason": str, "path": str, "version": str, "device_count": int}
DEVICE_KEYS = {
    "index": int, "selector": str, "backend": str, "type": str, "name": str, "vendor": str,
    "memory_bytes": int, "memory_free_bytes": int, "memory_free_is_estimate": bool,
    "compute_units": int, "uuid": str, "pci_bus_id": str, "driver_version": str,
    "compute_capability": str, "is_default": bool, "properties": dict, "providers": dict,
}


def check_types(obj, keys, where):
    for key, kind in keys.items():
        if not expect(key in obj, f"{where} lacks key '{key}': {obj}"):
            continue
        value = obj[key]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        expect(ok, f"{where}['{key}'] is {value!r}, expected {kind.__name__}")


def test_table(d):
    proc = d.run()
    expect(proc.returncode == 0, f"devinfo exited {proc.returncode}; stderr: {proc.stderr}")
    expect(proc.stdout.strip() != "", "devinfo printed nothing")
    expect("Backends:" in proc.stdout, f"devinfo lacks the backend lines:\n{proc.stdout}")
    expect(any(line.startswith("*") for line in proc.stdout.splitlines()),
           f"devinfo marks no default device with '*':\n{proc.stdout}")
    expect("cpu" in proc.stdout, f"devinfo does not mention the cpu backend:\n{proc.stdout}")


def test_json(d):
    doc = d.json()
    if doc is None:
        return None
    if not expect(isinstance(doc, dict), f"--json top level is {type(doc).__name__}, expected an object"):
        return None
    for key in ("version", "default", "backends", "devices"):
        expect(key in doc, f"--json lacks '{key}'")
    expect(isinstance(doc.get("version"), str) and doc.get("version"), "--json 'version' is not a non-empty string")
    backends = doc.get("backends", [])
    devices = doc.get("devices", [])
    expect(isinstance(backends, list) and backends, "--json 'backends' is not a non-empty list")
    expect(isinstance(devices, list) and devices, "--json 'devices' is empty on a machine with a CPU")
    for i, b in enumerate(backends):
        check_types(b, BACKEND_KEYS, f"backends[{i}]")
    names = [b.get("name") for b in backends]
    expect("cpu" in names, f"--json backends lack cpu: {names}")
    for i, dev in enumerate(devices):
        check_types(dev, DEVICE_KEYS, f"devices[{i}]")
        expect(dev.get("index") == i, f"devices[{i}]['index'] is {dev.get('index')}")
        for op in ("matmul", "conv2d", "max_pool2d", "softmax", "add"):
            providers = dev.get("providers", {}).get(op)
            expect(isinstance(providers, str) and providers.split(",")[0] == "native",
                   f"devices[{i}] providers for {op} are {providers!r}; 'native' must come first")
    default = doc.get("default")
    defaults = [i for i, dev in enumerate(devices) if dev.get("is_default")]
    expect(isinstance(default, int) and not isinstance(default, bool),
           f"--json 'default' is {default!r}, expected a device index")
    if isinstance(default, int) and 0 <= default < len(devices):
        expect(devices[default].get("is_default") is True, f"devices[{default}] is 'default' but not is_default")
    expect(defaults == [default], f"devices marked is_default: {defaults}; 'default' is {default!r}")
    selectors = [dev.get("selector") for dev in devices]
    expect(len(set(selectors)) == len(selectors), f"selectors are not unique: {selectors}")
    return doc


def test_selectors(d, doc):
    for dev in doc.get("devices", []):
        selector = dev.get("selector")
        picked = d.json(KILN_DEVICE=selector)
        if picked is None:
            continue
        listed = picked.get("devices", [])
        if not expect(len(listed) == 1, f"KILN_DEVICE='{selector}' lists {len(listed)} devices: "
                      f"{[x.get('selector') for x in listed]}"):
            continue
        got = listed[0]
        expect(got.get("selector") == selector and got.get("name") == dev.get("name"),
               f"KILN_DEVICE='{selector}' lists {got.get('selector')} ({got.get('name')}), "
               f"expected {selector} ({dev.get('name')})")
        expect(picked.get("default") == 0 and got.get("is_default") is True,
               f"KILN_DEVICE='{selector}': the one device listed is not the default")


def test_cpu_devices(d):
    doc = d.json(KILN_CPU_DEVICES="2")
    if doc is None:
        return
    cpus = [dev.get("selector") for dev in doc.get("devices", []) if dev.get("backend") == "cpu"]
    expect(cpus == ["cpu:0", "cpu:1"], f"KILN_CPU_DEVICES=2 lists cpu devices {cpus}, expected cpu:0 and cpu:1")


def test_verbose(d, doc):
    proc = d.run("-v")
    expect(proc.returncode == 0, f"devinfo -v exited {proc.returncode}; stderr: {proc.stderr}")
    out = proc.stdout
    count = len(doc.get("devices", [])) if doc else 1
    headers = [line for line in out.splitlines() if line.startswith("device ")]
    expect(len(headers) == count, f"devinfo -v has {len(headers)} device headers, expected {count}")
    for key in ("selector:", "backend:", "memory:", "memory_free:", "compute_units:", "compute_capability:",
                "fp16:", "fp64:", "providers.matmul:", "providers.add:"):
        expect(out.count("  " + key) == count, f"devinfo -v shows '{key}' {out.count('  ' + key)} times, "
               f"expected {count}:\n{out}")
    if doc:
        for dev in doc.get("devices", []):
            if dev.get("memory_free_is_estimate"):
                expect("(estimate)" in out, f"{dev.get('selector')} has an estimated free memory that -v "
                       "does not mark '(estimate)'")


def test_check(d, doc):
    proc = d.run("--check")
    expect(proc.returncode == 0, f"devinfo --check exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    count = len(doc.get("devices", [])) if doc else 1
    passes = sum(1 for line in proc.stdout.splitlines() if line.rstrip().endswith("PASS"))
    expect(passes == count, f"devinfo --check passed {passes} devices of {count}:\n{proc.stdout}")
    expect("FAIL" not in proc.stdout, f"devinfo --check reports a failure:\n{proc.stdout}")


def test_help(d):
    proc = d.run("--help")
    expect(proc.returncode == 0, f"devinfo --help exited {proc.returncode}")
    for word in ("usage", "--json", "--check", "-v", "KILN_DEVICE"):
        expect(word in proc.stdout, f"devinfo --help does not mention '{word}'")
    proc = d.run("--no-such-option")
    expect(proc.returncode == 2, f"devinfo --no-such-option exited {proc.returncode}, expected 2")
    expect("--no-such-option" in proc.stderr, f"devinfo does not name the unknown option: {proc.stderr}")


def test_bad_variables(d):
    for name, value in (("KILN_DEVICE", "cpu:x!y"), ("KILN_POLICY", "quickest")):
        for args in ((), ("--json",)):
            proc = d.run(*args, **{name: value})
            where = f"{name}='{value}' devinfo {' '.join(args)}".rstrip()
            expect(proc.returncode == 2, f"{where} exited {proc.returncode}, expected 2; "
                   f"stdout: {proc.stdout} stderr: {proc.stderr}")
            quoted = any(f"{q}{value}{r}" in proc.stderr for q, r in (("'", "'"), ('"', '"'), ("`", "`")))
            expect(quoted, f"{where}: stderr does not quote the bad value: {proc.stderr!r}")


def test_cuda_without_driver(d, doc):
    if not doc:
        return
    if any(dev.get("backend") == "cuda" for dev in doc.get("devices", [])):
        print("note: a CUDA device is present; the driver-less listing is not checked here")
        return
    cuda = [b for b in doc.get("backends", []) if b.get("name") == "cuda"]
    backend_env = os.environ.get("KILN_BACKEND", "")
    if backend_env and "cuda" not in backend_env.split(","):
        print(f"note: KILN_BACKEND='{backend_env}' leaves cuda out; its listing is not checked here")
        return
    if not expect(len(cuda) == 1, f"--json lists {len(cuda)} cuda backends, expected 1 (unavailable)"):
        return
    expect(cuda[0].get("status") in ("unavailable", "no device"),
           f"cuda backend without a GPU has status {cuda[0].get('status')!r}")
    expect(bool(cuda[0].get("reason")), f"cuda backend is {cuda[0].get('status')} without a reason")
    proc = d.run()
    lines = [line for line in proc.stdout.splitlines() if line.strip().startswith("cuda ")]
    expect(lines and ("unavailable" in lines[0] or "no device" in lines[0]),
           f"the table does not say why cuda is unavailable:\n{proc.stdout}")


def main():
    if len(sys.argv) != 2:
        print("usage: test_devinfo.py PATH_TO_DEVINFO")
        return 2
    if not os.access(sys.argv[1], os.X_OK):
        print(f"FAIL: devinfo is not an executable at {sys.argv[1]}; build it first")
        return 1
    cache_dir = tempfile.mkdtemp(prefix="kiln-test-devinfo-")
    try:
        d = Devinfo(sys.argv[1], cache_dir)
        test_table(d)
        doc = test_json(d)
        if doc:
            test_selectors(d, doc)
        test_cpu_devices(d)
        test_verbose(d, doc)
        test_check(d, doc)
        test_help(d)
        test_bad_variables(d)
        test_cuda_without_driver(d, doc)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    if failures:
        print(f"{len(failures)} devinfo check(s) failed")
        return 1
    print("devinfo: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
