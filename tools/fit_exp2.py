#!/usr/bin/env python3
"""Fits the polynomial 1 + c1 f + ... + cd f^d to 2^f on [-1/2, 1/2] for relative error
(Lawson's reweighted least squares, which converges to the minimax fit), rounds the
coefficients to f32 and prints them as C hex literals with the fit's worst relative error,
evaluated by Horner in double on the rounded coefficients. The constant is 1 so that
2^0 = 1 exactly. ukernels_avx512.c's exp512_bf16p uses degree 4:

    python3 tools/fit_exp2.py 4

Pure Python (no numpy), a few seconds."""
import math
import struct
import sys


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def solve(a, b):
    """Solves the small dense system a x = b by Gaussian elimination with pivoting."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        for r in range(c + 1, n):
            k = m[r][c] / m[c][c]
            for j in range(c, n + 1):
                m[r][j] -= k * m[c][j]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][j] * x[j] for j in range(r + 1, n))) / m[r][r]
    return x


def fit(deg, points=2001, iterations=200):
    fs = [-0.5 + i / (points - 1) for i in range(points)]
    ys = [2.0 ** f for f in fs]
    # relative error (p(f) - y) / y = sum_k c_k f^k / y - (y - 1) / y
    rows = [[f ** k / y for k in range(1, deg + 1)] for f, y in zip(fs, ys)]
    rhs = [(y - 1.0) / y for y in ys]
    w = [1.0 / points] * points
    c = [0.0] * deg
    for _ in range(iterations):
        ata = [[sum(w[i] * rows[i][p] * rows[i][q] for i in range(points)) for q in range(deg)]
               for p in range(deg)]
        atb = [sum(w[i] * rows[i][p] * rhs[i] for i in range(points)) for p in range(deg)]
        c = solve(ata, atb)
        e = [abs(sum(ck * rk for ck, rk in zip(c, row)) - r) for row, r in zip(rows, rhs)]
        w = [wi * ei for wi, ei in zip(w, e)]
        total = sum(w)
        w = [wi / total for wi in w]
    c32 = [f32(x) for x in c]
    worst = 0.0
    for f, y in zip(fs, ys):
        p = c32[-1]
        for ck in reversed(c32[:-1]):
            p = p * f + ck
        worst = max(worst, abs((p * f + 1.0) / y - 1.0))
    return c32, worst


def main():
    deg = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    if not 2 <= deg <= 7:
        sys.exit("fit_exp2.py: the degree must be 2..7")
    c32, worst = fit(deg)
    print("degree %d: worst relative error %.3g on [-1/2, 1/2] (2^%.2f)"
          % (deg, worst, math.log2(worst)))
    for k, ck in enumerate(c32, 1):
        mant, expo = float.hex(ck).split("p")
        print("  c%d = %sp%sf" % (k, mant.rstrip("0"), expo))


if __name__ == "__main__":
    main()
