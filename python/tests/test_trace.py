# python/tests/test_trace.py: kiln.trace as a context manager writes Trace Event Format JSON and keeps the summary.
import json

import pytest

import kiln


def test_trace_writes_json_and_summary(tmp_path):
    path = tmp_path / "run.json"
    x = kiln.ones((8, 8), device="cpu:0")
    with kiln.trace(path) as t:
        y = (x @ x) + x
        y.numpy()
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    names = {e["name"] for e in events}
    assert {"matmul", "add"} <= names
    assert all({"name", "ph", "ts", "pid", "tid"} <= e.keys() for e in events)
    assert data["otherData"]["events_dropped"] == 0
    assert "matmul" in t.summary and "top 10 ops by device time" in t.summary
    assert kiln.trace_summary() == t.summary


def test_trace_refuses_bad_paths(tmp_path):
    with pytest.raises(kiln.Error, match="absent"):
        with kiln.trace(tmp_path / "absent" / "run.json"):
            pass
    with kiln.trace(tmp_path / "one.json"):
        with pytest.raises(kiln.Error, match="already recording"):
            with kiln.trace(tmp_path / "two.json"):
                pass
