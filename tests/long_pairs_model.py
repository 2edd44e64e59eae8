"""A float64 model of the CUDA engine's tiles of long pairs (kernels/cuda/long_pairs.cu), step for step.

The kernels cut a pair's DP into tiles of `rows` rows x `lanes * lane_columns` columns, one warp a tile,
and launch the tiles of one anti-diagonal of tiles at a time; each tile reads the row above it and the
column left of it from buffers its neighbours wrote. This model runs the same plan in Python, with the
same lanes, steps, registers and buffers, so that its index arithmetic can be checked against the
reference loop on small tiles (tests/test_long_pairs_model.py) before the CUDA code, which cannot run
without a GPU, is trusted with it. Where the kernels use 32 lanes of 4 columns and tiles of 128 rows, the
tests use a few lanes of 1 to 3 columns and a few rows, so that a small pair holds many tiles.

Names follow the kernels: `up`, `up_gap`, `left_above`, `last` are a lane's registers in the forward;
`carry_up`, `carry_diag`, `right`, `flow_out` in the backward. A tile's values live in `Tile`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


DOUBLE_MAX = 1.7976931348623157e308


def exp2(x: float) -> float:
    """2^x as the device's exp2: +inf past the range, NaN for NaN."""
    try:
        return 2.0 ** x
    except OverflowError:
        return math.inf


def max_nan(a: float, b: float) -> float:
    """max.NaN: NaN if either is NaN."""
    return a if (a != a or a > b) else b


def min_nan(a: float, b: float) -> float:
    return a if (a != a or a < b) else b


def cell(diag: float, up: float, left: float, soft: bool, c: float, tl: float) -> float:
    """common.cuh's cell(): the four terms' stable logsumexp in score units, or their maximum at t = 0."""
    p, q = max_nan(0.0, diag), max_nan(up, left)
    m = max_nan(p, q)
    if not soft:
        return m
    lo1, lo2, lo3 = min_nan(0.0, diag), min_nan(up, left), min_nan(p, q)
    mf = min(m, DOUBLE_MAX) if m == m else DOUBLE_MAX  # fmin drops a NaN: m carries it below
    e = exp2((lo1 - mf) * c) + exp2((lo2 - mf) * c) + exp2((lo3 - mf) * c)
    return m + tl * math.log2(1.0 + e)


def takes(h: float, at: int, best: float, best_at: int) -> bool:
    """Whether the cell (h, at) replaces the best so far: a NaN first (the first NaN in row-major order),
    then a larger value, then among equals the first in row-major order (the border, -1, is first)."""
    if h != h:
        return best == best or at < best_at
    if best != best:
        return False
    return h > best or (h == best and at < best_at)


@dataclass(frozen=True)
class Shape:
    """The tiles: `rows` rows x `lanes` lanes of `lane_columns` columns (the kernels: 128 x 32 x 4)."""

    rows: int = 128
    lanes: int = 32
    lane_columns: int = 4

    @property
    def columns(self) -> int:
        return self.lanes * self.lane_columns

    def grid(self, M: int, N: int) -> tuple[int, int]:
        """Tile rows and tile columns of an M x N pair."""
        return -(-M // self.rows), -(-N // self.columns)


@dataclass
class Plan:
    """A call's sizes and settings, and the forward's buffers (the state a gradient keeps)."""

    shape: Shape
    B: int
    M: int
    N: int
    gap: float
    t: float
    bottom: np.ndarray  # (B, tile rows - 1, N rounded up to lane_columns): each tile row's last row of H
    right: np.ndarray   # (B, tile columns - 1, M): each tile column's last column of H

    @property
    def soft(self) -> bool:
        return self.t > 0

    @property
    def c(self) -> float:
        return LOG2E / self.t if self.t > 0 else 0.0

    @property
    def tl(self) -> float:
        return self.t * LN2


def new_plan(shape: Shape, B: int, M: int, N: int, gap: float, t: float) -> Plan:
    n_r, n_c = shape.grid(M, N)
    padded = -(-N // shape.lane_columns) * shape.lane_columns
    return Plan(shape, B, M, N, gap, t, np.full((B, max(n_r - 1, 0), padded), np.nan),
                np.full((B, max(n_c - 1, 0), M), np.nan))


def diagonal(shape: Shape, M: int, N: int, d: int) -> range:
    """The tile rows of anti-diagonal d of the batch's grid (tile column d - tile row)."""
    n_r, n_c = shape.grid(M, N)
    return range(max(0, d - (n_c - 1)), min(d, n_r - 1) + 1)


@dataclass
class Tile:
    """Where a tile stands in its pair, and the values it reads from its neighbours."""

    b: int
    tr: int
    tc: int
    r0: int
    c0: int
    height: int   # rows swept (the backward: up to the best cell's row in its tile row)
    width: int    # columns inside the target
    lanes: int    # lanes that hold columns
    top: list     # H[r0-1][c0-1+x], x in [0, columns]: the row above, its first value the corner
    left: list    # H[r0-1+x][c0-1], x in [0, height]: the column left, its first value the corner


def stage(plan: Plan, b: int, tr: int, tc: int, height: int, tn: int) -> Tile:
    """The tile's place and its row above and column left, as the kernels stage them in shared memory:
    zero on the borders of the DP, nothing read past the target."""
    shape = plan.shape
    W = shape.columns
    r0, c0 = tr * shape.rows, tc * W
    width = min(W, tn - c0)
    top = [0.0] * (W + 1)
    left = [0.0] * (height + 1)
    if tr > 0:
        for x in range(W + 1):
            j = c0 - 1 + x
            if 0 <= j < tn:
                top[x] = plan.bottom[b, tr - 1, j]
    if tc > 0:
        left[0] = top[0]  # the corner, H[r0-1][c0-1]: zero in the first tile row
        for x in range(1, height + 1):
            left[x] = plan.right[b, tc - 1, r0 + x - 1]
    lanes = -(-width // shape.lane_columns)
    return Tile(b, tr, tc, r0, c0, height, width, lanes, top, left)


def sweep(plan: Plan, S: np.ndarray, tile: Tile, tn: int, keep: bool):
    """One warp's wavefront over a tile: lane k computes row s - k of its columns at step s.

    keep=False (the forward): writes the tile's last row and last column into the plan's buffers where a
    tile of the batch's grid lies below or to the right, and returns the tile's best cell (value, row-major
    index, -1 for none above 0). keep=True (the backward's recompute): returns H of the tile's rows (the
    row above first), and at t = 0 the choice of each cell (1 match, 2 delete, 3 insert, 0 none), which
    the adjoint follows."""
    shape = plan.shape
    R, L, W = shape.lane_columns, shape.lanes, shape.columns
    n_r, n_c = shape.grid(plan.M, plan.N)
    gap, soft, c, tl = plan.gap, plan.soft, plan.c, plan.tl
    h = tile.height
    col = [tile.c0 + k * R for k in range(L)]
    valid = [min(max(tn - col[k], 0), R) for k in range(L)]
    up = [[tile.top[1 + k * R + r] for r in range(R)] for k in range(L)]
    up_gap = [[x + gap for x in up[k]] for k in range(L)]
    left_above = [tile.top[k * R] for k in range(L)]
    last = [0.0] * L
    lane_best = [[0.0] * R for _ in range(L)]
    lane_best_row = [[-1] * R for _ in range(L)]
    H = np.full((h + 1, W), np.nan)
    H[0, :] = tile.top[1:]
    choice = np.zeros((h, W), dtype=np.int8)
    for s in range(h + tile.lanes - 1):
        shuffled = list(last)  # __shfl_up_sync(last, 1): the left lane's value of the step before
        for k in range(L):
            u = s - k
            left = tile.left[min(max(u + 1, 0), h)] if k == 0 else shuffled[k - 1]
            if k < tile.lanes and 0 <= u < h:
                diag, left_gap = left_above[k], left + gap
                for r in range(R):
                    j = col[k] + r
                    v = S[tile.r0 + u, j] if j < S.shape[1] else 0.0  # the padding as it is; past N, 0
                    xd, xu, xl = diag + v, up_gap[k][r], left_gap
                    value = cell(xd, xu, xl, soft, c, tl)
                    if not soft:
                        t1 = value != 0 and xd == value
                        t2 = value != 0 and not t1 and xu == value
                        t3 = value != 0 and not t1 and not t2 and xl == value
                        choice[u, k * R + r] = 1 if t1 else 2 if t2 else 3 if t3 else 0
                    diag = up[k][r]
                    up[k][r] = value
                    left_gap = value + gap
                    up_gap[k][r] = left_gap
                    best = lane_best[k][r]
                    if best == best and not (value <= best):  # larger, or the first NaN
                        lane_best[k][r], lane_best_row[k][r] = value, u
                left_above[k] = left
                H[u + 1, k * R:(k + 1) * R] = up[k]
                if not keep and u == h - 1 and tile.tr + 1 < n_r:
                    plan.bottom[tile.b, tile.tr, col[k]:col[k] + R] = up[k]
                if not keep and k == L - 1 and tile.tc + 1 < n_c:
                    plan.right[tile.b, tile.tc, tile.r0 + u] = up[k][R - 1]
            last[k] = up[k][R - 1]
    if keep:
        return H, choice
    best, best_at = 0.0, -1
    for k in range(L):
        for r in range(valid[k]):
            if lane_best_row[k][r] >= 0:
                at = (tile.r0 + lane_best_row[k][r]) * plan.N + col[k] + r
                if takes(lane_best[k][r], at, best, best_at):
                    best, best_at = lane_best[k][r], at
    return best, best_at


def forward(S: np.ndarray, qlen, tlen, gap: float, t: float, shape: Shape):
    """(scores (B,), best_at (B,), plan): the forward's launches, one anti-diagonal of tiles at a time, then
    the reduction of the tiles' best cells."""
    B, M, N = S.shape
    plan = new_plan(shape, B, M, N, gap, t)
    n_r, n_c = shape.grid(M, N)
    tile_best = np.zeros((B, n_r, n_c))
    tile_at = np.full((B, n_r, n_c), -1, dtype=np.int64)
    for d in range(n_r + n_c - 1):
        for b in range(B):
            qn, tn = int(qlen[b]), int(tlen[b])
            for tr in diagonal(shape, M, N, d):
                tc = d - tr
                r0, c0 = tr * shape.rows, tc * shape.columns
                if r0 >= qn or c0 >= tn:
                    continue  # past this pair's end
                tile = stage(plan, b, tr, tc, min(shape.rows, qn - r0), tn)
                tile_best[b, tr, tc], tile_at[b, tr, tc] = sweep(plan, S[b], tile, tn, keep=False)
    scores = np.zeros(B)
    best_at = np.full(B, -1, dtype=np.int64)
    for b in range(B):
        rows, cols = shape.grid(int(qlen[b]), int(tlen[b]))
        best, at = 0.0, -1
        for tr in range(rows):
            for tc in range(cols):
                if takes(tile_best[b, tr, tc], int(tile_at[b, tr, tc]), best, at):
                    best, at = tile_best[b, tr, tc], int(tile_at[b, tr, tc])
        scores[b], best_at[b] = best, at
    return scores, best_at, plan


def swept(shape: Shape, N: int, qn: int, tn: int, best_at: int) -> tuple[int, int]:
    """The rows and columns of a pair the backward's tiles write: up to the best cell's row, and up to the
    end of its tile column (none where the score is the border)."""
    if best_at < 0 or qn == 0 or tn == 0:
        return 0, 0
    bi, bj = divmod(best_at, N)
    return bi + 1, min(tn, (bj // shape.columns + 1) * shape.columns)


def backward(S: np.ndarray, qlen, tlen, grad, plan: Plan, best_at) -> np.ndarray:
    """d (sum of grad * scores) / d S: the zeroing pass, then the tiles in reverse anti-diagonal order, each
    sweeping its rows again from its stored neighbours and running the adjoint over them."""
    shape = plan.shape
    B, M, N = S.shape
    n_r, n_c = shape.grid(M, N)
    padded = plan.bottom.shape[2]
    out = np.full((B, M, N), np.nan)  # every element must be written
    # The adjoint flows a tile hands on: into the column left of it (by row), and out of its first row
    # upwards and up-left (by column).
    flow_left = np.full((B, max(n_c - 1, 0), M), np.nan)
    flow_up = np.full((B, max(n_r - 1, 0), padded), np.nan)
    flow_diag = np.full((B, max(n_r - 1, 0), padded), np.nan)
    for b in range(B):
        rows, cols = swept(shape, N, int(qlen[b]), int(tlen[b]), int(best_at[b]))
        for i in range(M):
            out[b, i, (cols if i < rows else 0):] = 0.0
    for d in reversed(range(n_r + n_c - 1)):
        for b in range(B):
            for tr in diagonal(shape, M, N, d):
                adjoint_tile(plan, S, b, tr, d - tr, int(qlen[b]), int(tlen[b]), float(grad[b]), int(best_at[b]),
                             out, flow_left, flow_up, flow_diag)
    return out


def adjoint_tile(plan: Plan, S, b, tr, tc, qn, tn, grad, best_at, out, flow_left, flow_up, flow_diag) -> None:
    shape = plan.shape
    R, L, W, TH = shape.lane_columns, shape.lanes, shape.columns, shape.rows
    N = plan.N
    if best_at < 0 or qn == 0 or tn == 0:
        return
    bi, bj = divmod(best_at, N)
    tr_best, tc_best = bi // TH, bj // W
    if tr > tr_best or tc > tc_best:
        return  # nothing flows below or right of the best cell
    r0 = tr * TH
    r1 = bi + 1 if tr == tr_best else min(r0 + TH, qn)
    tile = stage(plan, b, tr, tc, r1 - r0, tn)
    H, choice = sweep(plan, S[b], tile, tn, keep=True)
    h, c0 = tile.height, tile.c0
    gap, soft, c = plan.gap, plan.soft, plan.c
    col = [c0 + k * R for k in range(L)]
    valid = [min(max(tn - col[k], 0), R) for k in range(L)]
    carry_up = [[0.0] * R for _ in range(L)]
    carry_diag = [[0.0] * R for _ in range(L)]
    for k in range(L):
        for r in range(valid[k]):
            if tr < tr_best:
                carry_up[k][r] = flow_up[b, tr, col[k] + r]
                carry_diag[k][r] = flow_diag[b, tr, col[k] + r]
            if tr == tr_best and tc == tc_best and col[k] + r == bj:
                carry_up[k][r] = 1.0  # the best cell's own adjoint, as if from below
    right_in = [flow_left[b, tc, r0 + u] if tc < tc_best else 0.0 for u in range(h)]
    flow_out = [0.0] * L
    for s in range(h + tile.lanes - 1):
        shuffled = list(flow_out)  # __shfl_down_sync(flow_out, 1)
        for k in range(L):
            rank = tile.lanes - 1 - k  # the rightmost lane leads
            u = h - 1 - (s - rank)
            if rank < 0 or not 0 <= u < h:
                continue
            right = right_in[u] if k == tile.lanes - 1 else shuffled[k + 1]
            left = tile.left[u + 1] if k == 0 else H[u + 1, k * R - 1]
            for r in reversed(range(valid[k])):
                e = right + carry_up[k][r]
                if soft:
                    value = H[u + 1, k * R + r]
                    xu = H[u, k * R + r] + gap
                    xl = (H[u + 1, k * R + r - 1] if r > 0 else left) + gap
                    wu = exp2((xu - value) * c)
                    wl = exp2((xl - value) * c)
                    wd = max_nan(1.0 - wu - wl - exp2(-value * c), 0.0)
                else:
                    code = choice[u, k * R + r]
                    wd, wu, wl = float(code == 1), float(code == 2), float(code == 3)
                diag_flow = e * wd
                out[b, tile.r0 + u, col[k] + r] = grad * diag_flow
                right = e * wl + carry_diag[k][r]
                carry_diag[k][r] = diag_flow
                carry_up[k][r] = e * wu
            flow_out[k] = right
            if k == 0 and tc > 0:
                flow_left[b, tc - 1, tile.r0 + u] = right
            if u == 0 and tr > 0:
                for r in range(valid[k]):
                    flow_up[b, tr - 1, col[k] + r] = carry_up[k][r]
                    flow_diag[b, tr - 1, col[k] + r] = carry_diag[k][r]
