#!/usr/bin/env python3
"""scripts/philox_fit.py: the polynomial constants of kernels/philox.h's log, cos and sin.

  /usr/bin/python3 scripts/philox_fit.py

log: log1p(f) = f + f^2 * R(f) for f = m - 1, m in [sqrt(1/2), sqrt(2)];
R(f) = (log1p(f) - f) / f^2 is interpolated at Chebyshev nodes of that
interval (mpmath, 60 digits), the interpolant turned into monomials in f and
each coefficient rounded to the type (double for f64, float for f32).
cos, sin: cos(pi/2 t) = sum c_k t^(2k), sin(pi/2 t) = t sum s_k t^(2k) for
t in [0, 1/2], Taylor coefficients (pi/2)^j / j! with alternating signs.
Prints each set and the largest error of the rounded polynomial (relative
to log1p(f), resp. cos and sin) over a fine grid, evaluated exactly.
"""
import mpmath as mp
import numpy as np

mp.mp.dps = 60
A = mp.sqrt(mp.mpf(1) / 2) - 1 - mp.mpf("1e-6")
B = mp.sqrt(2) - 1 + mp.mpf("1e-6")


def R(f):
    if f == 0:
        return mp.mpf(-1) / 2
    return (mp.log1p(f) - f) / (f * f)


def cheb_monomials(fn, a, b, deg):
    """Interpolant of fn at deg+1 Chebyshev nodes of [a, b], as monomial coefficients (lowest first)."""
    n = deg + 1
    nodes = [mp.cos(mp.pi * (k + mp.mpf(1) / 2) / n) for k in range(n)]
    xs = [(a + b) / 2 + (b - a) / 2 * x for x in nodes]
    ys = [fn(x) for x in xs]
    # Newton's divided differences, then expand to monomials.
    coef = list(ys)
    for j in range(1, n):
        for i in range(n - 1, j - 1, -1):
            coef[i] = (coef[i] - coef[i - 1]) / (xs[i] - xs[i - j])
    poly = [mp.mpf(0)] * n
    for i in range(n - 1, -1, -1):
        # poly = poly * (x - xs[i]) + coef[i]
        new = [mp.mpf(0)] * n
        for k in range(n - 1):
            new[k + 1] += poly[k]
        for k in range(n):
            new[k] -= xs[i] * poly[k]
        new[0] += coef[i]
        poly = new
    return poly


def rounded(c, kind):
    return [mp.mpf(float(np.float32(float(x)))) if kind == "f32" else mp.mpf(float(x)) for x in c]


def log_error(c):
    worst = mp.mpf(0)
    for k in range(2001):
        f = A + (B - A) * k / 2000
        if f == 0:
            continue
        p = mp.mpf(0)
        for x in reversed(c):
            p = p * f + x
        worst = max(worst, abs((f + f * f * p - mp.log1p(f)) / mp.log1p(f)))
    return worst


def lit(x, kind):
    if kind == "f32":
        return "%.9gf" % float(np.float32(float(x)))
    return "%.17g" % float(x)


for kind, target in (("f32", 2.0 ** -27), ("f64", 2.0 ** -56)):
    for deg in range(2, 40):
        c = rounded(cheb_monomials(R, A, B, deg), kind)
        err = log_error(c)
        if err < target:
            break
    print("log1p %s: R of degree %d, max relative error %.3g" % (kind, deg, float(err)))
    print("  " + ", ".join(lit(x, kind) for x in c))

for kind, terms_c, terms_s in (("f32", 6, 5), ("f64", 10, 10)):
    h = mp.pi / 2
    cc = rounded([(-1) ** k * h ** (2 * k) / mp.factorial(2 * k) for k in range(terms_c)], kind)
    sc = rounded([(-1) ** k * h ** (2 * k + 1) / mp.factorial(2 * k + 1) for k in range(terms_s)], kind)
    ec = es = mp.mpf(0)
    for k in range(1, 1001):
        t = mp.mpf(k) / 2000
        t2 = t * t
        pc = mp.mpf(0)
        for x in reversed(cc):
            pc = pc * t2 + x
        ps = mp.mpf(0)
        for x in reversed(sc):
            ps = ps * t2 + x
        ec = max(ec, abs(pc / mp.cos(h * t) - 1))
        es = max(es, abs(t * ps / mp.sin(h * t) - 1))
    print("cos %s: %d terms, max relative error %.3g" % (kind, terms_c, float(ec)))
    print("  " + ", ".join(lit(x, kind) for x in cc))
    print("sin %s: %d terms, max relative error %.3g" % (kind, terms_s, float(es)))
    print("  " + ", ".join(lit(x, kind) for x in sc))
