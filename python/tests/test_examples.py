# python/tests/test_examples.py: the examples run as a user runs them (examples/gpu_chapter.py, examples/train.py, examples/oci_net.py), shortened.
import os
import subprocess
import sys

import pytest

import kiln.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(script, *args, **env):
    full_env = dict(os.environ)
    full_env.update({"KILN_DEVICE": "cpu:*", **env})
    return subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args], env=full_env,
                          capture_output=True, text=True, timeout=300)


def test_gpu_chapter_runs_every_cell():
    r = run("gpu_chapter.py", "--steps", "20", KILN_CPU_DEVICES="2")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "X + Y raised kiln.DeviceMismatchError" in out
    assert "Z.to(gpu1) is Z: True" in out
    assert "net[0].weight.device: cpu:0" in out
    assert "largest difference between (a) and (b): 0" in out


@pytest.mark.skipif(not os.path.exists(os.path.join(nn.FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz")),
                    reason="Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
def test_train_learns_with_both_loops():
    losses = []
    for loop in ("python", "c"):
        r = run("train.py", "--limit", "3000", "--epochs", "1", "--loop", loop, "--seed", "3")
        assert r.returncode == 0, r.stderr
        line = [l for l in r.stdout.splitlines() if l.startswith("epoch  1:")][0]
        losses.append(float(line.split("loss ")[1].split(",")[0]))
        assert float(line.split("test accuracy ")[1].split(",")[0]) > 0.5
    assert abs(losses[0] - losses[1]) < 1e-3, "the step written in Python and libkiln-nn's loop train alike"


@pytest.mark.skipif(not os.path.exists(os.path.join(nn.FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz")),
                    reason="Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
@pytest.mark.parametrize("device", ["cpu:0", "opencl:0"])
def test_oci_net_learns_saves_and_reloads(device):
    import kiln
    if device not in [str(d) for d in kiln.devices()]:
        pytest.skip(f"no {device} here")
    r = run("oci_net.py", "--device", device, "--steps", "400", "--report", "100", "--lr", "0.01",
            "--test-limit", "1000", KILN_DEVICE=device)
    assert r.returncode == 0, r.stderr
    losses = [float(l.split("loss: ")[1]) for l in r.stdout.splitlines() if "] loss: " in l]
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.5, r.stdout
    line = [l for l in r.stdout.splitlines() if l.startswith("Accuracy of the network on the 1000 test images")][0]
    after, before = (float(p.split(" %")[0]) for p in (line.split(": ")[1], line.split("(")[1]))
    assert after == before and after > 40.0, line
