"""kernels/cuda/search_s16.cu's own source, run on the CPU by the lockstep emulation of tests/cuda_emulation, against
the CPU engine at t = 0: every launch class and every warp's columns a lane, several tiles through the edge
buffer, odd batches, empty targets, junk past the lengths, and pairs past int16 flagged. No GPU runs here, so
this is where the kernel's choice of columns, its tiles and its 16-bit cells meet the recurrence before the GPU
suite (tests/test_cuda_search_s16.py) runs them for real. The emulation runs blocks one after another and
says nothing of speed or of races between blocks (a block's groups share no element they write)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from swcli.ops import soft_smith_waterman_codes
from swcli.scoring import load_matrix
from swcli.search import ExactSearch, warp_columns
from swcli.testing import padded_code_targets, warp_width_lengths

sys.path.insert(0, str(Path(__file__).resolve().parent / "cuda_emulation"))
from emulate import EmulatedSearchS16, build  # noqa: E402

BLOSUM62 = load_matrix("BLOSUM62")
GAPS = [(-4, -4), (-11, -1)]


@pytest.fixture(scope="module")
def kernel(tmp_path_factory) -> EmulatedSearchS16:
    return EmulatedSearchS16(build(tmp_path_factory.mktemp("emulated_search_s16"), "search_s16.cu",
                                  "driver_search_s16.cpp"))


def expected_scores(query: torch.Tensor, targets: torch.Tensor, lengths: torch.Tensor, S: torch.Tensor,
                    gaps: tuple[int, int]) -> np.ndarray:
    """The CPU engine's exact scores (float32 holds these integers exactly)."""
    keywords = ({"gap": float(gaps[0])} if gaps[0] == gaps[1]
                else {"gap_open": float(gaps[0]), "gap_extend": float(gaps[1])})
    found = soft_smith_waterman_codes(query.expand(len(lengths), -1), targets, S, temperature=0.0,
                                      target_lengths=lengths, backend="cpu", **keywords)
    return found.numpy()


def check(kernel, rng: torch.Generator, lengths: list[int], gaps, queries=(1, 40), S=None):
    """The emulated kernel's scores of random queries against random targets of `lengths` (junk past
    them) equal the CPU engine's, and none is flagged."""
    S = BLOSUM62.tensor() if S is None else S
    targets, tlen = padded_code_targets(rng, lengths, S.shape[0], "cpu")
    exact = ExactSearch(S, *gaps)
    for M in queries:
        query = torch.randint(0, S.shape[0], (M,), generator=rng, dtype=torch.uint8)
        scores, overflows = kernel.scores(query.numpy(), targets.numpy(), tlen.numpy(), exact)
        assert overflows == 0
        np.testing.assert_array_equal(scores.astype(np.float32), expected_scores(query, targets, tlen, S, gaps),
                                      err_msg=f"M = {M}")


def test_the_python_mirror_of_warp_columns_is_the_kernels(kernel):
    """swcli.search.warp_columns (the benchmarks' and these tests' model of the kernel's choice) gives what
    common.cuh's gives, for limits, steps and fewest columns past one tile around the kernel's, single
    tiles and several."""
    for lanes in (8, 16, 32):
        for most, step, fewest in ((32, 2, 16), (28, 2, 16), (32, 8, 16), (32, 8, 24), (24, 8, 16)):
            for widest in [*range(0, 3 * lanes * most, 7), lanes * most, lanes * most + 1, 20_000]:
                assert (warp_columns(lanes, widest, most, step, fewest)
                        == kernel.warp_columns(lanes, widest, most, step, fewest)), (lanes, widest, most, step, fewest)


@pytest.mark.parametrize("gaps", GAPS, ids=str)
@pytest.mark.parametrize("lanes", [8, 16, 32])
def test_every_warp_width_of_every_class(kernel, gaps, lanes):
    """Each warp takes the columns a lane its widest target needs (8 to the class's most, by 2): one warp
    for each, its widest exactly G R or one past G (R - 2), the others shorter; the block's widest (its
    first) sets the class (G lanes)."""
    lengths = warp_width_lengths(lanes, ExactSearch.SHAPES[gaps[0] != gaps[1]][0][1], lanes)
    check(kernel, torch.Generator().manual_seed(60_000 + lanes), lengths, gaps)


@pytest.mark.parametrize("gaps", GAPS, ids=str)
def test_several_tiles_through_the_edge_buffer(kernel, gaps):
    """Targets past the widest tile: each warp (one group of 32 lanes) takes the tiles that pad the fewest
    columns, the edge of each going to the next through the buffer; beside one-tile warps in the launch."""
    most = ExactSearch.SHAPES[gaps[0] != gaps[1]][-1][1]
    lengths = [3 * 32 * most + 5, 2100, 2049, 32 * most + 1, 1500, 1100, 1000, 700, 64, 3, 0]
    check(kernel, torch.Generator().manual_seed(60_100), lengths, gaps, queries=(1, 13))


def test_an_odd_batch_empty_targets_and_empty_warps(kernel):
    """Groups past the batch in a live warp sweep the last target again and write nothing; a warp whose
    targets are all empty takes no tile and scores 0."""
    rng = torch.Generator().manual_seed(60_200)
    check(kernel, rng, [200, 199, 150, 7, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5], (-4, -4))  # 17: the last alone
    check(kernel, rng, [0, 0, 0], (-11, -1))


def test_scores_past_int16_are_flagged(kernel):
    """A matrix that gives 1,000 a match: self-matches of 40 and 33 letters (40,000 and 33,000) pass int16
    and are flagged (-1, counted); the others are exact."""
    K = BLOSUM62.tensor().shape[0]
    S = torch.full((K, K), -3.0)
    S.fill_diagonal_(1000.0)
    rng = torch.Generator().manual_seed(60_300)
    query = torch.randint(0, 20, (40,), generator=rng, dtype=torch.uint8)
    others = torch.randint(0, 20, (2, 40), generator=rng, dtype=torch.uint8)
    targets = torch.zeros((5, 40), dtype=torch.uint8)
    targets[0], targets[1], targets[4] = query, others[0], others[1]
    targets[2, :20], targets[3, :33] = query[:20], query[5:38]
    lengths = torch.tensor([40, 40, 20, 33, 40])
    exact = ExactSearch(S, -4, -4)
    scores, overflows = kernel.scores(query.numpy(), targets.numpy(), lengths.numpy(), exact)
    expected = expected_scores(query, targets, lengths, S, (-4, -4))
    assert overflows == 2 and scores[0] == -1 and scores[3] == -1 and expected[[0, 3]].tolist() == [40_000, 33_000]
    np.testing.assert_array_equal(scores[[1, 2, 4]].astype(np.float32), expected[[1, 2, 4]])


@pytest.mark.parametrize("gaps", GAPS, ids=str)
def test_alignments_with_gaps_across_lane_and_tile_edges(kernel, gaps):
    """Targets holding the query with letters inserted right at a lane's edge or a tile's (so that the best
    alignment carries H and the gap along the target across it: shuffles within a tile, the edge buffer
    between tiles) score as on the CPU, and high: the alignment crosses the edge."""
    rng = random.Random(60_400)
    S = BLOSUM62.tensor()
    query = [rng.randrange(20) for _ in range(60)]
    most = ExactSearch.SHAPES[gaps[0] != gaps[1]][-1][1]
    length = 3 * 32 * most + 5
    R = warp_columns(32, length, most, 2)
    edges = [2 * R, 7 * R, 32 * R, 2 * 32 * R]  # lanes 1|2 and 6|7 of the first tile, the first and second tiles' ends
    sequences = []
    for edge in edges:
        target = [rng.randrange(20) for _ in range(length)]
        motif = query[:30] + [rng.randrange(20) for _ in range(6)] + query[30:]
        start = edge - 33  # the inserted letters straddle the edge
        target[start:start + len(motif)] = motif
        sequences.append(target)
    targets = torch.tensor(sequences, dtype=torch.uint8)
    lengths = torch.full((len(sequences),), length)
    q = torch.tensor(query, dtype=torch.uint8)
    exact = ExactSearch(S, *gaps)
    scores, overflows = kernel.scores(q.numpy(), targets.numpy(), lengths.numpy(), exact)
    expected = expected_scores(q, targets, lengths, S, gaps)
    assert overflows == 0 and (expected > 150).all()  # the query's self-score with one gap, not chance
    np.testing.assert_array_equal(scores.astype(np.float32), expected)
