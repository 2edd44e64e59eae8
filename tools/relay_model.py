"""Model of forward_tiles with the Relay handoff (kernels/sw_cuda.cu): W warps, random interleaving of their
steps, checked against the reference. Run: PYTHONPATH=. python3 tools/relay_model.py (a minute or two)."""
import math, random
import torch
from swcli.reference import soft_smith_waterman_reference

WARP, R = 32, 4
TILE = WARP * R

def cell(d, u, l, t):
    xs = [0.0, d, u, l]
    if t == 0: return max(xs)
    m = max(xs); return m + t * math.log(sum(math.exp((x - m) / t) for x in xs))

class Relay:
    def __init__(s, W, M, qn):
        s.W, s.qn = W, qn
        s.buf = [[float("nan")] * M for _ in range(W + 1)]
        s.done = [0] * W
    def source(s, tile): return s.buf[(tile - 1) % (s.W + 1)]
    def sink(s, tile): return s.buf[tile % (s.W + 1)]
    def ready(s, tile, rows):
        return s.done[(tile - 1) % s.W] >= ((tile - 1) // s.W) * s.qn + rows
    def publish(s, tile, rows):
        new = (tile // s.W) * s.qn + rows
        assert new >= s.done[tile % s.W]
        s.done[tile % s.W] = new

def warp_program(S, qn, tn, gap, t, relay, first, stride, N):
    """A generator: yields ('wait', tile, rows) before a read that needs rows, else None per step."""
    tiles = (tn + TILE - 1) // TILE
    best = 0.0
    for tile in range(first, tiles, stride):
        c0 = tile * TILE
        width = min(TILE, tn - c0); lanes = (width + R - 1) // R
        has_next = tile + 1 < tiles
        up = [[0.0] * R for _ in range(WARP)]; left_above = [0.0] * WARP; last = [0.0] * WARP
        src = relay.source(tile) if tile > 0 else None
        dst = relay.sink(tile) if has_next else None
        chunk = [0.0] * WARP; chunk_next = [0.0] * WARP
        if tile > 0:
            rows = min(qn, 2 * WARP)
            while not relay.ready(tile, rows): yield "blocked"
            chunk = [src[k] if k < qn else 0.0 for k in range(WARP)]
            chunk_next = [src[WARP + k] if WARP + k < qn else 0.0 for k in range(WARP)]
        for s in range(qn + lanes - 1):
            left = [0.0] + [last[k - 1] for k in range(1, WARP)]
            if tile > 0:
                if s % WARP == 0 and s > 0:
                    chunk = chunk_next
                    rows = min(qn, s + 2 * WARP)
                    while not relay.ready(tile, rows): yield "blocked"
                    chunk_next = [src[s + WARP + k] if s + WARP + k < qn else 0.0 for k in range(WARP)]
                left[0] = chunk[s % WARP]
            else:
                left[0] = 0.0
            for k in range(WARP):
                i = s - k
                col = c0 + k * R
                if 0 <= i < qn and k < lanes:
                    diag, h = left_above[k], left[k]
                    for r in range(R):
                        above = up[k][r]
                        v = float(S[i, col + r]) if col + r < N else 0.0
                        h = cell(diag + v, above + gap, h + gap, t)
                        up[k][r] = h; diag = above
                        if col + r < tn:
                            assert not math.isnan(h), ("NaN in a live cell", tile, i, col + r)
                            best = max(best, h)
                    left_above[k] = left[k]
                    if has_next and k == WARP - 1:
                        dst[i] = up[k][R - 1]
                        if (i + 1) % WARP == 0 or i + 1 == qn: relay.publish(tile, i + 1)
                last[k] = up[k][R - 1]
            yield "step"
    yield ("best", best)

def run(S, qn, tn, gap, t, W, seed):
    M, N = S.shape
    relay = Relay(W, M, qn)
    progs = [warp_program(S, qn, tn, gap, t, relay, w, W, N) for w in range(W)]
    bests, live = {}, set(range(W))
    rng = random.Random(seed)
    stuck = 0
    while live:
        w = rng.choice(sorted(live))
        out = next(progs[w])
        if isinstance(out, tuple): bests[w] = out[1]; live.discard(w)
        stuck = stuck + 1 if out == "blocked" else 0
        assert stuck < 10000, "deadlock"
    return max(bests.values())

rng = random.Random(1)
for case, (M, N, W) in enumerate([(70, 700, 8), (200, 1100, 8), (33, 300, 8), (130, 1300, 3), (64, 129, 8), (1, 900, 8),
                                     (70, 2700, 16), (40, 4200, 16)]):
    for t in (0.0, 1.0):
        S = torch.randn(M, N, dtype=torch.float64)
        qn, tn = rng.randint(max(1, M // 2), M), rng.randint(N // 2, N)
        got = run(S.numpy(), qn, tn, -1.0, t, W, seed=case)
        ref = soft_smith_waterman_reference(S[None], -1.0, t, torch.tensor([qn]), torch.tensor([tn])).item()
        print(M, N, W, qn, tn, t, round(got, 9), round(ref, 9), "OK" if abs(got - ref) < 1e-9 else "MISMATCH", flush=True)
