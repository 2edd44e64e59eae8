"""kernels/cuda/search_soft.cu's own source, run on the CPU by the lockstep emulation of tests/cuda_emulation, against
its NumPy model (swcli.testing.soft_search_model) and the float64 engine: targets end to end in a warp's
lanes (the same bits wherever they start), several tiles through the edge buffer, segments rescaled
again and again, and flagged pairs. No GPU runs here, so this is where the kernel's queue of targets, its
tiles and its scales meet the recurrence before the GPU suite (tests/test_cuda_search_soft.py) runs them for
real. Its cells are float32 adds, multiplies and fused multiply-adds, which the CPU rounds as the GPU does;
the emulation runs blocks one after another and says nothing of speed or of races between blocks."""

from __future__ import annotations

import random
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from swcli.ops import soft_smith_waterman
from swcli.scoring import load_matrix
from swcli.search import SoftSearch
from swcli.testing import encoded, padded_encoded, random_protein, related_protein_pairs, soft_search_model

sys.path.insert(0, str(Path(__file__).resolve().parent / "cuda_emulation"))
from emulate import EmulatedSearchSoft, build  # noqa: E402

BLOSUM62 = load_matrix("BLOSUM62")
LINEAR = {"gap": -4.0, "gap_open": None, "gap_extend": None}
AFFINE = {"gap": None, "gap_open": -11.0, "gap_extend": -1.0}
GAPS = pytest.mark.parametrize("gaps", [LINEAR, AFFINE], ids=["linear", "affine"])


@pytest.fixture(scope="module")
def kernel(tmp_path_factory) -> EmulatedSearchSoft:
    return EmulatedSearchSoft(build(tmp_path_factory.mktemp("emulated_search_soft"), "search_soft.cu",
                                    "driver_search_soft.cpp"))


@pytest.fixture(scope="module")
def kernel_of_4_warps(tmp_path_factory) -> EmulatedSearchSoft:
    """The kernel built with 4 warps a block, which the emulation runs together: several warps then take
    targets from the launch's counter in turn, each with its own edge rows."""
    return EmulatedSearchSoft(build(tmp_path_factory.mktemp("emulated_search_soft_4"), "search_soft.cu",
                                    "driver_search_soft.cpp",
                                    {"inline constexpr int kSoftWarps = 1;": "inline constexpr int kSoftWarps = 4;"}))


codes_of = partial(padded_encoded, BLOSUM62)  # zero past each length
query_codes = partial(encoded, BLOSUM62)


@GAPS
def test_the_kernel_is_its_model_and_float64(kernel, gaps):
    """Related and random pairs, empty and one-letter targets: with the search's settings, with a low
    upper exponent that rescales every strong segment again and again, and with a floor of 2^-30 under
    which the strong pairs' segments rise (or are flagged); the same flags as the model (none but at that
    floor), scores within float32 rounding of it, and within 2e-6 of the float64 engine."""
    pairs = related_protein_pairs(70, 6, 30, 90)
    rng = random.Random(70)
    query = pairs[0][0]
    sequences = [t for _, t in pairs] + [query, "", "W"] + [random_protein(rng, rng.randint(1, 300)) for _ in range(9)]
    targets, lengths = codes_of(sequences)
    q = query_codes(query)
    plan = SoftSearch.plan(BLOSUM62.tensor(), 1.0, **gaps)
    # the plan's own settings last: the float64 comparison below takes their scores
    for settings in (dict(plan, upper=30, middle=20, floor=126), dict(plan, floor=30), plan):
        scores, flagged = kernel.scores(q, targets, lengths, settings)
        expected, model_flags = soft_search_model(q, targets, lengths, settings)
        assert flagged == int(model_flags.sum()) and (scores == -1).tolist() == model_flags.tolist()
        assert flagged == 0 or settings["floor"] == 30
        np.testing.assert_allclose(scores[~model_flags], expected[~model_flags], rtol=1e-6, atol=1e-7)
    dense = BLOSUM62.tensor().double()[torch.from_numpy(q).long()[None, :, None],
                                       torch.from_numpy(targets).long()[:, None, :]]
    reference = soft_smith_waterman(dense, gaps["gap"], 1.0, None, torch.from_numpy(lengths), backend="cpu",
                                    gap_open=gaps["gap_open"], gap_extend=gaps["gap_extend"])
    np.testing.assert_allclose(scores, reference.numpy(), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("name, letters", [("NUC.4.4", "ACGTN"), ("JOHNSON", "ACDEFGHIKLMNPQRSTVWY")])
@GAPS
def test_alphabets_past_batches_of_8_letters(kernel, gaps, name, letters):
    """The profile's fill takes the letters 8 at a time, then one by one: 15 (NUC.4.4) and 20 letters
    (JOHNSON) take that last loop, which BLOSUM62's 24 never do; the scores are the model's and within
    2e-6 of the float64 engine."""
    matrix = load_matrix(name)
    rng = random.Random(71)
    query = "".join(rng.choice(letters) for _ in range(70))
    sequences = [query[5:60], "", letters[0]] + ["".join(rng.choice(letters) for _ in range(rng.randint(1, 200)))
                                                 for _ in range(12)]
    targets, lengths = padded_encoded(matrix, sequences)
    q = encoded(matrix, query)
    plan = SoftSearch.plan(matrix.tensor(), 1.0, **gaps)
    scores, flagged = kernel.scores(q, targets, lengths, plan)
    expected, model_flags = soft_search_model(q, targets, lengths, plan)
    assert flagged == 0 and not model_flags.any()
    np.testing.assert_allclose(scores, expected, rtol=1e-6, atol=1e-7)
    dense = matrix.tensor().double()[torch.from_numpy(q).long()[None, :, None],
                                     torch.from_numpy(targets).long()[:, None, :]]
    reference = soft_smith_waterman(dense, gaps["gap"], 1.0, None, torch.from_numpy(lengths), backend="cpu",
                                    gap_open=gaps["gap_open"], gap_extend=gaps["gap_extend"])
    np.testing.assert_allclose(scores, reference.numpy(), rtol=2e-6, atol=2e-6)


@GAPS
def test_a_score_has_the_same_bits_whatever_its_neighbours(kernel, gaps):
    """A warp takes targets one after another, a whole lane each R columns (linear 32, affine 24): the
    same targets after others of every length (so that each starts at a different lane and tile, and some
    cross a tile's edge), in an order that is not by length, among empty targets, give the same floats as
    in a block of their own: the scales are per 8 columns of the target, whatever the lanes and tiles.
    (The emulation runs a launch's blocks one after another, so its first warp takes every target: the
    GPU suite runs several warps.)"""
    rng = random.Random(71)
    pairs = related_protein_pairs(71, 6, 20, 120)
    q = query_codes(pairs[0][0])
    targets = [t for _, t in pairs] + [pairs[0][0]]
    columns = SoftSearch.COLUMNS[gaps["gap"] is None]
    plan = SoftSearch.plan(BLOSUM62.tensor(), 1.0, **gaps)
    alone = np.stack([kernel.scores(q, *codes_of([t]), plan)[0] for t in targets])[:, 0]
    for trial in range(5):
        # ahead: lengths from one column to past a tile, so the targets start at every lane offset
        ahead = [random_protein(rng, rng.choice([1, columns - 1, columns, columns + 1, 7 * columns + 3,
                                                 33 * columns + 5])) for _ in range(trial + 1)]
        sequences = ahead + targets + ["", random_protein(rng, 3)]
        order = list(range(len(sequences)))
        rng.shuffle(order)
        found, flagged = kernel.scores(q, *codes_of([sequences[i] for i in order]), plan)
        assert flagged == 0
        at = {i: k for k, i in enumerate(order)}
        np.testing.assert_array_equal(found[[at[len(ahead) + j] for j in range(len(targets))]], alone)
        assert found[at[len(ahead) + len(targets)]] == 0.0  # the empty target


@GAPS
def test_warps_taking_targets_together_give_the_same_bits(kernel, kernel_of_4_warps, gaps):
    """Four warps of a block run together and take the launch's targets from its counter as their tiles
    need them (2 to 4 of them, the fourth past the launch's warps where 3): targets from one residue to
    past a tile, longest first and shuffled, among empty ones, with a strong alignment in some, give the
    bits of the one-warp launch, which the model checks; a low upper exponent rescales them often."""
    rng = random.Random(75)
    query = random_protein(rng, 45)
    columns = SoftSearch.COLUMNS[gaps["gap"] is None]
    sequences = [random_protein(rng, rng.choice([1, columns, columns + 1, 5 * columns, 40 * columns + 7]))
                 for _ in range(20)] + ["", "", query, random_protein(rng, 9) + query + random_protein(rng, 900)]
    plan = SoftSearch.plan(BLOSUM62.tensor(), 1.0, **gaps)
    q = query_codes(query)
    for settings in (plan, dict(plan, upper=30, middle=20, floor=126)):
        for order in (sorted(sequences, key=len, reverse=True), rng.sample(sequences, len(sequences))):
            targets, lengths = codes_of(order)
            expected, model_flags = soft_search_model(q, targets, lengths, settings)
            alone, flagged = kernel.scores(q, targets, lengths, settings)
            assert flagged == int(model_flags.sum())
            np.testing.assert_allclose(alone[~model_flags], expected[~model_flags], rtol=1e-6, atol=1e-7)
            for warps in (2, 3, 4):
                together, flagged_together = kernel_of_4_warps.scores(q, targets, lengths, settings, warps)
                assert flagged_together == flagged
                np.testing.assert_array_equal(together.view(np.int32), alone.view(np.int32), err_msg=f"{warps}")


@GAPS
def test_several_tiles_match_the_model(kernel, gaps):
    """Targets past a tile end to end in one warp's lanes (the emulation's first warp takes them all), each
    with a strong alignment across a tile's edge: the edge buffer carries the last column, its scale (and
    affine X~) to the next tile, wherever the edge falls in the target."""
    rng = random.Random(72)
    query = random_protein(rng, 60)
    columns = SoftSearch.COLUMNS[gaps["gap"] is None]
    lanes = 3 * 32 + 5  # a target's lanes: past three tiles, so that each starts at another lane of a tile
    sequences, first = [], 0
    for _ in range(9):
        target = list(BLOSUM62.encode(random_protein(rng, lanes * columns), lambda: "t"))
        edge = (32 - first % 32) * columns  # the target's first column in the next tile
        motif = list(BLOSUM62.encode(query[:30] + random_protein(rng, 5) + query[30:], lambda: "t"))
        target[edge - 32:edge - 32 + len(motif)] = motif
        sequences.append(target)
        first += lanes
    targets, lengths = codes_of(sequences)
    q = query_codes(query)
    plan = SoftSearch.plan(BLOSUM62.tensor(), 1.0, **gaps)
    expected, model_flags = soft_search_model(q, targets, lengths, plan)
    assert not model_flags.any() and (expected > 150).all()
    scores, flagged = kernel.scores(q, targets, lengths, plan)
    assert flagged == 0
    np.testing.assert_allclose(scores, expected, rtol=1e-6, atol=1e-7)


@GAPS
def test_queries_ending_around_the_profiles_chunks(kernel, gaps):
    """The steps between the ramps run 32 rows of the profile at a time and leave their loop to rescale:
    queries of 1 to 97 residues (ending before, at and past each chunk's end), against targets holding
    them, with a low upper exponent that rescales on most rows (some at a chunk's last step), give the
    model's scores and flags."""
    rng = random.Random(74)
    for M in (1, 31, 32, 33, 63, 64, 65, 97):
        query = random_protein(rng, M)
        sequences = [query, random_protein(rng, 5) + query + random_protein(rng, 9), random_protein(rng, 70), "G"]
        targets, lengths = codes_of(sequences)
        q = query_codes(query)
        plan = SoftSearch.plan(BLOSUM62.tensor(), 1.0, **gaps)
        for settings in (plan, dict(plan, upper=30, middle=20, floor=126)):
            counts = {}
            expected, model_flags = soft_search_model(q, targets, lengths, settings, counts)
            scores, flagged = kernel.scores(q, targets, lengths, settings)
            assert flagged == int(model_flags.sum()) and (scores == -1).tolist() == model_flags.tolist()
            assert M < 8 or not model_flags[:2].any()  # (a one-letter query's best cell is under the bound)
            np.testing.assert_allclose(scores[~model_flags], expected[~model_flags], rtol=1e-6, atol=1e-7)
            assert settings is plan or M < 8 or counts["rescalings"] > M  # rescaled on most rows


def test_flagged_pairs_score_minus_one_and_are_counted(kernel):
    """A floor of 2^0 with a low upper exponent flags the strong pairs (as the model says); a bound of
    1e30 flags the weak pairs, not the empty target."""
    query = related_protein_pairs(73, 1, 60, 60)[0][0]
    targets, lengths = codes_of([query, query[10:50], "", "G", "WWW"], 60)
    q = query_codes(query)
    plan = SoftSearch.plan(BLOSUM62.tensor(), 1.0, **LINEAR)
    strict = dict(plan, upper=30, middle=20, floor=0)
    loose = dict(plan, bound=1e30)
    for settings in (strict, loose):
        _, flags = soft_search_model(q, targets, lengths, settings)
        scores, count = kernel.scores(q, targets, lengths, settings)
        assert (scores < 0).tolist() == flags.tolist() and count == int(flags.sum()) > 0
        assert scores[scores < 0].tolist() == [-1.0] * count and scores[2] == 0.0


@GAPS
def test_the_floors_check_flags_what_the_model_flags(kernel, gaps):
    """Segments past the floor (sigma > F) are checked cell by cell only where their first cell does not
    bound their cells above it: with floors from 2^0 to 2^-40 and values up to 2^60, strong and weak
    pairs (some flagged, some not), the same flags as the model, which checks every cell, and the same
    scores."""
    pairs = related_protein_pairs(74, 6, 200, 320)
    rng = random.Random(74)
    query = pairs[0][0]
    sequences = [t for _, t in pairs] + [random_protein(rng, rng.randint(150, 400)) for _ in range(6)]
    targets, lengths = codes_of(sequences)
    q = query_codes(query)
    plan = SoftSearch.plan(BLOSUM62.tensor(), 1.0, **gaps)
    counts = []
    for floor in (0, 8, 16, 24, 40):
        settings = dict(plan, upper=60, middle=40, floor=floor)
        scores, flagged = kernel.scores(q, targets, lengths, settings)
        expected, model_flags = soft_search_model(q, targets, lengths, settings)
        assert (scores < 0).tolist() == model_flags.tolist() and flagged == int(model_flags.sum())
        kept = ~model_flags
        np.testing.assert_allclose(scores[kept], expected[kept], rtol=1e-6, atol=1e-7)
        counts.append(flagged)
    assert counts[0] > 0 and counts[-1] < len(sequences), counts
