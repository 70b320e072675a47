# python/tests/test_trace.py: kiln.trace as a context manager writes Trace Event Format JSON and keeps the summary; kiln.trace_span marks the caller's own work.
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


def test_trace_span_on_the_host_track_and_in_the_summary(tmp_path):
    path = tmp_path / "spans.json"
    x = kiln.tensor([1.0, 2.0, 3.0])
    with kiln.trace_span("outside"):  # no trace: nothing recorded, no error
        pass
    with kiln.trace(path) as t:
        for _ in range(2):
            with kiln.trace_span("step", bytes=12, detail="two adds"):
                y = x + x
                y = y + x
            float(y.sum())
    data = json.loads(path.read_text())
    spans = [e for e in data["traceEvents"] if e.get("cat") == "phase"]
    assert [e["name"] for e in spans] == ["step", "step"]
    assert spans[0]["pid"] == 1 and spans[0]["ph"] == "X"
    assert spans[0]["args"]["detail"] == "two adds" and spans[0]["args"]["bytes"] == 12
    row = next(line for line in t.summary.splitlines() if line.startswith("phase"))
    parts = row.split()
    assert parts[:3] == ["phase", "step", "2"] and parts[4] == "24"
    with pytest.raises(kiln.Error, match="the name is empty"):
        with kiln.trace(tmp_path / "bad.json"):
            with kiln.trace_span(""):
                pass
