"""Non-negative least squares for the calibrated model's fit, in plain Python (no numpy)."""

from __future__ import annotations

import math


def fit_linear(xs: list[list[float]], ys: list[float], relative: bool = False) -> tuple[list[float], float]:
    """Least-squares coefficients `b >= 0` of `y ~ x . b`, and the fit's R² (on `ys` as given).

    Solves the normal equations by Gaussian elimination. A column that is all zeros gets 0. When a
    coefficient comes out negative, the most negative one is fixed at 0 and the others are refitted,
    until none is negative.

    `relative`: minimise the squared *relative* errors `((x . b - y) / y)²` (each row weighted by
    `1 / y`; a `y` at or below 0 counts as the smallest positive one) instead of the absolute
    ones, so that the many small `y` weigh as much as the few large ones.
    """
    if relative:
        floor = min((y for y in ys if y > 0.0), default=1.0)
        weights = [1.0 / max(y, floor) for y in ys]
        fit_xs = [[xj * w for xj in x] for x, w in zip(xs, weights)]
        fit_ys = [y * w for y, w in zip(ys, weights)]
    else:
        fit_xs, fit_ys = xs, ys
    k = len(xs[0])
    active = [j for j in range(k) if any(x[j] for x in xs)]
    coef = [0.0] * k
    while active:
        sol = _least_squares([[x[j] for j in active] for x in fit_xs], fit_ys)
        worst = min(range(len(active)), key=sol.__getitem__)
        if sol[worst] >= 0.0:
            for j, b in zip(active, sol):
                coef[j] = b
            break
        del active[worst]
    mean = math.fsum(ys) / len(ys)
    ss_tot = math.fsum((y - mean) ** 2 for y in ys)
    ss_res = math.fsum((y - _dot(x, coef)) ** 2 for x, y in zip(xs, ys))
    return coef, (1.0 - ss_res / ss_tot if ss_tot > 0.0 else 1.0)


def _dot(x: list[float], b: list[float]) -> float:
    return math.fsum(xi * bi for xi, bi in zip(x, b))


def _least_squares(xs: list[list[float]], ys: list[float]) -> list[float]:
    # Columns scaled to a max of 1 keep the normal equations well conditioned (token counts and
    # context tokens differ by orders of magnitude); one refinement step recovers the last digits.
    k = len(xs[0])
    scale = [max(abs(x[j]) for x in xs) for j in range(k)]
    zs = [[x[j] / scale[j] for j in range(k)] for x in xs]
    gram = [[math.fsum(z[i] * z[j] for z in zs) for j in range(k)] for i in range(k)]
    sol = _solve(gram, [math.fsum(z[i] * y for z, y in zip(zs, ys)) for i in range(k)])
    res = [math.fsum([y] + [-zj * sj for zj, sj in zip(z, sol)]) for z, y in zip(zs, ys)]
    delta = _solve(gram, [math.fsum(z[i] * r for z, r in zip(zs, res)) for i in range(k)])
    return [(s + d) / c for s, d, c in zip(sol, delta, scale)]


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting."""
    k = len(b)
    m = [row[:] + [bi] for row, bi in zip(a, b)]
    tol = 1e-12 * max(abs(m[i][i]) for i in range(k))
    for c in range(k):
        p = max(range(c, k), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) <= tol:
            raise ValueError(
                "the step log cannot separate the coefficients (collinear columns, or fewer "
                "distinct steps than coefficients)"
            )
        m[c], m[p] = m[p], m[c]
        for r in range(c + 1, k):
            f = m[r][c] / m[c][c]
            for j in range(c, k + 1):
                m[r][j] -= f * m[c][j]
    sol = [0.0] * k
    for r in range(k - 1, -1, -1):
        sol[r] = (m[r][k] - sum(m[r][j] * sol[j] for j in range(r + 1, k))) / m[r][r]
    return sol
