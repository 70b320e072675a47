#!/usr/bin/python3
"""tests/grad/make_references.py: write the PyTorch reference gradients that tests/test_grad.c compares kiln with.

Run with Debian's python3-torch (torch 1.13):

    /usr/bin/python3 tests/grad/make_references.py [OUTPUT_DIR]

OUTPUT_DIR defaults to this script's folder. The files are committed beside
it; the test reads them and needs no torch. Rerunning rewrites them (the
values depend on torch's random generator, so another torch may write other
numbers; every file stays a valid reference).

The format ("kiln-grad-reference 1"), one file per case, plain text:

    # comment lines anywhere
    kiln-grad-reference 1
    case <name>                      what the file holds, free text without spaces
    kind <kind>                      which check reads it: conv2d, max_pool2d,
                                     cross_entropy, broadcast_mul, softmax, unary,
                                     sgd, adam
    torch <version>                  the torch that computed it
    int <key> <v> [<v> ...]          integer parameters (stride 2 2, ...)
    real <key> <v>                   real parameters (lr, dloss, ...)
    tensor <key> <dtype> <ndim> <size> ... <size>
    <numel values, whitespace separated, row-major>
    end

dtype is f32 for inputs (kiln gets exactly these floats: printed with 9
significant digits, which round-trips float32), i32 for labels, and f64 for
the expected results, which torch computed in float64 from the float32
inputs (printed with 17 digits): the reference carries no float32 rounding
of its own, so a test's tolerance measures kiln's alone.
"""
import os
import sys

import torch
import torch.nn.functional as F

VERSION = 1


def fmt_values(t, digits):
    flat = t.reshape(-1).tolist()
    if t.dtype in (torch.int32, torch.int64):
        words = [str(int(v)) for v in flat]
    else:
        words = [("%." + str(digits) + "g") % v for v in flat]
    lines = []
    for i in range(0, len(words), 8):
        lines.append(" ".join(words[i:i + 8]))
    return "\n".join(lines)


class Writer:
    def __init__(self, directory, name, kind, comment):
        self.path = os.path.join(directory, name + ".txt")
        self.lines = [
            "# " + comment,
            "# written by tests/grad/make_references.py; format described there",
            "kiln-grad-reference %d" % VERSION,
            "case " + name,
            "kind " + kind,
            "torch " + torch.__version__,
        ]

    def ints(self, key, *values):
        self.lines.append("int %s %s" % (key, " ".join(str(int(v)) for v in values)))

    def real(self, key, value):
        self.lines.append("real %s %.17g" % (key, value))

    def tensor(self, key, t, dtype):
        shape = list(t.shape)
        self.lines.append("tensor %s %s %d%s" % (key, dtype, len(shape), "".join(" %d" % s for s in shape)))
        if len(shape) == 0 or t.numel() > 0:
            if dtype == "f32":
                self.lines.append(fmt_values(t.to(torch.float32).double(), 9))
            elif dtype == "i32":
                self.lines.append(fmt_values(t.to(torch.int64), 0))
            else:
                self.lines.append(fmt_values(t.double(), 17))

    def close(self):
        self.lines.append("end")
        with open(self.path, "w") as f:
            f.write("\n".join(self.lines) + "\n")
        print("wrote", self.path)


def f32(*shape, scale=1.0):
    """Random float32 values (what kiln gets), as float64 for the computation."""
    return (torch.randn(*shape, dtype=torch.float32) * scale).to(torch.float32).double()


def conv2d(out):
    # Stride 2, padding 1, dilation 2; batch 2, prime-ish sizes: H 9, W 8.
    w = Writer(out, "conv2d_stride2_pad1_dil2", "conv2d",
               "conv2d x [2,3,9,8], weight [4,3,3,3], bias [4], stride 2, padding 1, dilation 2: y, dx, dw, db")
    x = f32(2, 3, 9, 8).requires_grad_()
    weight = f32(4, 3, 3, 3, scale=0.5).requires_grad_()
    bias = f32(4).requires_grad_()
    y = F.conv2d(x, weight, bias, stride=2, padding=1, dilation=2)
    dy = f32(*y.shape)
    y.backward(dy)
    w.ints("stride", 2, 2)
    w.ints("padding", 1, 1)
    w.ints("dilation", 2, 2)
    w.tensor("x", x.detach(), "f32")
    w.tensor("weight", weight.detach(), "f32")
    w.tensor("bias", bias.detach(), "f32")
    w.tensor("dy", dy, "f32")
    w.tensor("y", y.detach(), "f64")
    w.tensor("dx", x.grad, "f64")
    w.tensor("dw", weight.grad, "f64")
    w.tensor("db", bias.grad, "f64")
    w.close()
    # The same with stride (1, 2), padding (2, 0) and dilation (1, 3), batch 1.
    w = Writer(out, "conv2d_asymmetric", "conv2d",
               "conv2d x [1,2,7,11], weight [3,2,3,2], bias [3], stride (1,2), padding (2,0), dilation (1,3)")
    x = f32(1, 2, 7, 11).requires_grad_()
    weight = f32(3, 2, 3, 2, scale=0.5).requires_grad_()
    bias = f32(3).requires_grad_()
    y = F.conv2d(x, weight, bias, stride=(1, 2), padding=(2, 0), dilation=(1, 3))
    dy = f32(*y.shape)
    y.backward(dy)
    w.ints("stride", 1, 2)
    w.ints("padding", 2, 0)
    w.ints("dilation", 1, 3)
    w.tensor("x", x.detach(), "f32")
    w.tensor("weight", weight.detach(), "f32")
    w.tensor("bias", bias.detach(), "f32")
    w.tensor("dy", dy, "f32")
    w.tensor("y", y.detach(), "f64")
    w.tensor("dx", x.grad, "f64")
    w.tensor("dw", weight.grad, "f64")
    w.tensor("db", bias.grad, "f64")
    w.close()


def max_pool2d(out):
    # Overlapping windows (kernel 3, stride 2) over small integers: ties in
    # most windows, which go to the first maximum in row-major order.
    for name, shape, padding in (("max_pool2d_k3_s2_ties", (2, 2, 9, 8), 0),
                                 ("max_pool2d_k3_s2_pad1_ties", (1, 3, 7, 7), 1)):
        w = Writer(out, name, "max_pool2d",
                   "max_pool2d x %s of integers in [-2, 2], kernel 3, stride 2, padding %d: y, dx" %
                   (list(shape), padding))
        x = torch.randint(-2, 3, shape).double().requires_grad_()
        y = F.max_pool2d(x, kernel_size=3, stride=2, padding=padding)
        dy = f32(*y.shape)
        y.backward(dy)
        w.ints("kernel", 3, 3)
        w.ints("stride", 2, 2)
        w.ints("padding", padding, padding)
        w.tensor("x", x.detach(), "f32")
        w.tensor("dy", dy, "f32")
        w.tensor("y", y.detach(), "f64")
        w.tensor("dx", x.grad, "f64")
        w.close()


def cross_entropy(out):
    cases = (("cross_entropy", 6, 5, 2.0, None),
             ("cross_entropy_dloss", 4, 9, 1.0, 0.375),
             ("cross_entropy_large", 5, 7, 40.0, None))
    for name, n, c, scale, dloss in cases:
        w = Writer(out, name, "cross_entropy",
                   "softmax cross-entropy (mean over N) of logits [%d,%d] (scale %g)%s: loss, dlogits" %
                   (n, c, scale, "" if dloss is None else ", dloss %g" % dloss))
        logits = f32(n, c, scale=scale).requires_grad_()
        labels = torch.randint(0, c, (n,))
        loss = F.cross_entropy(logits, labels)
        loss.backward(torch.tensor(1.0 if dloss is None else dloss, dtype=torch.float64))
        if dloss is not None:
            w.real("dloss", dloss)
        w.tensor("logits", logits.detach(), "f32")
        w.tensor("labels", labels, "i32")
        w.tensor("loss", loss.detach(), "f64")
        w.tensor("dlogits", logits.grad, "f64")
        w.close()


def broadcast_mul(out):
    w = Writer(out, "broadcast_mul", "broadcast_mul",
               "y = a * b with a [3,1,5] and b [4,1] broadcast to [3,4,5]: y, da, db")
    a = f32(3, 1, 5).requires_grad_()
    b = f32(4, 1).requires_grad_()
    y = a * b
    dy = f32(*y.shape)
    y.backward(dy)
    w.tensor("a", a.detach(), "f32")
    w.tensor("b", b.detach(), "f32")
    w.tensor("dy", dy, "f32")
    w.tensor("y", y.detach(), "f64")
    w.tensor("da", a.grad, "f64")
    w.tensor("db", b.grad, "f64")
    w.close()


def softmax(out):
    w = Writer(out, "softmax", "softmax", "softmax and log_softmax over the last axis of x [3,4,7]: dx of each")
    x = f32(3, 4, 7, scale=2.0)
    dy = f32(3, 4, 7)
    xs = x.clone().requires_grad_()
    torch.softmax(xs, -1).backward(dy)
    xl = x.clone().requires_grad_()
    torch.log_softmax(xl, -1).backward(dy)
    w.tensor("x", x, "f32")
    w.tensor("dy", dy, "f32")
    w.tensor("dx_softmax", xs.grad, "f64")
    w.tensor("dx_log_softmax", xl.grad, "f64")
    w.close()


def unary(out):
    w = Writer(out, "unary", "unary", "dy * f'(x) of every unary op of kiln; relu and abs at 0 included (0 there)")
    ops = (("neg", torch.neg, False), ("abs", torch.abs, False), ("exp", torch.exp, False),
           ("log", torch.log, True), ("sqrt", torch.sqrt, True), ("relu", torch.relu, False),
           ("sigmoid", torch.sigmoid, False), ("tanh", torch.tanh, False))
    for name, fn, positive in ops:
        x = f32(2, 9, scale=1.5)
        if positive:
            x = x.abs() + 0.125
        else:
            x[0, 0] = 0.0
            x[1, 4] = -0.0
        dy = f32(2, 9)
        xg = x.clone().requires_grad_()
        fn(xg).backward(dy)
        w.tensor("x_" + name, x, "f32")
        w.tensor("dy_" + name, dy, "f32")
        w.tensor("dx_" + name, xg.grad, "f64")
    w.close()


def sgd(out):
    # Three steps of torch.optim.SGD from a zero momentum buffer, dampening 0
    # (with dampening, torch's first step sets the buffer to g where kiln's
    # formula from a zero buffer gives (1 - dampening) g).
    configs = (("sgd_momentum", dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
               ("sgd_nesterov", dict(lr=0.05, momentum=0.8, nesterov=True)),
               ("sgd_plain", dict(lr=0.25, weight_decay=0.1)))
    for name, kw in configs:
        w = Writer(out, name, "sgd", "torch.optim.SGD(%s), three steps: param after each, the buffer at the end" %
                   ", ".join("%s=%s" % kv for kv in kw.items()))
        p = torch.nn.Parameter(f32(3, 5))
        w.tensor("param", p.detach(), "f32")
        opt = torch.optim.SGD([p], **kw)
        w.real("lr", kw["lr"])
        w.real("momentum", kw.get("momentum", 0.0))
        w.real("dampening", 0.0)
        w.real("weight_decay", kw.get("weight_decay", 0.0))
        w.ints("nesterov", 1 if kw.get("nesterov") else 0)
        w.ints("steps", 3)
        for step in range(1, 4):
            g = f32(3, 5)
            p.grad = g.clone()
            opt.step()
            w.tensor("grad%d" % step, g, "f32")
            w.tensor("param%d" % step, p.detach(), "f64")
        if kw.get("momentum", 0.0) > 0:
            w.tensor("momentum_buf", opt.state[p]["momentum_buffer"], "f64")
        w.close()


def adam(out):
    configs = (("adam", dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8)),
               ("adam_weight_decay", dict(lr=1e-3, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.05)))
    for name, kw in configs:
        w = Writer(out, name, "adam", "torch.optim.Adam(%s), three steps: param after each, m and v at the end" %
                   ", ".join("%s=%s" % kv for kv in kw.items()))
        p = torch.nn.Parameter(f32(4, 3))
        w.tensor("param", p.detach(), "f32")
        opt = torch.optim.Adam([p], **kw)
        w.real("lr", kw["lr"])
        w.real("beta1", kw["betas"][0])
        w.real("beta2", kw["betas"][1])
        w.real("eps", kw["eps"])
        w.real("weight_decay", kw.get("weight_decay", 0.0))
        w.ints("steps", 3)
        for step in range(1, 4):
            g = f32(4, 3)
            p.grad = g.clone()
            opt.step()
            w.tensor("grad%d" % step, g, "f32")
            w.tensor("param%d" % step, p.detach(), "f64")
        w.tensor("m", opt.state[p]["exp_avg"], "f64")
        w.tensor("v", opt.state[p]["exp_avg_sq"], "f64")
        w.close()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(20261124)
    conv2d(out)
    max_pool2d(out)
    cross_entropy(out)
    broadcast_mul(out)
    softmax(out)
    unary(out)
    sgd(out)
    adam(out)


if __name__ == "__main__":
    main()
