"""The soft search kernel's algorithm (kernels/cuda/search_soft.cu, search.SoftSearch) on the CPU: its
NumPy model (swcli.testing.soft_search_model, the same cells, scales, checks and padding) against the
float64 reference loop, the settings that take the kernel, and the search's handling of flagged pairs."""

from __future__ import annotations

import math
import random
from functools import partial

import numpy as np
import pytest
import torch

from swcli import database
from swcli.errors import SwcliError
from swcli.fasta import FastaRecord
from swcli.ops import load_engine, score_checked_codes
from swcli.reference import soft_smith_waterman_affine_reference, soft_smith_waterman_reference
from swcli.scoring import load_matrix
from swcli.search import SearchKernel, Searcher, SoftSearch
from swcli.testing import (encoded, padded_encoded, random_protein, related_protein_pairs, soft_search_model,
                           soft_segment_cells)

BLOSUM62 = load_matrix("BLOSUM62")
LINEAR = {"gap": -4.0, "gap_open": None, "gap_extend": None}
AFFINE = {"gap": None, "gap_open": -11.0, "gap_extend": -1.0}


codes = partial(encoded, BLOSUM62)
padded = partial(padded_encoded, BLOSUM62)


def reference_scores(query: str, sequences: list[str], gaps: dict, t: float) -> np.ndarray:
    block, lengths = padded(sequences)
    S = BLOSUM62.tensor().double()[torch.from_numpy(codes(query))[None, :, None], torch.from_numpy(block)[:, None, :]]
    if gaps["gap"] is not None:
        return soft_smith_waterman_reference(S, gaps["gap"], t, None, torch.from_numpy(lengths)).numpy()
    return soft_smith_waterman_affine_reference(S, gaps["gap_open"], gaps["gap_extend"], t, None,
                                                torch.from_numpy(lengths)).numpy()


def sample(seed: int) -> tuple[str, list[str]]:
    """A query and targets: empty, one letter, random, the query's pieces and a mutated copy of it."""
    rng = random.Random(seed)
    query, relative = related_protein_pairs(seed, 1, 30, 45)[0]
    return query, ["", "W", random_protein(rng, 1), random_protein(rng, 17), random_protein(rng, 40), relative,
                   query[3:20], query]


@pytest.mark.parametrize("gaps", [LINEAR, AFFINE], ids=["linear", "affine"])
@pytest.mark.parametrize("t", [1.0, 2.0])
def test_the_model_equals_the_float64_reference(gaps, t):
    query, sequences = sample(1 if gaps is LINEAR else 2)
    plan = SoftSearch.plan(BLOSUM62.tensor(), t, **gaps)
    block, lengths = padded(sequences, junk=5)
    scores, flagged = soft_search_model(codes(query), block, lengths, plan)
    expected = reference_scores(query, sequences, gaps, t)
    assert not flagged.any()
    np.testing.assert_allclose(scores, expected, rtol=2e-6, atol=1e-7)
    assert scores[0] == 0.0  # an empty target


def test_a_one_letter_query_and_an_empty_query():
    plan = SoftSearch.plan(BLOSUM62.tensor(), 1.0, **LINEAR)
    sequences = ["", "W", "AWA", "MKV"]
    block, lengths = padded(sequences)
    scores, flagged = soft_search_model(codes("W"), block, lengths, plan)
    np.testing.assert_allclose(scores, reference_scores("W", sequences, LINEAR, 1.0), rtol=2e-6)
    assert not flagged.any()
    empty, flagged = soft_search_model(codes(""), block, lengths, plan)
    assert empty.tolist() == [0.0] * 4 and not flagged.any()


@pytest.mark.parametrize("gaps", [LINEAR, AFFINE], ids=["linear", "affine"])
@pytest.mark.parametrize("change, counted", [(dict(upper=30, middle=20, floor=126), "rescalings"),
                                             (dict(floor=30), "rises")], ids=["low-upper", "low-floor"])
def test_rescaling_often_keeps_the_scores(gaps, change, counted):
    """With a low upper exponent every segment of a strong alignment is rescaled down again and again (the
    floor, whose budget that cuts, set aside: its own test is below); with a floor of 2^-30 (the plan's is
    2^-84) the strong pairs' segments pass sigma > F, and those whose first cell nears the floor are
    rescaled up to 2^T rather than flagged. The scores stay the float64 ones: the rescaling is exact."""
    query, sequences = sample(3)
    plan = dict(SoftSearch.plan(BLOSUM62.tensor(), 1.0, **gaps), **change)
    block, lengths = padded(sequences)
    counts = {}
    scores, flagged = soft_search_model(codes(query), block, lengths, plan, counts)
    assert counts[counted] > 10
    assert not flagged.any()
    np.testing.assert_allclose(scores, reference_scores(query, sequences, gaps, 1.0), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("gaps", [LINEAR, AFFINE], ids=["linear", "affine"])
@pytest.mark.parametrize("t", [0.8, 1.0, 2.0])
def test_each_cell_is_at_least_the_chain_factor_times_the_cell_to_its_left(gaps, t):
    """The floor's one test of a segment's first cell rests on each cell being at least C times the cell to
    its left, C = G (1 - 2^-24); affine O (1 - 2^-24), through X~, which is at least H as E >= O: the
    model's cells (the kernel's operations) from random rows above, inputs, letters and scales."""
    plan = SoftSearch.plan(BLOSUM62.tensor(), t, **gaps)
    rng = np.random.default_rng(8)
    B = 4000

    def values(shape):  # positive floats over 2^-100 to 2^100, and some exact 1s
        x = np.ldexp(rng.uniform(1, 2, shape), rng.integers(-100, 100, shape)).astype(np.float32)
        return np.where(rng.random(shape) < 0.1, np.float32(1), x)

    powers = plan["powers"][rng.integers(0, 24, (B, 8)), rng.integers(0, 24, (B, 8))]
    one = np.ldexp(np.float32(1), -rng.integers(0, 100, B)).astype(np.float32)
    cells, _, _ = soft_segment_cells(values((B, 8)), values((B, 8)), values(B), values(B), values(B), powers, one,
                                     plan)
    chain = np.float32(plan["gap_factor"]) * (1 - 2.0 ** -24)
    assert (cells[:, 1:] >= chain * cells[:, :-1].astype(np.float64)).all()


def test_cells_under_the_floor_flag_the_pair():
    """A floor of 2^-0 with values scaled far down: a self-alignment's segments pass sigma > F with cells
    under 1, and the pair is flagged; an empty target and a weak pair are not."""
    query = related_protein_pairs(4, 1, 40, 40)[0][0]
    plan = SoftSearch.plan(BLOSUM62.tensor(), 1.0, **LINEAR)
    strict = dict(plan, upper=30, middle=20, floor=0)
    block, lengths = padded([query, "", "G"])
    _, flagged = soft_search_model(codes(query), block, lengths, strict)
    assert flagged.tolist() == [True, False, False]


def test_a_best_cell_under_the_padding_bound_is_flagged():
    """The bound is the padded cells' limit: a pair whose best cell is not above it is flagged (here a
    bound raised on purpose: the weak pairs)."""
    plan = SoftSearch.plan(BLOSUM62.tensor(), 1.0, **LINEAR)
    sequences = ["W", "G", "WWWW", ""]
    block, lengths = padded(sequences, width=40)
    raised = dict(plan, bound=float(np.float32(2.0 ** (3.0 / math.log(2)))))  # E of a score of 3 at t = 1
    scores, flagged = soft_search_model(codes("W"), block, lengths, raised)
    expected = reference_scores("W", sequences, LINEAR, 1.0)
    assert flagged.tolist() == [e <= 3.0 for e in expected[:3]] + [False]
    np.testing.assert_allclose(scores[~flagged], expected[~flagged], rtol=2e-6)


@pytest.mark.parametrize("gaps", [LINEAR, AFFINE, {"gap": -1.0, "gap_open": None, "gap_extend": None}],
                         ids=["linear", "affine", "gap-1"])
def test_padding_never_raises_a_score_above_the_bound(gaps):
    """Targets of a few letters in a block 100 columns wide (a sea of padding) against the same targets
    without it: the scores above the bound are the same and are the reference's; at gap -1 (G = 0.37,
    bound 3.8) weak pairs are flagged, never wrong."""
    plan = SoftSearch.plan(BLOSUM62.tensor(), 1.0, **gaps)
    rng = random.Random(5)
    query = random_protein(rng, 25)
    sequences = [random_protein(rng, n) for n in (1, 1, 2, 3, 5, 8, 9)] + ["W", "WC"]
    narrow, flags_narrow = soft_search_model(codes(query), *padded(sequences), plan)
    wide, flags_wide = soft_search_model(codes(query), *padded(sequences, width=100, junk=3), plan)
    assert flags_wide.tolist() == flags_narrow.tolist()
    np.testing.assert_array_equal(wide[~flags_wide], narrow[~flags_narrow])
    expected = reference_scores(query, sequences, gaps, 1.0)
    np.testing.assert_allclose(wide[~flags_wide], expected[~flags_wide], rtol=2e-6, atol=1e-7)
    assert all(math.exp(e) <= plan["bound"] * 1.001 for e in expected[flags_wide])


def test_which_settings_take_the_kernel():
    S = BLOSUM62.tensor()
    for taken in [(1.0, LINEAR), (1.0, AFFINE), (2.0, LINEAR), (0.9, LINEAR), (0.8, AFFINE), (3.0, AFFINE),
                  (1.0, {"gap": -1.0, "gap_open": None, "gap_extend": None})]:
        assert SoftSearch.plan(S, taken[0], **taken[1]) is not None, taken
    refused = [
        (0.0, LINEAR),  # t = 0: the exact kernel's
        (0.5, LINEAR),  # a strong alignment spreads 8 cells past the floor: every such pair would be flagged
        (0.5, AFFINE),
        (1.0, {"gap": -0.5, "gap_open": None, "gap_extend": None}),  # 2G past 0.9: padding could grow
        (10.0, LINEAR),
        (5.0, AFFINE),  # O + E past 0.9
        (1.0, {"gap": 1.0, "gap_open": None, "gap_extend": None}),  # the general path's checks say what is wrong
        (1.0, {"gap": None, "gap_open": -1.0, "gap_extend": -11.0}),
        (float("inf"), LINEAR),
    ]
    for t, gaps in refused:
        assert SoftSearch.plan(S, t, **gaps) is None, (t, gaps)
    assert SoftSearch.plan(S * 4, 1.0, **LINEAR) is None  # P up to 2^63: no room for a step's growth
    nan = S.clone()
    nan[0, 0] = float("nan")
    assert SoftSearch.plan(nan, 1.0, **LINEAR) is None
    assert SoftSearch.plan(torch.zeros(60, 60), 1.0, **LINEAR) is None  # too many letters for the rings
    forbidden = S.clone()
    forbidden[0, 1] = float("-inf")  # P = 0: a pair that cannot align, as the padding
    assert SoftSearch.plan(forbidden, 1.0, **LINEAR)["powers"][0, 1] == 0.0
    assert SoftSearch.of(S, 1.0, **LINEAR) is None  # a CPU matrix: the kernel is CUDA's


def test_the_settings_keep_a_steps_growth_and_the_floor_in_range():
    """U: a cell is at most the growth factor times its segment's largest value or input, which must stay
    under 2^127 from 2^U; for affine gaps X~ and Y~ reach 2^(-o c) above H. F: a flushed term times the
    largest P stays 2^-26 under 2^-F."""
    S = BLOSUM62.tensor()
    c = math.log2(math.e)
    linear = SoftSearch.plan(S, 1.0, **LINEAR)
    largest = 2.0 ** (11 * c)
    g = 2.0 ** (-4 * c)
    assert (1 + largest + g) / (1 - g) + 1 <= 2.0 ** (127 - linear["upper"] - 1)
    assert 2.0 ** (-126) * largest <= 2.0 ** (-26 - linear["floor"])
    assert linear["middle"] == linear["upper"] - SoftSearch.DROP
    assert linear["bound"] >= 1 / (1 - 2 * g)
    affine = SoftSearch.plan(S, 1.0, **AFFINE)
    assert affine["upper"] + math.ceil(11 * c) < linear["upper"] + 1
    assert affine["gap_factor"] == np.float32(2.0 ** (-11 * c))
    assert affine["extend_factor"] == np.float32(2.0 ** (-c) - 2.0 ** (-11 * c))


def small_database(sequences: list[str]):
    return database.build([FastaRecord("db.fa", k + 1, f"s{k}", s) for k, s in enumerate(sequences)], BLOSUM62,
                          "db.fa")


class FlaggingKernel(SearchKernel):
    """A search kernel's stand-in on the CPU: the CPU engine's scores, with the pairs `flag` chooses set to
    -1 and counted, as the CUDA kernels return them."""

    def __init__(self, searcher: Searcher, flag):
        self.searcher, self.flag = searcher, flag

    def scores(self, query, block):
        s = self.searcher
        scores = score_checked_codes(query.expand(block.codes.shape[0], -1), block.codes, s.matrix, s.gap,
                                     s.temperature, None, block.lengths, s.backend)
        flagged = self.flag(block)
        return torch.where(flagged, -1.0, scores), flagged.sum().reshape(1).to(torch.int32)


def test_flagged_pairs_are_scored_again_and_only_their_blocks(monkeypatch):
    """The flagged pairs get the general op's scores, the hits are the search's without a kernel, the
    blocks' counts are read once per query, and blocks without flagged pairs are not scored again."""
    rng = random.Random(6)
    sequences = [random_protein(rng, rng.randint(5, 60)) for _ in range(90)]
    query = BLOSUM62.encode(sequences[7][5:40], lambda: "query")
    db = small_database(sequences)
    load_engine("cpu")
    plain = Searcher(db, BLOSUM62.tensor(), -4.0, 1.0, 12, "cpu", "cpu", max_cells=600)
    searcher = Searcher(db, BLOSUM62.tensor(), -4.0, 1.0, 12, "cpu", "cpu", max_cells=600)
    first_block = len(next(iter(searcher.blocks())).lengths)
    searcher.kernel = FlaggingKernel(searcher, lambda block: block.lengths % 3 == 0 if len(block.lengths) ==
                                     first_block else torch.zeros_like(block.lengths, dtype=torch.bool))
    calls = []
    original = score_checked_codes

    def counted(*args, **kwargs):
        calls.append(len(args[1]))
        return original(*args, **kwargs)

    monkeypatch.setattr("swcli.search.score_checked_codes", counted)
    expected = plain.best(query)
    found = searcher.best(query)
    flagged = int((next(iter(searcher.blocks())).lengths % 3 == 0).sum())
    assert searcher.rescored == flagged > 0
    assert len(calls) == len(searcher.bounds) + 1 and calls[-1] == flagged  # the kernel's, then one block again
    assert torch.equal(found.targets, expected.targets)
    torch.testing.assert_close(found.scores, expected.scores)


def test_the_codes_check_reads_the_span_scored_alone():
    """A code past the matrix is refused, but only within the residues a searcher scores (a shard's)."""
    db = small_database(["MKV", "ACDEF", "WW", "GAV"])
    codes_with_junk = np.asarray(db.codes).copy()
    bad = int(db.offsets[1])  # a residue of the second sequence in length order
    codes_with_junk[bad] = len(BLOSUM62.alphabet)
    db = database.Database(codes_with_junk, db.offsets, db.index, db.ids, db.alphabet, "db.fa")
    searcher = Searcher(db, BLOSUM62.tensor(), -4.0, 1.0, 3, "cpu", "cpu")
    with pytest.raises(SwcliError, match="past the 24-letter matrix"):
        searcher.check_codes(db, None, 0, db.residues)
    with pytest.raises(SwcliError, match="past the 24-letter matrix"):
        searcher.check_codes(db, torch.from_numpy(codes_with_junk), 0, db.residues)
    searcher.check_codes(db, None, 0, bad)  # the span before it
    searcher.check_codes(db, None, bad + 1, db.residues)


# --------------------------------------------------------------------------------------------------
# The kernel's warp layout, emulated lane by lane


def emulate_warps(query: np.ndarray, targets: np.ndarray, lengths: np.ndarray, plan: dict, G: int, R: int):
    """search_soft_kernel's indexing, step by step for each warp: groups of G lanes staggered so that lane l
    is on row k - l, the profile's ring (two chunks of 32 rows written every 32 steps, read at slot
    (k mod 64) + 31 - l, with its mirror), the left neighbour by a shuffle within the group, the edge
    buffer read a row ahead, tiles of G R columns, groups past the batch. The cells are the model's
    arithmetic (swcli.testing's helpers); what this checks is where each value comes from."""
    from swcli.testing import (_exponent, _pow2, _scaled_key, _times_pow2, soft_landing, soft_rises,
                               soft_segment_cells)

    M, (B, N) = len(query), targets.shape
    K = plan["powers"].shape[0]
    S8 = SoftSearch.SEGMENT
    segs, W, per_warp = R // S8, G * R, 32 // G
    table = plan["powers"]
    padded_table = np.concatenate([table, np.zeros((K, 1), np.float32)], 1)
    upper = _pow2(plan["upper"])
    landing = soft_landing(plan)
    scores, flags = np.zeros(B), np.zeros(B, bool)
    lanes = np.arange(32)
    for warp in range(-(-B // per_warp)):
        group = warp * per_warp + lanes // G
        b = np.minimum(group, B - 1)
        g = lanes % G
        length = lengths[b]
        tiles = int(((length + W - 1) // W).max())
        edge_x = np.ones((per_warp * 32, M), np.float32)  # by group in the warp, then row: (x, xt, sigma)
        edge_xt = np.ones((per_warp * 32, M), np.float32)
        edge_sig = np.zeros((per_warp * 32, M), np.int64)
        best_key = np.full(32, _scaled_key(0, np.float32(1)), np.int64)
        failed = np.zeros(32, bool)
        ring = np.zeros((K + 1, 96), np.float32)
        for tile in range(tiles):
            c0 = tile * W + g * R
            cols = c0[:, None] + np.arange(R)[None, :]
            letter = np.where(cols < length[:, None], targets[b[:, None], np.minimum(cols, N - 1)], K)
            inside = length - c0
            up = np.ones((32, R), np.float32)
            yt = np.ones((32, R), np.float32)
            sig = np.zeros((32, segs), np.int64)
            one, diag = np.ones((32, segs), np.float32), np.ones((32, segs), np.float32)
            best = np.zeros((32, segs), np.float32)
            x_send, xt_send, sig_send = np.ones(32, np.float32), np.ones(32, np.float32), np.zeros(32, np.int64)
            reads, writes = (tile > 0) & (g == 0), (tile + 1 < tiles) & (g == G - 1)
            local = lanes // G  # the group's place in the warp (its edge rows)

            def rescale(rows, s, shift):
                nonlocal best_key, failed
                failed |= rows & ~(best[:, s] <= np.finfo(np.float32).max)
                best_key = np.where(rows & (best[:, s] > 0), np.maximum(best_key, _scaled_key(sig[:, s], best[:, s])),
                                    best_key)
                best[:, s] = np.where(rows, 0, best[:, s])
                sig[:, s] = np.where(rows, sig[:, s] + shift, sig[:, s])
                for arr in (up, yt):
                    arr[:, s * S8:(s + 1) * S8] = np.where(rows[:, None], _times_pow2(arr[:, s * S8:(s + 1) * S8],
                                                                                      -shift[:, None]),
                                                           arr[:, s * S8:(s + 1) * S8])
                diag[:, s] = np.where(rows, _times_pow2(diag[:, s], -shift), diag[:, s])
                one[:, s] = np.where(sig[:, s] <= 126, _pow2(-sig[:, s]), 0)

            for k in range(M + 31):
                if k % 32 == 0:  # fill_chunk
                    row = ((k // 32) % 2) * 32 + lanes
                    for lane in range(32):
                        j = k + lane
                        q = query[j] if j < M else 0
                        ring[:K, row[lane] + 31] = table[q]
                        if row[lane] > 32:
                            ring[:K, row[lane] + 31 - 64] = table[q]
                i = k - lanes
                # the shuffle up within the group (its first lane keeps its own: the edge or the border replaces it)
                left = np.where(g > 0, lanes - 1, lanes)
                x_in, xt_in, sig_in = x_send[left].copy(), xt_send[left].copy(), sig_send[left].copy()
                valid_row = (i >= 0) & (i < M)
                first = g == 0
                from_edge = first & reads & valid_row
                x_in = np.where(first, 1, x_in).astype(np.float32)
                xt_in = np.where(first, 1, xt_in).astype(np.float32)
                sig_in = np.where(first, 0, sig_in)
                rows = np.clip(i, 0, M - 1)
                x_in = np.where(from_edge, edge_x[local, rows], x_in)
                xt_in = np.where(from_edge, edge_xt[local, rows], xt_in)
                sig_in = np.where(from_edge, edge_sig[local, rows], sig_in)
                P = ring[letter, (k % 64) + 31 - lanes[:, None]]  # the slot a lane reads, for each of its columns
                on = valid_row
                # every lane on a row reads its row's powers for its columns' letters (the padding's: 0)
                assert np.array_equal(P[on], padded_table[query[i[on]][:, None], letter[on]])
                x_last, xt_last, sig_last = x_in, xt_in, sig_in
                for s in range(segs):
                    delta = sig_last - sig[:, s]
                    lv, xt = _times_pow2(x_last, delta), _times_pow2(xt_last, delta)
                    over = on & ~(lv <= upper)
                    if over.any():
                        shift = np.where(over, _exponent(x_last) + delta - landing, 0)
                        rescale(over, s, shift)
                        delta = sig_last - sig[:, s]
                        lv = np.where(over, _times_pow2(x_last, delta), lv)
                        xt = np.where(over, _times_pow2(xt_last, delta), xt)
                    part = slice(s * S8, (s + 1) * S8)
                    cells, below, xt = soft_segment_cells(up[:, part], yt[:, part], diag[:, s], lv, xt, P[:, part],
                                                          one[:, s], plan)
                    up[:, part] = np.where(on[:, None], cells, up[:, part])
                    yt[:, part] = np.where(on[:, None], below, yt[:, part])
                    hi = np.max(up[:, s * S8:(s + 1) * S8], 1)
                    best[:, s] = np.where(on, np.maximum(best[:, s], hi), best[:, s])
                    diag[:, s] = np.where(on, lv, diag[:, s])
                    x_last, xt_last, sig_last = up[:, s * S8 + S8 - 1].copy(), xt, sig[:, s].copy()
                x_send = np.where(on, x_last, x_send).astype(np.float32)
                xt_send = np.where(on, xt_last, xt_send).astype(np.float32)
                sig_send = np.where(on, sig_last, sig_send)
                w_rows = on & writes
                edge_x[local[w_rows], i[w_rows]] = x_send[w_rows]
                edge_xt[local[w_rows], i[w_rows]] = xt_send[w_rows]
                edge_sig[local[w_rows], i[w_rows]] = sig_send[w_rows]
                for s in range(segs):
                    deep = on & (sig[:, s] > plan["floor"])
                    cells = up[:, s * S8:(s + 1) * S8]
                    mask = s * S8 + np.arange(S8)[None, :] < inside[:, None]
                    lo = np.min(np.where(mask, cells, np.inf), 1)
                    failed |= deep & ~(lo >= 2.0 ** -plan["floor"])
                for s in range(segs):
                    hi = np.max(up[:, s * S8:(s + 1) * S8], 1)
                    need = on & ((hi > upper) | soft_rises(hi, up[:, s * S8], sig[:, s], plan))
                    if need.any():
                        rescale(need, s, np.where(need, np.maximum(_exponent(hi) - plan["middle"], -sig[:, s]), 0))
            for s in range(segs):
                failed |= ~(best[:, s] <= np.finfo(np.float32).max)
                best_key = np.where(best[:, s] > 0, np.maximum(best_key, _scaled_key(sig[:, s], best[:, s])), best_key)
        for w in range(per_warp):
            members = lanes // G == w
            if warp * per_warp + w >= B:
                continue
            key, bad = best_key[members].max(), failed[members].any()
            n = warp * per_warp + w
            flags[n] = lengths[n] > 0 and (bad or key <= _scaled_key(0, np.float32(plan["bound"])))
            mantissa = np.int32((int(key) & 0x7FFFFF) | 0x3F800000).view(np.float32)
            scores[n] = (plan["temperature"] * math.log(2) * ((int(key) >> 23) - 127 + math.log2(float(mantissa)))
                         if lengths[n] > 0 else 0.0)
    return scores, flags


@pytest.mark.parametrize("G, R", [(8, 8), (8, 16), (16, 8), (32, 8)])
@pytest.mark.parametrize("gaps", [LINEAR, AFFINE], ids=["linear", "affine"])
def test_the_warp_layout_computes_the_models_scores(G, R, gaps):
    """Several tiles, groups past the batch, query rows across three chunks of the ring, lengths 0 and 1:
    the emulated warps give the model's scores and flags, bit for bit; with the settings that rescale
    often and flag (a floor of 2^0) too."""
    rng = random.Random(G * 100 + R)
    query, relative = related_protein_pairs(G + R, 1, 70, 70)[0]
    sequences = [relative, "", "W", query, query[5:60]] + [random_protein(rng, rng.randint(1, 150)) for _ in range(4)]
    block, lengths = padded(sequences, junk=2)
    plan = SoftSearch.plan(BLOSUM62.tensor(), 1.0, **gaps)
    for settings in (plan, dict(plan, upper=30, middle=20, floor=0)):
        expected, expected_flags = soft_search_model(codes(query), block, lengths, settings)
        scores, flags = emulate_warps(codes(query), block, lengths, settings, G, R)
        assert flags.tolist() == expected_flags.tolist()
        np.testing.assert_array_equal(scores[~flags], expected[~flags])
    assert expected_flags.any() and not expected_flags[1]  # the strict settings flag the strong pairs
