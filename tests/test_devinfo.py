#!/usr/bin/env python3
"""tests/test_devinfo.py: devinfo's formats and exit codes: table, --json (parsed), -v, --check, --help, --version, bad variables."""
import json
import os
import re
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


BACKEND_KEYS = {"name": str, "status": str, "version": str, "device_count": int, "visible_device_count": int,
                "providers": list, "reason": str, "path": str, "builtin": bool}
DEVICE_KEYS = {
    "index": int, "selector": str, "backend": str, "type": str, "name": str, "vendor": str,
    "memory_bytes": int, "memory_free_bytes": int, "memory_free_is_estimate": bool,
    "compute_units": int, "uuid": str, "pci_bus_id": str, "driver_version": str,
    "compute_capability": str, "is_default": bool, "properties": dict, "providers": dict, "dtypes": dict,
}

# Every dtype, in kiln_dtype_t order, and how the CPU backend serves each.
DTYPES = ["f32", "i32", "f16", "bf16", "f64", "i64", "i8", "u8", "i16", "bool"]
CPU_DTYPES = {"f32": "native", "i32": "native", "f16": "emulated", "bf16": "emulated", "f64": "native",
              "i64": "native", "i8": "native", "u8": "native", "i16": "native", "bool": "native"}


def check_types(obj, keys, where):
    for key, kind in keys.items():
        if not expect(key in obj, f"{where} lacks key '{key}': {obj}"):
            continue
        value = obj[key]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        expect(ok, f"{where}['{key}'] is {value!r}, expected {kind.__name__}")


def test_table(d, doc):
    proc = d.run()
    out = proc.stdout
    expect(proc.returncode == 0, f"devinfo exited {proc.returncode}; stderr: {proc.stderr}")
    expect(out.strip() != "", "devinfo printed nothing")
    expect("Backends:" in out, f"devinfo lacks the backend lines:\n{out}")
    expect(any(line.startswith("*") for line in out.splitlines()),
           f"devinfo marks no default device with '*':\n{out}")
    expect("cpu" in out, f"devinfo does not mention the cpu backend:\n{out}")
    # Each column is explained; IDENTITY only when a device has one.
    expect("\nCU: compute units" in out, f"the table does not say what CU is:\n{out}")
    devices = doc.get("devices", []) if doc else []
    has_identity = any(dev.get("uuid") or dev.get("pci_bus_id") for dev in devices)
    expect(("IDENTITY" in out) == has_identity,
           f"IDENTITY {'missing' if has_identity else 'shown'} while {'some' if has_identity else 'no'} device has "
           f"one:\n{out}")
    # Rows that are one processor say that they share its memory and cores.
    cpus = [dev["selector"] for dev in devices if dev.get("type") == "cpu"]
    if len(cpus) >= 2:
        expect(any(all(c in line for c in cpus) and "share its memory and cores" in line for line in out.splitlines()),
               f"{cpus} are one processor, and the table does not say so:\n{out}")
    # Backend lines: labelled, one thing each; no "path tried" for a plugin
    # that was found, and no device count posing as a version.
    backends = out.split("Backends:", 1)[-1]
    expect("path tried" not in backends, f"a backend line says 'path tried':\n{backends}")
    for line in backends.splitlines():
        m = re.match(r"\s+version: (.*)", line)
        if m:
            expect(not re.search(r"\b\d+ (devices?|platforms?)\b", m.group(1)),
                   f"a version line holds a count: {line!r}")
    blocks = {}
    name = None
    for line in backends.splitlines():
        if re.match(r"  \S", line):
            name = line.split()[0]
            blocks[name] = [line]
        elif name and line.startswith("   "):
            blocks[name].append(line.strip())
    for b in (doc.get("backends", []) if doc else []):
        if b.get("status") == "loaded":
            block = blocks.get(b["name"], [])
            expect(any(x.startswith("devices: ") for x in block) and
                   any(x.startswith("plugin: ") or x == "built into libkiln" for x in block),
                   f"backend {b['name']} lacks its labelled lines (devices:, plugin: or built in):\n{backends}")


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
        version = b.get("version") or ""
        expect(not re.search(r"\b\d+ (devices?|platforms?)\b", version) and "when installed" not in version,
               f"backends[{i}] ({b.get('name')}) 'version' is not a version: {version!r}")
        if b.get("status") == "loaded":
            expect(b.get("reason") == "", f"backends[{i}] ({b.get('name')}) is loaded with a reason: {b.get('reason')!r}")
            expect(b.get("providers", [None])[:1] == ["native"],
                   f"backends[{i}] ({b.get('name')}) providers {b.get('providers')!r} do not start with native")
        if "libcuda.so" in (b.get("reason") or ""):
            expect(b["reason"].startswith("no NVIDIA driver: libcuda.so"),
                   f"backends[{i}]: a missing libcuda is not said to be a missing NVIDIA driver: {b['reason']!r}")
    names = [b.get("name") for b in backends]
    expect("cpu" in names, f"--json backends lack cpu: {names}")
    for b in backends:
        if b.get("name") == "cpu":
            expect(b.get("builtin") is True and b.get("path") == "", f"the cpu backend is not 'builtin' with no path: {b}")
            expect(str(b.get("version", "")).startswith("kiln "), f"the cpu backend's version is {b.get('version')!r}")
        if b.get("name") == "opencl" and b.get("status") == "loaded":
            expect("OpenCL" in b.get("version", ""), f"the opencl backend's version names no OpenCL: {b.get('version')!r}")
    for i, dev in enumerate(devices):
        check_types(dev, DEVICE_KEYS, f"devices[{i}]")
        expect(dev.get("index") == i, f"devices[{i}]['index'] is {dev.get('index')}")
        for op in ("matmul", "conv2d", "max_pool2d", "softmax", "add"):
            providers = dev.get("providers", {}).get(op)
            expect(isinstance(providers, str) and providers.split(",")[0] == "native",
                   f"devices[{i}] providers for {op} are {providers!r}; 'native' must come first")
        dtypes = dev.get("dtypes", {})
        expect(list(dtypes) == DTYPES, f"devices[{i}] dtypes are {list(dtypes)}, expected {DTYPES}")
        expect(all(v in ("native", "emulated", "unsupported") for v in dtypes.values()),
               f"devices[{i}] dtypes hold an unknown support: {dtypes}")
        expect(dtypes.get("f32") == "native" and dtypes.get("i32") == "native",
               f"devices[{i}] does not serve f32 and i32 natively: {dtypes}")
        if dev.get("backend") == "cpu":
            expect(dtypes == CPU_DTYPES, f"{dev.get('selector')} dtypes are {dtypes}, expected {CPU_DTYPES}")
    default = doc.get("default")
    defaults = [i for i, dev in enumerate(devices) if dev.get("is_default")]
    expect(isinstance(default, int) and not isinstance(default, bool),
           f"--json 'default' is {default!r}, expected a device index")
    if isinstance(default, int) and 0 <= default < len(devices):
        expect(devices[default].get("is_default") is True, f"devices[{default}] is 'default' but not is_default")
    expect(defaults == [default], f"devices marked is_default: {defaults}; 'default' is {default!r}")
    selectors = [dev.get("selector") for dev in devices]
    expect(len(set(selectors)) == len(selectors), f"selectors are not unique: {selectors}")
    # Numbers are JSON numbers, in the properties too.
    for dev in devices:
        for key, value in dev.get("properties", {}).items():
            if isinstance(value, str):
                expect(not re.fullmatch(r"(0|[1-9][0-9]{0,17})", value),
                       f"{dev.get('selector')} property {key} is the string {value!r}, not a number")
    cpu0 = [dev for dev in devices if dev.get("selector") == "cpu:0"]
    if cpu0 and "threads" in cpu0[0].get("properties", {}):
        threads = cpu0[0]["properties"]["threads"]
        expect(isinstance(threads, int) and not isinstance(threads, bool), f"cpu:0 threads is {threads!r}")
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
                "fp16:", "fp64:", "dtypes: f32 native, i32 native,", "providers.matmul:", "providers.add:"):
        expect(out.count("  " + key) == count, f"devinfo -v shows '{key}' {out.count('  ' + key)} times, "
               f"expected {count}:\n{out}")
    cpu_line = "  dtypes: " + ", ".join(f"{k} {v}" for k, v in CPU_DTYPES.items())
    expect(cpu_line in out.splitlines(), f"devinfo -v lacks the cpu's line '{cpu_line}':\n{out}")
    if doc:
        for dev in doc.get("devices", []):
            if dev.get("memory_free_is_estimate"):
                expect("(estimate)" in out, f"{dev.get('selector')} has an estimated free memory that -v "
                       "does not mark '(estimate)'")


def test_check(d, doc):
    # The run's cache is still empty here (listing builds nothing): the first
    # --check builds the OpenCL kernels and says so on stderr, once per
    # OpenCL device; the second loads them.
    proc = d.run("--check")
    again = d.run("--check")
    expect(proc.returncode == 0, f"devinfo --check exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    count = len(doc.get("devices", [])) if doc else 1
    passes = sum(1 for line in proc.stdout.splitlines() if line.rstrip().endswith("PASS"))
    expect(passes == count, f"devinfo --check passed {passes} devices of {count}:\n{proc.stdout}")
    expect("FAIL" not in proc.stdout, f"devinfo --check reports a failure:\n{proc.stdout}")
    opencl = [dev["selector"] for dev in (doc.get("devices", []) if doc else []) if dev.get("backend") == "opencl"]
    for selector in opencl:
        lines = [line for line in proc.stderr.splitlines()
                 if line.startswith(f"devinfo: building OpenCL kernels for {selector} (")]
        expect(len(lines) == 1 and lines[0].endswith("(first run; cached afterwards)"),
               f"the first devinfo --check says {len(lines)} times that it builds kernels for {selector}:\n"
               f"{proc.stderr}")
    expect("building OpenCL kernels" not in again.stderr,
           f"the second devinfo --check builds kernels again:\n{again.stderr}")
    expect("kiln: info:" not in proc.stderr, f"devinfo --check prints kiln's info log unasked:\n{proc.stderr}")


def test_check_reference_on_host(d, doc):
    """The check's reference does not need a visible CPU device."""
    opencl = [dev for dev in (doc.get("devices", []) if doc else []) if dev.get("backend") == "opencl"]
    if not opencl:
        print("note: no OpenCL device; KILN_DEVICE='opencl:*' devinfo --check is not checked here")
        return
    proc = d.run("--check", KILN_DEVICE="opencl:*")
    expect(proc.returncode == 0, f"KILN_DEVICE='opencl:*' devinfo --check exited {proc.returncode}:\n"
           f"{proc.stdout}{proc.stderr}")
    passes = sum(1 for line in proc.stdout.splitlines() if line.rstrip().endswith("PASS"))
    expect(passes == len(opencl), f"KILN_DEVICE='opencl:*' devinfo --check passed {passes} of {len(opencl)}:\n"
           f"{proc.stdout}")


def test_help(d):
    proc = d.run("--help")
    expect(proc.returncode == 0, f"devinfo --help exited {proc.returncode}")
    for word in ("usage", "--json", "--check", "-v", "KILN_DEVICE"):
        expect(word in proc.stdout, f"devinfo --help does not mention '{word}'")
    proc = d.run("--no-such-option")
    expect(proc.returncode == 2, f"devinfo --no-such-option exited {proc.returncode}, expected 2")
    expect("--no-such-option" in proc.stderr, f"devinfo does not name the unknown option: {proc.stderr}")


def test_version(d, doc):
    proc = d.run("--version")
    expect(proc.returncode == 0, f"devinfo --version exited {proc.returncode}")
    version = doc.get("version") if doc else None
    expect(version and version in proc.stdout, f"devinfo --version does not print kiln's {version}: {proc.stdout!r}")


def test_selectors_that_select_nothing(d, doc):
    # A term naming no backend kiln knows is an error naming the backends; a
    # hint never leads to such a term; a selector that hides every device is
    # an error that lists the devices found.
    proc = d.run(KILN_DEVICE="bogus")
    expect(proc.returncode == 2 and "cuda, opencl, cpu" in proc.stderr and "bogus:*" not in proc.stderr,
           f"KILN_DEVICE=bogus devinfo exited {proc.returncode}: {proc.stderr!r}")
    proc = d.run(KILN_DEVICE="bogus:*")
    expect(proc.returncode == 2 and "unknown backend 'bogus'" in proc.stderr,
           f"KILN_DEVICE='bogus:*' devinfo exited {proc.returncode}: {proc.stderr!r}")
    proc = d.run(KILN_DEVICE="gpu")
    expect(proc.returncode == 2 and "'*:gpu'" in proc.stderr,
           f"KILN_DEVICE=gpu does not suggest '*:gpu': {proc.stderr!r}")
    proc = d.run(KILN_DEVICE="cpu:63")
    expect(proc.returncode == 2 and "leaves no device visible" in proc.stderr and "cpu:0" in proc.stderr,
           f"KILN_DEVICE=cpu:63 devinfo exited {proc.returncode}: {proc.stderr!r}")


def test_log_variables(d):
    proc = d.run(KILN_LOG="DEBUG")
    expect(proc.returncode == 0 and "kiln: debug:" in proc.stderr,
           f"KILN_LOG=DEBUG devinfo exited {proc.returncode} or logged no debug line: {proc.stderr[-400:]!r}")
    proc = d.run(KILN_LOG="warn", KILN_DEVICES="cpu:0")
    expect(proc.returncode == 0 and "KILN_DEVICES is set" in proc.stderr and "did you mean KILN_DEVICE?" in proc.stderr,
           f"a misspelled KILN_DEVICES is not named at warn: {proc.stderr!r}")


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
    if "libcuda.so" in cuda[0].get("reason", ""):
        expect(lines and "no NVIDIA driver: libcuda.so.1 not found" in lines[0],
               f"the table does not say that the NVIDIA driver is missing:\n{proc.stdout}")


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
        doc = test_json(d)
        test_table(d, doc)
        if doc:
            test_selectors(d, doc)
        test_cpu_devices(d)
        test_verbose(d, doc)
        test_check(d, doc)
        test_check_reference_on_host(d, doc)
        test_help(d)
        test_version(d, doc)
        test_selectors_that_select_nothing(d, doc)
        test_log_variables(d)
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
