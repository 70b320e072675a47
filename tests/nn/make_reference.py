#!/usr/bin/env python3
# tests/nn/make_reference.py: writes the safetensors files test_nn_safetensors.c reads as "written by PyTorch".
"""Writes tests/nn/data/*.safetensors with the reference implementation.

Run it with a Python that has PyTorch and Hugging Face's `safetensors`
package, for instance Debian's python3-torch plus a virtual environment:

    /usr/bin/python3 -m venv --system-site-packages /tmp/stenv
    /tmp/stenv/bin/pip install safetensors
    /tmp/stenv/bin/python tests/nn/make_reference.py

The values are simple formulas that test_nn_safetensors.c recomputes; the
files are committed, so the tests never need PyTorch. Without the package the
script refuses: files written by hand would prove nothing about PyTorch.
"""
import os
import sys

import torch
from safetensors.torch import save_file

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def main():
    os.makedirs(HERE, exist_ok=True)
    # reference.safetensors: what a small model's state_dict looks like, plus
    # the awkward shapes (0-d, an empty dimension) and an i32 tensor.
    tensors = {
        "fc1.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4) * 0.5 - 1.0,
        "fc1.bias": torch.tensor([0.25, -0.5, 1e-3, 3.0e7], dtype=torch.float32),
        "steps": (torch.arange(6, dtype=torch.int32) - 3).reshape(2, 3),
        "scale": torch.tensor(3.25, dtype=torch.float32),
        "empty": torch.zeros((0, 5), dtype=torch.float32),
        "conv.weight": torch.arange(2 * 1 * 3 * 3, dtype=torch.float32).reshape(2, 1, 3, 3) / 8.0,
    }
    # One metadata key: the reference keeps metadata in a hash map, so with
    # more than one its order, and the file's bytes, would vary between runs.
    save_file(tensors, os.path.join(HERE, "reference.safetensors"), metadata={"format": "pt"})
    # A dtype kiln does not have yet, beside one it has.
    save_file({"half": torch.ones(2, dtype=torch.bfloat16), "ok": torch.ones(2)},
              os.path.join(HERE, "bf16.safetensors"))
    save_file({"wide": torch.ones(3, dtype=torch.float64)}, os.path.join(HERE, "f64.safetensors"))
    import safetensors
    print("wrote", sorted(os.listdir(HERE)), "with safetensors", safetensors.__version__, "and torch", torch.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
