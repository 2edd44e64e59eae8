"""Float64 models of what the CUDA backward kernels sum per pair for the gradients of the gaps and the
temperature (the operators backward_parameters and affine_backward_parameters), checked against autograd
through the reference loop.

The kernels cannot run on this machine, so each model is the arithmetic of one kernel family in float64,
with the kernel's own weights, order and (for the gradient by rows) scales: 32 lanes of 8 columns, each
lane's row of E = 2^(H c) held at its own scale 2^-sigma, scans across lanes in the kernel's rounds.
A wrong formula for a sum, or a scale applied on the wrong side, fails here:

* backward_table.cu (linear, from the DP table): the gap flow sum e (w_up + w_left) and <S, grad_S>;
* backward_rows.cu and rows.cuh (linear, by rows): the gap flow Ahat (G E_left + G E_up) of each cell, in
  the cell's lane scale, and <S, w>;
* affine_backward.cu (affine, from the state, both soft forms; the traceback at t = 0): what enters the gap
  states and what flows along extension edges;
* affine_backward_rows.cu (affine, by rows): the same in scaled space, X kept from the row's scan.

Each model returns the gradient of S, the gap sums and the inner product, all weighted by the incoming
gradient g; the temperature's gradient then follows as ops computes it,
(g score - <S, grad_S> - sum gap * gap_sum) / t.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from swcli.reference import soft_smith_waterman_affine_reference, soft_smith_waterman_reference

LANES, COLS = 32, 8  # rows.cuh: kWarp lanes of kRowCols columns
TOP = 60  # kRowsTop: a lane's largest value of a row at 2^60


# --------------------------------------------------------------------------------------------------
# The reference and the forward tables


def reference_derivatives(S: np.ndarray, gaps: tuple, t: float, g: float):
    """(score, g dS, g d/d each gap, g d/dt or None) of one pair through the float64 reference loop."""
    St = torch.tensor(S[None], dtype=torch.float64, requires_grad=True)
    gap_tensors = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in gaps]
    tt = torch.tensor(t, dtype=torch.float64, requires_grad=t > 0)
    if len(gaps) == 1:
        score = soft_smith_waterman_reference(St, gap_tensors[0], tt)
    else:
        score = soft_smith_waterman_affine_reference(St, *gap_tensors, tt)
    wrt = [St, *gap_tensors] + ([tt] if t > 0 else [])
    grads = torch.autograd.grad(score.sum() * g, wrt)
    dS, dgaps = grads[0][0].numpy(), [x.item() for x in grads[1:1 + len(gaps)]]
    return score.item(), dS, dgaps, grads[-1].item() if t > 0 else None


def smax(terms, t):
    terms = np.asarray(terms, dtype=np.float64)
    m = terms.max()
    if t == 0 or not np.isfinite(m):
        return m
    return m + t * math.log(np.exp((terms - m) / t).sum())


def linear_table(S, gap, t):
    q, n = S.shape
    H = np.zeros((q + 1, n + 1))
    for i in range(1, q + 1):
        for j in range(1, n + 1):
            H[i, j] = smax([0.0, H[i - 1, j - 1] + S[i - 1, j - 1], H[i - 1, j] + gap, H[i, j - 1] + gap], t)
    return H


def affine_tables(S, o, e, t):
    q, n = S.shape
    inf = -np.inf
    H = np.zeros((q + 1, n + 1))
    M, X, Y = (np.full((q + 1, n + 1), inf) for _ in range(3))
    for i in range(1, q + 1):
        for j in range(1, n + 1):
            M[i, j] = H[i - 1, j - 1] + S[i - 1, j - 1]
            X[i, j] = smax([o, M[i, j - 1] + o, Y[i, j - 1] + o, X[i, j - 1] + e], t)
            Y[i, j] = smax([o, M[i - 1, j] + o, Y[i - 1, j] + e, X[i - 1, j] + o], t)
            H[i, j] = smax([0.0, M[i, j], Y[i, j], X[i, j]], t)
    return H, M, X, Y


def first_best(H):
    """The engines' best cell: the first strictly larger than the zero border in row-major order, as
    (i, j) of the DP (1-based), or None for the border."""
    best, at = 0.0, None
    for i in range(1, H.shape[0]):
        for j in range(1, H.shape[1]):
            if H[i, j] > best:
                best, at = H[i, j], (i, j)
    return at


# --------------------------------------------------------------------------------------------------
# backward_table.cu: the linear backward from the DP table


def linear_table_model(S, gap, t, g):
    """backward_kernel with SUMS: E = d score / d H from the best cell (1 there), each cell's E handed to its
    three sources by their weights (the match weight as what the others leave, at t > 0; the first maximal
    term at t = 0); per cell the gap flow e (w_up + w_left) where e != 0, and S grad_S where grad_S != 0."""
    q, n = S.shape
    H = linear_table(S, gap, t)
    grad_S, gap_flow, inner = np.zeros((q, n)), 0.0, 0.0
    best = first_best(H)
    if best is None:
        return H.max(), grad_S, [0.0], 0.0
    E = np.zeros((q + 1, n + 1))
    E[best] = 1.0
    for i in range(best[0], 0, -1):
        for j in range(best[1], 0, -1):
            e = E[i, j]
            h, s = H[i, j], S[i - 1, j - 1]
            xd, xu, xl = H[i - 1, j - 1] + s, H[i - 1, j] + gap, H[i, j - 1] + gap
            if t > 0:
                wu, wl = math.exp((xu - h) / t), math.exp((xl - h) / t)
                wd = max(1.0 - wu - wl - math.exp(-h / t), 0.0)
            else:
                t1 = h != 0 and xd == h
                t2 = h != 0 and not t1 and xu == h
                t3 = h != 0 and not t1 and not t2 and xl == h
                wd, wu, wl = float(t1), float(t2), float(t3)
            E[i - 1, j - 1] += e * wd
            E[i - 1, j] += e * wu
            E[i, j - 1] += e * wl
            grad_S[i - 1, j - 1] = g * e * wd
            if e != 0:
                gap_flow += e * (wu + wl)
            if grad_S[i - 1, j - 1] != 0:
                inner += s * grad_S[i - 1, j - 1]
    return H[best], grad_S, [0.0 if g == 0 else g * gap_flow], inner


# --------------------------------------------------------------------------------------------------
# The rows' scaled space (rows.cuh), shared by the linear and the affine model


def one_of(sig: int) -> float:
    """2^-sigma as the kernels build it from exponent bits: 0 where sigma >= 127."""
    return 2.0 ** -sig if 127 - sig > 0 else 0.0


def times_pow2(x: float, k: int) -> float:
    return x * 2.0 ** min(max(k, -252), 254)


class RowConsts:
    """RowConsts (rows.cuh) for a factor G along the row: the linear gap's, or the affine extension's."""

    def __init__(self, gap: float, t: float):
        self.c = 1.4426950408889634 / t
        self.G = 2.0 ** (gap * self.c)
        self.g1 = -math.log2(self.G) if self.G > 0 else 1e30
        self.g8 = 8 * self.g1
        self.Gpow = [self.G ** (r + 1) for r in range(COLS)]


def scan_factor(fs: float, fsig: float, d: int, k: RowConsts) -> float:
    """G^(8d) 2^(fs - fsig), capped as MASKED caps it."""
    return 2.0 ** min(fs - fsig - d * k.g8, 126.0)


def scan_right(values, sig, k):
    """The rounds of a scan left to right (row_step): each lane adds its left neighbours', d lanes away."""
    out = list(values)
    d = 1
    while d < LANES:
        prev = list(out)
        for lane in range(d, LANES):
            out[lane] = prev[lane - d] * scan_factor(sig[lane - d], sig[lane], d, k) + prev[lane]
        d *= 2
    return out


def scan_left(values, sig, k):
    """The rounds of a scan right to left (adjoint_row)."""
    out = list(values)
    d = 1
    while d < LANES:
        prev = list(out)
        for lane in range(LANES - d):
            out[lane] = prev[lane + d] * scan_factor(sig[lane], sig[lane + d], d, k) + prev[lane]
        d *= 2
    return out


def renormalise(rows, sig, valid):
    """Each lane's largest value of the row (inside the target) to [2^TOP, 2^(TOP+1)); lanes past the
    target keep 0 and their sigma. rows: the lane's arrays to scale together (the first decides)."""
    for lane in range(LANES):
        if valid[lane] == 0:
            for row in rows:
                row[lane] = [0.0] * COLS
            continue
        hi = max(rows[0][lane][:valid[lane]])
        exponent = math.frexp(hi)[1] - 1
        sig[lane] += exponent - TOP
        f = 2.0 ** (TOP - exponent)
        for row in rows:
            row[lane] = [x * f for x in row[lane]]


def lane_zeros():
    return [[0.0] * COLS for _ in range(LANES)]


def from_diagonal(below_w, lane: int, r: int) -> float:
    """w of the row below, one column right of (lane, r): from the next lane past a lane's last column."""
    if r + 1 < COLS:
        return below_w[lane][r + 1]
    return below_w[lane + 1][0] if lane + 1 < LANES else 0.0


def carries_from_right(first, sig, k):
    """What comes into each lane's last column from the lanes right of it (adjoint_row's scan of each lane's
    first value, then one lane's shift), in the lane's scale: 0 for the last lane."""
    Z = scan_left(first, sig, k)
    return [times_pow2(Z[lane + 1], sig[lane] - sig[lane + 1]) if lane + 1 < LANES else 0.0 for lane in range(LANES)]


def lane_valid(n: int):
    return [min(max(n - COLS * lane, 0), COLS) for lane in range(LANES)]


def lane_row(values, n: int):
    """A row of n values as the lanes hold it, 0 past n."""
    padded = list(values) + [0.0] * (LANES * COLS - n)
    return [padded[COLS * lane:COLS * lane + COLS] for lane in range(LANES)]


def best_in_rows(rows, valid):
    """(row, lane, column) of the first largest value over the rows (each (E, sigma)), as the forward's
    scaled keys and best_column pick it; None where nothing beats the border (E = 1 at sigma 0)."""
    best, at = 0.0, None
    for i, (E, sig) in enumerate(rows):
        for lane in range(LANES):
            for r in range(valid[lane]):
                if E[lane][r] > 0:
                    key = math.log2(E[lane][r]) + sig[lane]
                    if key > best:
                        best, at = key, (i, lane, r)
    return at


# --------------------------------------------------------------------------------------------------
# backward_rows.cu: the linear gradient by rows


def linear_row_step(U, sig, v, valid, k):
    """row_step (rows.cuh, MASKED): row i of E from row i-1, in place."""
    one = [one_of(s) for s in sig]
    x = lane_zeros()
    for lane in range(LANES):
        for r in range(COLS):
            p = 2.0 ** ((0.0 if r >= valid[lane] else v[lane][r]) * k.c)
            if r > 0:
                a = U[lane][r - 1] * p + one[lane]
            elif lane == 0:
                a = one[lane] * p + one[lane]
            else:
                a = times_pow2(U[lane - 1][COLS - 1] * p, sig[lane - 1] - sig[lane]) + one[lane]
            a = U[lane][r] * k.G + a
            x[lane][r] = x[lane][r - 1] * k.G + a if r > 0 else a
    Y = [x[lane][COLS - 1] + (k.Gpow[COLS - 1] * one[0] if lane == 0 else 0.0) for lane in range(LANES)]
    Y = scan_right(Y, sig, k)
    for lane in range(LANES):
        carry = one[0] if lane == 0 else times_pow2(Y[lane - 1], sig[lane - 1] - sig[lane])
        x[lane] = [k.Gpow[r] * carry + x[lane][r] if r < valid[lane] else 0.0 for r in range(COLS)]
    holder = [x]
    renormalise(holder, sig, valid)
    U[:] = holder[0]


def linear_rows_model(S, gap, t, g):
    """rows_forward_kernel's rows, then rows_backward_kernel with SUMS: adjoint_row over every row from the
    best cell's up (the kernel computes each band again from its kept row: the same values)."""
    q, n = S.shape
    k = RowConsts(gap, t)
    valid = lane_valid(n)
    U = [[2.0 ** TOP if r < valid[lane] else 0.0 for r in range(COLS)] for lane in range(LANES)]
    sig = [-TOP] * LANES
    rows = [([list(u) for u in U], list(sig))]  # rows[0]: the border; rows[i + 1]: row i
    for i in range(q):
        linear_row_step(U, sig, lane_row(S[i], n), valid, k)
        rows.append(([list(u) for u in U], list(sig)))
    grad_S, gaps, inner = np.zeros((q, n)), 0.0, 0.0
    best = best_in_rows(rows[1:], valid)
    if best is None:
        return 0.0, grad_S, [0.0], 0.0
    bi, blane, bcol = best
    Eb, sb = rows[bi + 1]
    score = t * math.log(2) * (math.log2(Eb[blane][bcol]) + sb[blane])
    below_A = below_w = None
    below_sig = None
    for i in range(bi, -1, -1):
        Er, sig_r = rows[i + 1]
        Eu, sig_u = rows[i]
        seed = i == bi
        one = [one_of(s) for s in sig_r]
        left = [one[0]] + [times_pow2(Er[lane - 1][COLS - 1], sig_r[lane - 1] - sig_r[lane])
                           for lane in range(1, LANES)]
        Gu = [2.0 ** min(sig_u[lane] - sig_r[lane] - k.g1, 126.0) for lane in range(LANES)]
        Gd = [0.0 if seed else 2.0 ** min(sig_r[lane] - below_sig[lane] - k.g1, 126.0) for lane in range(LANES)]
        y = lane_zeros()
        Q = lane_zeros()
        for lane in range(LANES):
            for r in range(COLS - 1, -1, -1):
                e_left = Er[lane][r - 1] if r > 0 else left[lane]
                Q[lane][r] = max(Er[lane][r] - (k.G * e_left + (Gu[lane] * Eu[lane][r] + one[lane])), 0.0)
                x = 0.0
                if r < valid[lane]:
                    if seed:
                        x = g / Er[lane][r] if (lane, r) == (blane, bcol) else 0.0
                    else:
                        x = from_diagonal(below_w, lane, r) / Er[lane][r] + Gd[lane] * below_A[lane][r]
                y[lane][r] = k.G * y[lane][r + 1] + x if r + 1 < COLS else x
        carries = carries_from_right([y[lane][0] for lane in range(LANES)], sig_r, k)
        A, w, s_row = lane_zeros(), lane_zeros(), lane_row(S[i], n)
        for lane, carry in enumerate(carries):
            for r in range(COLS):
                a = k.Gpow[COLS - 1 - r] * carry + y[lane][r] if r < valid[lane] else 0.0
                A[lane][r], w[lane][r] = a, a * Q[lane][r]
                e_left = Er[lane][r - 1] if r > 0 else left[lane]
                if a != 0:  # the gap flows into the cell: Ahat (G E_left + G 2^(sig_u - sig_r) E_up)
                    gaps += a * (k.G * e_left + Gu[lane] * Eu[lane][r])
                if w[lane][r] != 0:
                    inner += s_row[lane][r] * w[lane][r]
                if r < valid[lane]:
                    grad_S[i, COLS * lane + r] = w[lane][r]
        below_A, below_w, below_sig = A, w, sig_r
    return score, grad_S, [gaps], inner


# --------------------------------------------------------------------------------------------------
# affine_backward.cu: the affine backward from the state


def affine_adjoint_model(m, x, y, eh, exn, eyn, o, e, t, shared):
    """affine_adjoint (affine.cuh) with the gap sums: (E_M, E_X, E_Y, extension flow)."""
    c, O, E = 1 / t, math.exp(o / t), math.exp(e / t)

    def flow(adjoint, weight):
        return adjoint * weight if adjoint != 0 else 0.0

    if shared:
        r = max(0.0, m, x, y)
        e0, em, ex, ey = (math.exp((v - r) * c) for v in (0.0, m, x, y))
        s0m = e0 + em
        a = flow(eh, 1 / (s0m + ex + ey))
        bx = flow(exn, 1 / (O * (s0m + ey) + E * ex))
        by = flow(eyn, 1 / (O * (s0m + ex) + E * ey))
        extension = flow(bx, ex * E) + flow(by, ey * E)
        return (flow(em, a + O * (bx + by)), flow(ex, a + E * bx + O * by), flow(ey, a + O * bx + E * by),
                extension)

    def weights(*terms):
        mx = max(terms)
        p = [math.exp((v - mx) * c) for v in terms]
        return [v / sum(p) for v in p[1:]]

    hm, hy, hx = weights(0.0, m, y, x)
    xm, xy, xx = weights(o, m + o, y + o, x + e)
    ym, yx, yy = weights(o, m + o, x + o, y + e)
    return (flow(eh, hm) + flow(exn, xm) + flow(eyn, ym), flow(eh, hx) + flow(exn, xx) + flow(eyn, yx),
            flow(eh, hy) + flow(exn, xy) + flow(eyn, yy), flow(exn, xx) + flow(eyn, yy))


def affine_state_model(S, o, e, t, g, shared=True):
    """affine_backward_kernel with SUMS (t > 0): per cell the adjoints of M, X and Y from those of H, of X
    to the right and of Y below; into the gap states E_X + E_Y, along extension edges what affine_adjoint
    returns, and S grad_S. openings: into - extensions. affine_traceback_kernel at t = 0."""
    q, n = S.shape
    H, M, X, Y = affine_tables(S, o, e, t)
    grad_S = np.zeros((q, n))
    best = first_best(H)
    if best is None:
        return 0.0, grad_S, [0.0, 0.0], 0.0
    if t == 0:
        return affine_traceback_model(S, o, e, g, H, M, X, Y, best)
    EM, EX, EY = (np.zeros((q + 2, n + 2)) for _ in range(3))
    into = extension = inner = 0.0
    for i in range(best[0], 0, -1):
        for j in range(best[1], 0, -1):
            eh = EM[i + 1, j + 1] + (1.0 if (i, j) == best else 0.0)
            em, ex, ey, ext = affine_adjoint_model(M[i, j], X[i, j], Y[i, j], eh, EX[i, j + 1], EY[i + 1, j], o, e,
                                                   t, shared)
            EM[i, j], EX[i, j], EY[i, j] = em, ex, ey
            grad_S[i - 1, j - 1] = g * em
            into += ex + ey
            extension += ext
            if grad_S[i - 1, j - 1] != 0:
                inner += S[i - 1, j - 1] * grad_S[i - 1, j - 1]
    if g == 0:
        return H[best], grad_S, [0.0, 0.0], inner
    return H[best], grad_S, [g * (into - extension), g * extension], inner


def affine_traceback_model(S, o, e, g, H, M, X, Y, best):
    """affine_traceback_kernel with SUMS: the CPU engine's walk (start, match, Y, X), an opening or an
    extension counted at each gap step, and g S at each match."""
    q, n = S.shape
    grad_S = np.zeros((q, n))
    opens = extends = inner = 0.0
    state, (i, j) = "H", best

    def take_match():
        nonlocal i, j, inner
        grad_S[i - 1, j - 1] = g
        inner += S[i - 1, j - 1] * g
        i, j = i - 1, j - 1

    while i >= 1 and j >= 1:
        if state == "H":
            h = H[i, j]
            if h == 0:
                break
            if M[i, j] == h:
                take_match()
            elif Y[i, j] == h:
                state = "Y"
            elif X[i, j] == h:
                state = "X"
            else:
                break
        elif state == "X":
            if X[i, j] == o:
                opens += 1
                break
            if M[i, j - 1] + o == X[i, j]:
                j, state, opens = j - 1, "H", opens + 1
                take_match()
            elif Y[i, j - 1] + o == X[i, j]:
                j, state, opens = j - 1, "Y", opens + 1
            elif X[i, j - 1] + e == X[i, j]:
                j, extends = j - 1, extends + 1
            else:
                break
        else:
            if Y[i, j] == o:
                opens += 1
                break
            if M[i - 1, j] + o == Y[i, j]:
                i, state, opens = i - 1, "H", opens + 1
                take_match()
            elif Y[i - 1, j] + e == Y[i, j]:
                i, extends = i - 1, extends + 1
            elif X[i - 1, j] + o == Y[i, j]:
                i, state, opens = i - 1, "X", opens + 1
            else:
                break
    return H[best], grad_S, [g * opens, g * extends], inner


# --------------------------------------------------------------------------------------------------
# affine_backward_rows.cu: the affine gradient by rows


def affine_row_step(H, Y, sig, v, valid, k, O):
    """affine_row_step (MASKED, KEEP_MT): rows of H and Y in place; returns the row's Mt and X."""
    E = k.G
    one = [one_of(s) for s in sig]
    m = lane_zeros()
    ty = lane_zeros()
    for lane in range(LANES):
        for r in range(COLS):
            p = 2.0 ** ((0.0 if r >= valid[lane] else v[lane][r]) * k.c)
            if r > 0:
                m[lane][r] = H[lane][r - 1] * p
            elif lane == 0:
                m[lane][r] = one[lane] * p
            else:
                m[lane][r] = times_pow2(H[lane - 1][COLS - 1] * p, sig[lane - 1] - sig[lane])
            Y[lane][r] = O * H[lane][r] + (E - O) * Y[lane][r]
            ty[lane][r] = (one[lane] + m[lane][r]) + Y[lane][r]
    x = lane_zeros()
    for lane in range(LANES):
        for r in range(COLS):
            if r > 0:
                into = O * ty[lane][r - 1]
            elif lane == 0:
                into = O * one[lane]
            else:
                into = O * times_pow2(ty[lane - 1][COLS - 1], sig[lane - 1] - sig[lane])
            x[lane][r] = x[lane][r - 1] * E + into if r > 0 else into
    Z = scan_right([x[lane][COLS - 1] for lane in range(LANES)], sig, k)
    for lane in range(LANES):
        carry = 0.0 if lane == 0 else times_pow2(Z[lane - 1], sig[lane - 1] - sig[lane])
        for r in range(COLS):
            inside = r < valid[lane]
            x[lane][r] = k.Gpow[r] * carry + x[lane][r]
            H[lane][r] = x[lane][r] + ty[lane][r] if inside else 0.0
            Y[lane][r] = Y[lane][r] if inside else 0.0
            m[lane][r] = m[lane][r] if inside else 0.0
            x[lane][r] = x[lane][r] if inside else 0.0
    holder = [H, Y, m, x]
    renormalise(holder, sig, valid)
    H[:], Y[:] = holder[0], holder[1]
    return holder[2], holder[3]


def affine_rows_model(S, o, e, t, g):
    """affine_rows_forward_kernel's rows, then affine_rows_backward_kernel with SUMS: affine_adjoint_row
    over every row from the best cell's up, each cell's gap sums in its lane scale (X kept from the scan)."""
    q, n = S.shape
    k = RowConsts(e, t)  # G = E, the extension's factor
    O = 2.0 ** (o * k.c)
    o1 = -math.log2(O)
    valid = lane_valid(n)
    H = [[2.0 ** TOP if r < valid[lane] else 0.0 for r in range(COLS)] for lane in range(LANES)]
    Y = lane_zeros()
    sig = [-TOP] * LANES
    rows = []  # (H, Y, Mt, sigma, X) of each row
    for i in range(q):
        Mt, X = affine_row_step(H, Y, sig, lane_row(S[i], n), valid, k, O)
        rows.append(([list(h) for h in H], [list(y) for y in Y], Mt, list(sig), X))
    grad_S = np.zeros((q, n))
    into = extension = inner = 0.0
    best = best_in_rows([(r[0], r[3]) for r in rows], valid)
    if best is None:
        return 0.0, grad_S, [0.0, 0.0], 0.0
    bi, blane, bcol = best
    score = t * math.log(2) * (math.log2(rows[bi][0][blane][bcol]) + rows[bi][3][blane])
    below_w = below_y = below_sig = None
    E = k.G
    for i in range(bi, -1, -1):
        Hr, Yr, Mr, sig_r, Xr = rows[i]
        seed = i == bi
        Od = [0.0 if seed else 2.0 ** min(sig_r[lane] - below_sig[lane] - o1, 126.0) for lane in range(LANES)]
        Ed = [0.0 if seed else 2.0 ** min(sig_r[lane] - below_sig[lane] - k.g1, 126.0) for lane in range(LANES)]
        h = lane_zeros()
        ob = lane_zeros()
        eb = lane_zeros()
        xs = lane_zeros()
        for lane in range(LANES):
            for r in range(COLS - 1, -1, -1):
                if r < valid[lane]:
                    if seed:
                        h[lane][r] = g / Hr[lane][r] if (lane, r) == (blane, bcol) else 0.0
                    else:
                        h[lane][r] = from_diagonal(below_w, lane, r) / Hr[lane][r]
                        ob[lane][r], eb[lane][r] = Od[lane] * below_y[lane][r], Ed[lane] * below_y[lane][r]
                base = h[lane][r] + ob[lane][r]
                xs[lane][r] = E * xs[lane][r + 1] + base if r + 1 < COLS else base
        carries = carries_from_right([xs[lane][0] for lane in range(LANES)], sig_r, k)
        w, ya, s_row = lane_zeros(), lane_zeros(), lane_row(S[i], n)
        for lane, carry in enumerate(carries):
            x_right = carry
            for r in range(COLS - 1, -1, -1):
                ox = O * x_right
                a_t = h[lane][r] + ox + ob[lane][r] if r < valid[lane] else 0.0
                a_y = h[lane][r] + ox + eb[lane][r] if r < valid[lane] else 0.0
                w[lane][r], ya[lane][r] = a_t * Mr[lane][r], a_y
                a_x = k.Gpow[COLS - 1 - r] * carry + xs[lane][r]
                # the gap sums: X and Y of the cell in its lane scale, their adjoints in the inverse scale
                x_value = Xr[lane][r]
                if x_right != 0:
                    extension += x_right * E * x_value
                if eb[lane][r] != 0:
                    extension += eb[lane][r] * Yr[lane][r]
                if a_x != 0:
                    into += a_x * x_value
                if a_y != 0:
                    into += a_y * Yr[lane][r]
                if w[lane][r] != 0:
                    inner += s_row[lane][r] * w[lane][r]
                if r < valid[lane]:
                    grad_S[i, COLS * lane + r] = w[lane][r]
                x_right = a_x
        below_w, below_y, below_sig = w, ya, sig_r
    return score, grad_S, [into - extension, extension], inner


# --------------------------------------------------------------------------------------------------
# The models against the reference


def check(model_out, S, gaps, t, g, atol):
    score, grad_S, sums, inner = model_out
    ref_score, ref_dS, ref_gaps, ref_dt = reference_derivatives(S, gaps, t, g)
    assert score == pytest.approx(ref_score, abs=atol)
    np.testing.assert_allclose(grad_S, ref_dS, rtol=0, atol=atol)
    np.testing.assert_allclose(sums, ref_gaps, rtol=0, atol=atol * max(1.0, abs(g)) * S.size)
    assert inner == pytest.approx(float((S * ref_dS).sum()), abs=atol * S.size)
    if t > 0:  # the temperature's gradient as ops takes it from the sums
        grad_t = (g * score - inner - sum(gap * total for gap, total in zip(gaps, sums))) / t
        assert grad_t == pytest.approx(ref_dt, abs=atol * S.size)


def pair(seed: int, q: int, n: int, scale: float = 1.5) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(q, n)).astype(np.float32).astype(np.float64) * scale


@pytest.mark.parametrize("t", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("q, n", [(7, 9), (1, 5), (6, 1)])
def test_linear_table_model(q, n, t):
    S = pair(10 + q, q, n)
    for gap, g in ((-0.8, 1.0), (-0.3, -2.5), (0.0, 0.7)):
        check(linear_table_model(S, gap, t, g), S, (gap,), t, g, 1e-10)


@pytest.mark.parametrize("t", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("q, n", [(9, 20), (4, 70), (2, 3)])
def test_linear_rows_model(q, n, t):
    # 20 and 70 columns: lanes with columns past the target (masked); 70: values across 9 lanes' scales
    S = pair(20 + n, q, n)
    for gap, g in ((-1.0, 1.0), (-2.5, 0.3), (0.0, -1.5)):
        check(linear_rows_model(S, gap, t, g), S, (gap,), t, g, 1e-9)


def test_linear_rows_model_with_spread_scales():
    # Large scores spread the lanes' scales far apart: the conversions between them must be exact.
    S = pair(31, 6, 40, scale=12.0)
    check(linear_rows_model(S, -2.0, 0.5, 1.0), S, (-2.0,), 0.5, 1.0, 1e-8)


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "separate"])
@pytest.mark.parametrize("t", [0.3, 1.0])
def test_affine_state_model(shared, t):
    S = pair(40, 7, 8)
    for (o, e), g in (((-2.0, -0.5), 1.0), ((-1.2, -1.2), -0.6), ((-3.0, 0.0), 2.0)):
        check(affine_state_model(S, o, e, t, g, shared), S, (o, e), t, g, 1e-10)


def test_affine_traceback_model():
    S = pair(50, 8, 9, scale=2.5)
    for (o, e), g in (((-2.0, -0.5), 1.0), ((-1.0, -1.0), 1.5)):
        score, grad_S, sums, inner = affine_state_model(S, o, e, 0.0, g)
        check((score, grad_S, sums, inner), S, (o, e), 0.0, g, 1e-12)
        assert all(x == round(x / g) * g for x in sums) and sum(sums) > 0  # whole gap counts on the alignment


@pytest.mark.parametrize("t", [0.5, 1.0])
@pytest.mark.parametrize("q, n", [(8, 20), (3, 45)])
def test_affine_rows_model(q, n, t):
    S = pair(60 + n, q, n)
    for (o, e), g in (((-2.0, -0.5), 1.0), ((-1.0, -1.0), -0.8), ((-4.0, -0.2), 1.3)):
        check(affine_rows_model(S, o, e, t, g), S, (o, e), t, g, 1e-9)
