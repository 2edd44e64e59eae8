"""Search (swcli/search.py): every query against every database sequence, the best k of each."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from swcli import database
from swcli.fasta import FastaRecord
from swcli.ops import load_engine
from swcli.scoring import load_matrix
from swcli.search import (LOW, Hits, Searcher, block_bounds, hits_of, make_block, merge_top, run_search,
                          score_keys, search)
from swcli.statistics import EvalueRanking, KarlinAltschul
from swcli.testing import (DEVICE_PARAMS, biopython_score, cuda, random_protein, random_search_set,
                           related_protein_pairs, requires_cuda)
from swcli.testing import run_cli as cli

BLOSUM62 = load_matrix("BLOSUM62")


def search_set(seed: int, queries: int, sequences: int):
    """Queries, and a database holding mutated copies of them among random sequences (real hits)."""
    rng = random.Random(seed)
    pairs = related_protein_pairs(seed, queries, 20, 80)
    qs = [q for q, _ in pairs]
    db = [random_protein(rng, rng.randint(5, 120)) for _ in range(sequences - queries)]
    for _, t in pairs:
        db.insert(rng.randrange(len(db) + 1), t)
    db += db[:3]  # duplicates: equal scores, broken by database order
    return qs, db


def run(queries, sequences, top, gap=-4.0, t=0.0, device="cpu", **limits):
    load_engine(device)
    db = database.build([FastaRecord("db.fa", k + 1, f"s{k}", s) for k, s in enumerate(sequences)], BLOSUM62,
                        "db.fa")
    codes = (BLOSUM62.encode(q, lambda: "query") for q in queries)
    backend = "cuda" if torch.device(device).type == "cuda" else "cpu"
    return list(search(codes, db, BLOSUM62.tensor(), gap, t, top, backend, device, **limits))


def test_top_hits_equal_an_exhaustive_biopython_search():
    queries, sequences = search_set(seed=1, queries=6, sequences=150)
    hits = run(queries, sequences, top=10)
    for q, found in zip(queries, hits):
        exhaustive = sorted(((-biopython_score(q, s, -4.0), k) for k, s in enumerate(sequences)))[:10]
        assert found.scores.tolist() == [-score for score, _ in exhaustive]
        assert found.targets.tolist() == [k for _, k in exhaustive]  # ties by database order


@pytest.mark.parametrize("gap_open, gap_extend", [(-12.0, -1.0), (-10.0, -2.0)])
def test_affine_top_hits_equal_an_exhaustive_biopython_search(gap_open, gap_extend):
    queries, sequences = search_set(seed=9, queries=4, sequences=90)
    gaps = {"gap_open": gap_open, "gap_extend": gap_extend}
    hits = run(queries, sequences, top=8, gap=None, **gaps)
    streamed = run(queries, sequences, top=8, gap=None, max_bytes=0, max_cells=400, **gaps)
    for q, found, cut in zip(queries, hits, streamed, strict=True):
        exhaustive = sorted((-biopython_score(q, s, gap_open, gap_extend=gap_extend), k)
                            for k, s in enumerate(sequences))[:8]
        assert found.scores.tolist() == [-score for score, _ in exhaustive]
        assert found.targets.tolist() == [k for _, k in exhaustive]  # ties by database order
        assert torch.equal(cut.targets, found.targets) and torch.equal(cut.scores, found.scores)
    linear = run(queries, sequences, top=8)
    assert any(a.scores.tolist() != b.scores.tolist() for a, b in zip(hits, linear))


def test_affine_soft_hits_are_the_op_scores():
    """At t > 0 an affine hit's score is the score the affine op gives that pair alone."""
    from swcli.ops import soft_smith_waterman_codes

    queries, sequences = search_set(seed=10, queries=2, sequences=40)
    for q, found in zip(queries, run(queries, sequences, top=4, gap=None, t=1.0, gap_open=-11.0, gap_extend=-1.0)):
        qc = torch.tensor(list(BLOSUM62.encode(q, lambda: "q")), dtype=torch.uint8)[None]
        for score, k in zip(found.scores.tolist(), found.targets.tolist()):
            tc = torch.tensor(list(BLOSUM62.encode(sequences[k], lambda: "t")), dtype=torch.uint8)[None]
            alone = soft_smith_waterman_codes(qc, tc, BLOSUM62.tensor(), None, 1.0, backend="reference",
                                              gap_open=-11.0, gap_extend=-1.0)
            assert score == pytest.approx(alone.item(), rel=1e-5, abs=1e-4)


@pytest.mark.parametrize("t", [0.0, 1.0])
def test_streamed_and_many_blocks_equal_resident(t):
    queries, sequences = search_set(seed=2, queries=4, sequences=120)
    resident = run(queries, sequences, top=7, t=t)
    streamed = run(queries, sequences, top=7, t=t, max_bytes=0, max_cells=300)
    for a, b in zip(resident, streamed):
        assert torch.equal(a.targets, b.targets)
        torch.testing.assert_close(a.scores, b.scores, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_soft_scores_are_the_align_scores(device):
    """At t > 0 a hit's score is the score the op gives that pair alone."""
    from swcli.ops import soft_smith_waterman_codes

    queries, sequences = search_set(seed=3, queries=3, sequences=60)
    for q, found in zip(queries, run(queries, sequences, top=5, t=1.0, device=device)):
        qc = torch.tensor(list(BLOSUM62.encode(q, lambda: "q")), dtype=torch.uint8)[None]
        for score, k in zip(found.scores.tolist(), found.targets.tolist()):
            tc = torch.tensor(list(BLOSUM62.encode(sequences[k], lambda: "t")), dtype=torch.uint8)[None]
            alone = soft_smith_waterman_codes(qc, tc, BLOSUM62.tensor(), -4.0, 1.0, backend="cpu")
            assert score == pytest.approx(alone.item(), rel=1e-5, abs=1e-4)


def test_top_past_the_database_and_an_empty_database():
    queries, sequences = search_set(seed=4, queries=2, sequences=5)
    hits = run(queries, sequences, top=50)
    assert all(len(h.scores) == len(sequences) for h in hits)
    empty = run(queries, [], top=3)
    assert all(len(h.scores) == 0 for h in empty)


def test_top_must_be_positive():
    with pytest.raises(ValueError, match="top must be at least 1"):
        run(["ACD"], ["ACD"], top=0)


def test_block_bounds_cover_the_database_under_the_budget():
    sequences = [random_protein(random.Random(k), 1 + (k * 37) % 200) for k in range(300)]
    db = database.build([FastaRecord("db.fa", k + 1, f"s{k}", s) for k, s in enumerate(sequences)], BLOSUM62, "x")
    bounds = block_bounds(db, 2000)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(db)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    for start, stop in bounds:
        assert (stop - start) * db.lengths[start] <= 2000 or stop - start == 1


class _Lengths:
    def __init__(self, lengths):
        self.lengths = np.asarray(lengths, dtype=np.int64)


def test_block_bounds_end_at_a_kernels_tile_classes_once_the_gpu_is_full():
    """Tiles of 64, 128 and 256 columns; fill(width) = waves x 8 threads / lanes x 2 targets: 8 rows at
    widths up to 128 (2 lanes), 4 past (4 lanes). A block ends at the first class boundary past its fill,
    and never passes max_cells."""
    from swcli.search import TileClasses

    lengths = [300, 290, 250, 200, 130, 129, 128, 120, 100, 90, 80, 70, 66, 65, 64, 60, 10, 5, 1]
    classes = TileClasses(((2, 32), (2, 64), (4, 64)), 2, 8, 1, 1.0)
    assert classes.widths == (64, 128, 256) and classes.fill(100) == 8 and classes.fill(300) == 4
    # rows 0-1 are past 256, 2-5 in (128, 256], 6-13 in (64, 128], 14-18 at most 64
    assert block_bounds(_Lengths(lengths), 10 ** 6, classes) == [(0, 6), (6, 14), (14, 19)]
    assert block_bounds(_Lengths(lengths), 10 ** 6, TileClasses(classes.shapes, 2, 8, 1, 0.0)) == [
        (0, 2), (2, 6), (6, 14), (14, 19)]
    assert block_bounds(_Lengths(lengths), 10 ** 6, TileClasses(classes.shapes, 2, 8, 1, 100.0)) == [(0, 19)]
    # max_cells first (600 // 300 = 2 rows), then the class boundary past the fill
    assert block_bounds(_Lengths(lengths), 600, classes) == [(0, 2), (2, 4), (4, 8), (8, 14), (14, 19)]
    assert block_bounds(_Lengths([]), 600, classes) == []
    assert block_bounds(_Lengths(lengths), 10 ** 6) == [(0, 19)]


def test_the_search_kernels_shapes_are_their_sources():
    """ExactSearch.SHAPES are the exact kernel's launch classes (read from its source): the lanes of
    launch_lanes (common.cuh), each with its most columns a lane, linear and affine; SoftSearch.COLUMNS are
    the soft kernel's columns a lane."""
    import re
    from pathlib import Path

    from swcli.search import ExactSearch, SoftSearch

    cuda = Path(__file__).resolve().parents[1] / "kernels" / "cuda"
    common = (cuda / "common.cuh").read_text()
    first, step = re.search(r"launch_lanes.*?for \(int G = (\d+); G < kWarp; G \*= (\d+)\)", common, re.S).groups()
    lanes = [int(first) * int(step) ** k for k in range(3)]
    assert lanes[-1] == 32
    affine, linear = map(int, re.search(r"kMaxColumns = AFFINE \? (\d+) : (\d+);",
                                        (cuda / "search_s16.cu").read_text()).groups())
    for is_affine, most in ((False, linear), (True, affine)):
        assert ExactSearch.SHAPES[is_affine] == tuple((g, most) for g in lanes)
    affine, linear = map(int, re.search(r"kColumns = AFFINE \? (\d+) : (\d+);",
                                        (cuda / "search_soft.cu").read_text()).groups())
    assert SoftSearch.COLUMNS == {False: linear, True: affine}


def test_merge_keeps_database_order_among_ties():
    best = merge_top(None, torch.tensor([5.0, 7.0, 5.0]), torch.tensor([9, 4, 2]), 2)
    assert best.scores.tolist() == [7.0, 5.0] and best.targets.tolist() == [4, 2]
    merged = merge_top(best, torch.tensor([5.0, 8.0]), torch.tensor([1, 30]), 3)
    assert isinstance(merged, Hits)
    assert merged.scores.tolist() == [8.0, 7.0, 5.0] and merged.targets.tolist() == [30, 4, 1]


def test_keys_order_by_score_then_database_order_and_decode_exactly():
    scores = torch.tensor([-0.0, 0.0, -1.5, float("inf"), 2.25, -float("inf"), 2.25, 1e-30, -1e-30, 7.0])
    targets = torch.tensor([3, 1, 0, 9, 8, 2, 4, 5, 6, 7])
    keys = score_keys(scores, LOW - targets)
    back = hits_of(keys)
    assert torch.equal(back.targets, targets) and back.scores.tolist() == (scores + 0.0).tolist()
    by_key = torch.argsort(keys, descending=True).tolist()
    by_sort = sorted(range(10), key=lambda k: (-scores[k].item(), targets[k].item()))
    assert by_key == by_sort  # -0.0 and 0.0 tie, broken by database order


@pytest.mark.parametrize("t", [0.0, 1.0])
def test_ties_across_blocks_keep_database_order(t):
    """Equal sequences in different blocks, the top cutting through them: the earliest are kept."""
    rng = random.Random(5)
    query = random_protein(rng, 40)
    copies = [query[5:35]] * 9 + [query[8:38]] * 5  # two groups of equal scores
    sequences = [random_protein(rng, rng.randint(20, 60)) for _ in range(60)]
    for s in copies:
        sequences.insert(rng.randrange(len(sequences) + 1), s)
    whole = run([query], sequences, top=12, t=t)[0]
    for limits in ({"max_cells": 45}, {"max_cells": 200, "max_bytes": 0}):
        cut = run([query], sequences, top=12, t=t, **limits)[0]
        assert torch.equal(cut.targets, whole.targets)
        torch.testing.assert_close(cut.scores, whole.scores, rtol=1e-6, atol=1e-5)
    if t == 0.0:
        exhaustive = sorted((-biopython_score(query, s, -4.0), k) for k, s in enumerate(sequences))[:12]
        assert whole.targets.tolist() == [k for _, k in exhaustive]


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_hard_search_is_the_same_on_every_device_resident_or_streamed(device):
    """t = 0 scores are exact, so hits, ties included, are the same everywhere: the CPU search beside
    the device's, resident and streamed, several queries in flight."""
    queries, sequences = search_set(seed=8, queries=5, sequences=150)
    sequences += sequences[10:40]  # more ties, in other blocks
    expected = run(queries, sequences, top=9)
    for limits in ({}, {"max_cells": 900}, {"max_cells": 900, "max_bytes": 0}):
        for want, got in zip(expected, run(queries, sequences, top=9, device=device, **limits)):
            assert torch.equal(got.targets, want.targets) and torch.equal(got.scores, want.scores)


@cuda
@requires_cuda
@pytest.mark.parametrize("gaps", [{"gap": -4.0}, {"gap": None, "gap_open": -11.0, "gap_extend": -1.0}],
                         ids=["linear", "affine"])
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_launches_on_side_streams_give_the_scores_of_one_stream(t, gaps, monkeypatch):
    """A query's launches taken in turn by 1, 2 or 3 streams (LaunchStreams), resident or padded again
    per query, and under a caller's side stream: every block's scores the same, bit for bit, and the
    scoring calls timed as one interval a query."""
    db, codes = random_search_set(4_201)
    load_engine("cuda")
    device = torch.device("cuda")

    def scored(streams: int, **limits) -> list[list[torch.Tensor]]:
        monkeypatch.setattr(Searcher, "STREAMS", streams)
        searcher = Searcher(db, BLOSUM62.tensor(), gaps["gap"], t, 7, "cuda", device, max_cells=1 << 14,
                            gap_open=gaps.get("gap_open"), gap_extend=gaps.get("gap_extend"), **limits)
        assert searcher.kernel is not None and len(searcher.streams.streams) == (streams if streams > 1 else 0)
        assert len(searcher.bounds) > 1  # a launch a block (t = 0: or more)
        found = []
        for query in codes:
            pending, rescored = searcher.launch(query), searcher.rescored
            hits, seconds = searcher.finish(pending)
            assert seconds > 0 and len(pending.events) == 1 + (searcher.rescored > rescored)  # (+ the rescoring)
            found.append([scores.cpu() for _, scores, _ in pending.flagged] + [hits.scores, hits.targets])
        return found

    one = scored(1)
    assert len(one[0]) > 3  # several blocks
    for got in (scored(2), scored(3), scored(2, max_bytes=0)):
        assert all(torch.equal(a, b) for want, have in zip(one, got) for a, b in zip(want, have, strict=True))
    with torch.cuda.stream(torch.cuda.Stream(device)):
        got = scored(2)
    assert all(torch.equal(a, b) for want, have in zip(one, got) for a, b in zip(want, have, strict=True))


def test_pipelined_queries_equal_one_at_a_time():
    queries, sequences = search_set(seed=6, queries=5, sequences=80)
    db = database.build([FastaRecord("db.fa", k + 1, f"s{k}", s) for k, s in enumerate(sequences)], BLOSUM62, "x")
    codes = [BLOSUM62.encode(q, lambda: "query") for q in queries]
    searcher = Searcher(db, BLOSUM62.tensor(), -4.0, 0.0, 6, "cpu", "cpu", max_cells=500)
    for alone, together in zip([searcher.best(c) for c in codes],
                               search(iter(codes), db, BLOSUM62.tensor(), -4.0, 0.0, 6, "cpu", "cpu", max_cells=500)):
        assert torch.equal(alone.targets, together.targets) and torch.equal(alone.scores, together.scores)


def test_blocks_padded_from_flat_codes_equal_the_database_padding():
    sequences = [random_protein(random.Random(k), 1 + (k * 13) % 90) for k in range(120)]
    db = database.build([FastaRecord("db.fa", k + 1, f"s{k}", s) for k, s in enumerate(sequences)], BLOSUM62, "x")
    flat = torch.from_numpy(db.codes.copy())
    for start, stop in block_bounds(db, 700):
        codes, lengths = db.padded(start, stop)
        for block in (make_block(db, start, stop, "cpu"), make_block(db, start, stop, "cpu", flat)):
            assert torch.equal(block.codes, torch.from_numpy(codes)) and block.lengths.tolist() == lengths.tolist()
            assert (LOW - block.tiebreak).tolist() == db.index[start:stop].tolist()


# --------------------------------------------------------------------------------------------------
# Ranking by E-value

RANKED = KarlinAltschul(0.27, 0.04, "given", 1.9, -30.0)  # BLAST's BLOSUM62 11/1 values, about


def ranked_by_evalue(query: str, sequences: list[str], all_hits: Hits, top: int) -> list[tuple[float, float, int]]:
    """The oracle: every sequence's (R, score, database order), R = lambda S - ln(searched K m' n') from
    the same per-length table, sorted by R descending, then score descending, then database order."""
    lengths = np.array([len(s) for s in sequences])
    distinct = np.unique(lengths)
    table = RANKED.log_space(len(query), distinct, len(sequences))
    rows = []
    for score, target in zip(all_hits.scores.tolist(), all_hits.targets.tolist()):
        log_space = table[np.searchsorted(distinct, lengths[target])]
        rows.append((float(np.float64(score) * RANKED.lambda_ - log_space), score, target))
    return sorted(rows, key=lambda row: (-row[0], -row[1], row[2]))[:top]


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("t,gaps", [(0.0, {"gap": -4.0}), (1.0, {"gap": -4.0}),
                                    (0.0, {"gap": None, "gap_open": -12.0, "gap_extend": -1.0}),
                                    (1.0, {"gap": None, "gap_open": -12.0, "gap_extend": -1.0})])
def test_rank_by_evalue_equals_ranking_every_sequence(t, gaps, device):
    """The best k by E-value kept on the device, block by block, are the best k of all sequences ranked by
    E-value (ties, from duplicated sequences, by score then database order), resident or streamed in
    many blocks, and the E-values given are exp(-R) of the same R."""
    queries, sequences = search_set(seed=12, queries=5, sequences=140)
    sequences += [sequences[k] for k in range(0, 140, 7)]  # more equal lengths and scores
    top = 9
    everything = run(queries, sequences, top=len(sequences), t=t, device=device, **gaps)
    resident = run(queries, sequences, top=top, t=t, device=device, rank=RANKED, **gaps)
    streamed = run(queries, sequences, top=top, t=t, device=device, rank=RANKED, max_bytes=0, max_cells=500, **gaps)
    differs = False
    for query, all_hits, found, cut in zip(queries, everything, resident, streamed, strict=True):
        expected = ranked_by_evalue(query, sequences, all_hits, top)
        assert found.targets.tolist() == [target for _, _, target in expected]
        assert found.scores.tolist() == [score for _, score, _ in expected]
        assert found.evalues.tolist() == np.exp(-np.array([rank for rank, _, _ in expected])).tolist()
        assert torch.equal(cut.targets, found.targets) and np.array_equal(cut.evalues, found.evalues)
        lengths = [len(sequences[k]) for k in found.targets.tolist()]
        assert np.allclose(found.evalues, RANKED.evalues(found.scores.numpy(), len(query), lengths, len(sequences)),
                           rtol=1e-12)
        differs |= found.targets.tolist() != all_hits.targets[:top].tolist()
    assert differs  # E-value order is not score order here


def test_rank_by_evalue_of_an_empty_query_and_past_the_database():
    """An empty query has no search space (E = 0 for every sequence): the order is the score's, database
    order. A top past the database's size gives every sequence."""
    sequences = ["MKVLA", "WWW", "MKVLA", "ACDEFGHIK"]
    load_engine("cpu")
    db = database.build([FastaRecord("db.fa", k + 1, f"s{k}", s) for k, s in enumerate(sequences)], BLOSUM62, "db.fa")
    empty, whole = search([b"", BLOSUM62.encode("MKVLA", lambda: "q")], db, BLOSUM62.tensor(), -4.0, 0.0, 10, "cpu",
                          rank=RANKED)
    assert empty.targets.tolist() == [0, 1, 2, 3] and empty.evalues.tolist() == [0.0] * 4
    assert whole.targets.tolist()[:2] == [0, 2] and len(whole.targets) == 4
    assert list(whole.evalues) == sorted(whole.evalues)


def test_ranking_breaks_equal_evalues_by_score_then_database_order():
    ranks = torch.tensor([1.0, 3.0, 3.0, 2.0, 3.0], dtype=torch.float64)
    keys = score_keys(torch.tensor([5.0, 4.0, 6.0, 1.0, 4.0]), LOW - torch.tensor([0, 1, 2, 3, 4]))
    best_ranks, best_keys = EvalueRanking.best(ranks, keys, 4)
    assert hits_of(best_keys).targets.tolist() == [2, 1, 4, 3] and best_ranks.tolist() == [3.0, 3.0, 3.0, 2.0]
    assert EvalueRanking.best(ranks, keys, 10)[0].tolist() == [3.0, 3.0, 3.0, 2.0, 1.0]


# --------------------------------------------------------------------------------------------------
# swcli search and swcli makedb


def test_run_search_writes_the_cli_output_and_counts_the_work(search_files, tmp_path, capsys):
    from swcli.pipeline import Settings

    q, db = search_files
    _, expected, _ = cli(["search", q, db, "-t", "0", "--backend", "cpu", "-k", "4"], capsys)
    load_engine("cpu")
    out = tmp_path / "hits.tsv"
    stats = run_search(q, db, Settings(BLOSUM62, -4.0, 0.0, "cpu"), str(out), top=4)
    assert out.read_text() == expected
    query_residues = sum(len(s) for s in search_set(seed=7, queries=4, sequences=40)[0])
    assert stats.queries == stats.total == 4 and stats.sequences == 43
    assert stats.cells == query_residues * stats.residues
    assert 0 < stats.kernel_seconds <= stats.seconds and stats.resident and stats.device_bytes > 0
    assert stats.host_bytes > stats.residues and stats.gcups <= stats.kernel_gcups
    streamed = run_search(q, db, Settings(BLOSUM62, -4.0, 0.0, "cpu"), str(out), top=4, max_bytes=0)
    assert out.read_text() == expected and not streamed.resident and streamed.device_bytes == 0


@pytest.fixture
def search_files(tmp_path):
    from swcli.testing import write_fasta

    queries, sequences = search_set(seed=7, queries=4, sequences=40)
    q = write_fasta(tmp_path / "q.fa", [(f"q{k}", s) for k, s in enumerate(queries)])
    db = write_fasta(tmp_path / "db.fa", [(f"d{k}", s) for k, s in enumerate(sequences)])
    return q, db


@pytest.mark.parametrize("t", ["0", "1"])
def test_search_rows_are_the_top_of_align_all_vs_all(search_files, capsys, t):
    from swcli.testing import read_tsv

    q, db = search_files
    code, out, err = cli(["search", q, db, "-k", "3", "-t", t, "--backend", "cpu"], capsys)
    assert code == 0 and err == ""
    rows = read_tsv(out)
    assert rows[0] == ["query", "target", "qlen", "tlen", "score"]
    code, every, _ = cli(["align", q, db, "--all-vs-all", "-t", t, "--backend", "cpu", "--no-header"], capsys)
    assert code == 0
    by_query: dict[str, list] = {}
    for k, row in enumerate(read_tsv(every)):
        by_query.setdefault(row[0], []).append((-float(row[4]), k % 43, row))
    expected = []
    for query in dict.fromkeys(row[0] for row in read_tsv(every)):
        best = sorted(by_query[query], key=lambda x: (x[0], x[1]))[:3]
        expected += [row for _, _, row in best]
    assert [r[:4] for r in rows[1:]] == [r[:4] for r in expected]
    for got, want in zip(rows[1:], expected):
        assert float(got[4]) == pytest.approx(float(want[4]), rel=1e-5, abs=1e-4)


@pytest.mark.parametrize("t", ["0", "1"])
def test_affine_search_rows_are_the_top_of_align_all_vs_all(search_files, capsys, t):
    from swcli.testing import read_tsv

    q, db = search_files
    gaps = ["--gap-open", "-12", "--gap-extend", "-1"]
    code, out, err = cli(["search", q, db, "-k", "3", "-t", t, "--backend", "cpu"] + gaps, capsys)
    assert code == 0 and err == ""
    _, every, _ = cli(["align", q, db, "--all-vs-all", "-t", t, "--backend", "cpu", "--no-header"] + gaps, capsys)
    by_query: dict[str, list] = {}
    for k, row in enumerate(read_tsv(every)):
        by_query.setdefault(row[0], []).append((-float(row[4]), k % 43, row))
    expected = [row for query in by_query for _, _, row in sorted(by_query[query], key=lambda x: x[:2])[:3]]
    rows = read_tsv(out)[1:]
    assert [r[:4] for r in rows] == [r[:4] for r in expected]
    for got, want in zip(rows, expected, strict=True):
        assert float(got[4]) == pytest.approx(float(want[4]), rel=1e-5, abs=1e-4)
    # open == extend is the linear gap: the same output as --gap, byte for byte
    _, linear, _ = cli(["search", q, db, "-k", "3", "-t", t, "--backend", "cpu", "--gap", "-3"], capsys)
    _, equal, _ = cli(["search", q, db, "-k", "3", "-t", t, "--backend", "cpu", "--gap-open", "-3",
                       "--gap-extend", "-3"], capsys)
    assert equal == linear


def test_makedb_then_search_equals_search_of_the_fasta(search_files, tmp_path, capsys):
    q, db = search_files
    code, _, err = cli(["makedb", db, str(tmp_path / "prepared")], capsys)
    assert code == 0 and "43 sequences" in err
    _, from_fasta, _ = cli(["search", q, db, "-t", "0", "--backend", "cpu"], capsys)
    code, from_folder, _ = cli(["search", q, str(tmp_path / "prepared"), "-t", "0", "--backend", "cpu",
                                "--max-memory", "0"], capsys)
    assert code == 0 and from_folder == from_fasta


def test_a_folder_made_with_unknown_as_is_searched_with_the_same(tmp_path, capsys):
    """The folder's unknown letters were encoded by its --unknown-as: the same one searches it as the FASTA
    is searched, another is refused (it would score queries and sequences by different rules)."""
    from swcli.testing import write_fasta

    db = write_fasta(tmp_path / "db.fa", [("a", "ACDKLMW"), ("b", "ACJDEKLW")])
    q = write_fasta(tmp_path / "q.fa", [("q", "ACJDEKLW")])
    folder = str(tmp_path / "x")
    assert cli(["makedb", db, folder, "--unknown-as", "X", "-q"], capsys)[0] == 0
    search = ["search", q, "-t", "0", "--backend", "cpu", "--unknown-as"]
    _, from_fasta, _ = cli([*search[:1], q, db, *search[2:], "X"], capsys)
    code, from_folder, _ = cli([*search[:1], q, folder, *search[2:], "X"], capsys)
    assert code == 0 and from_folder == from_fasta
    code, out, err = cli([*search[:1], q, folder, *search[2:], "*"], capsys)
    assert code == 1 and out == "" and err == (
        f"swcli: error: {folder}: prepared with --unknown-as X, but this search has --unknown-as '*'; search it "
        "with --unknown-as X, or prepare it again as this search encodes\n")


def test_nucleotides_under_a_protein_matrix_are_warned_of(tmp_path, capsys):
    """SSEARCH takes such sequences for DNA; here BLOSUM62 would score them as amino acids: said once
    for the queries, once for the database, and by makedb; the rows are still written."""
    from swcli.testing import write_fasta

    dna = write_fasta(tmp_path / "dna.fa", [("n0", "ACGTTGCAGGCTAACGTTAGC"), ("n1", "GATTACAGATTACA")])
    protein = write_fasta(tmp_path / "p.fa", [("p0", "MKVLAWYPGHECDNQRSTIF"), ("p1", "ACDKLMW")])
    warned = "of its residues are A, C, G, T, U or N: nucleotides, scored as amino acids by BLOSUM62?"
    code, out, err = cli(["search", dna, protein, "-t", "0", "--backend", "cpu", "-q"], capsys)
    assert code == 0 and out.count("\n") == 5
    assert err == f"swcli: warning: {dna}: 100% {warned} (a nucleotide matrix: --matrix NUC.4.4)\n"
    code, out, err = cli(["search", protein, dna, "-t", "0", "--backend", "cpu", "-q"], capsys)
    assert code == 0 and err.count("\n") == 1 and f"warning: {dna}: 100% {warned}" in err
    code, _, err = cli(["makedb", dna, str(tmp_path / "db"), "-q"], capsys)
    assert code == 0 and err.startswith(f"swcli: warning: {dna}: 100% {warned}")
    code, _, err = cli(["search", dna, dna, "-t", "0", "--backend", "cpu", "-q", "--matrix", "NUC.4.4"], capsys)
    assert code == 0 and err == ""


def test_makedb_warns_of_repeated_ids(tmp_path, capsys):
    fasta = tmp_path / "dup.fa"
    fasta.write_text(">a\nMKV\n>b\nMKW\n>a\nMKL\n>c\nMK\n>b\nWW\n")
    code, out, err = cli(["makedb", str(fasta), str(tmp_path / "db")], capsys)
    assert code == 0 and out == "" and err.splitlines() == [
        f"swcli: warning: {fasta}: 2 ids appear more than once ('a': records 1 and 3); the output cannot tell "
        "their hits apart", f"{tmp_path / 'db'}: 5 sequences, 13 residues"]
    fasta.write_text(">a\nMKV\n>b\nMKW\n")
    code, out, err = cli(["makedb", str(fasta), str(tmp_path / "db2")], capsys)
    assert code == 0 and "warning" not in err


@pytest.mark.parametrize("prepared", [False, True])
def test_search_warns_of_repeated_database_ids(tmp_path, capsys, prepared):
    fasta = tmp_path / "dup.fa"
    fasta.write_text(">a\nMKV\n>b\nMKW\n>a\nMKL\n")
    (tmp_path / "q.fa").write_text(">q\nMKV\n")
    database = str(fasta)
    if prepared:
        database = str(tmp_path / "db")
        assert cli(["makedb", str(fasta), database, "-q"], capsys)[0] == 0
    code, out, err = cli(["search", str(tmp_path / "q.fa"), database, "--backend", "cpu", "-q"], capsys)
    assert code == 0 and len(out.splitlines()) == 4 and err == (
        f"swcli: warning: {database}: 1 id appears more than once ('a': records 1 and 3); the output cannot tell "
        "their hits apart\n")


@pytest.mark.parametrize("name", database.FILES)
def test_search_refuses_an_output_over_a_file_of_its_database_folder(search_files, tmp_path, capsys, name):
    q, db = search_files
    folder = tmp_path / "db"
    assert cli(["makedb", db, str(folder), "-q"], capsys)[0] == 0
    kept = (folder / name).read_bytes()
    (tmp_path / "link.tsv").symlink_to(folder / name)
    for output in (str(folder / name), str(tmp_path / "link.tsv")):
        code, out, err = cli(["search", q, str(folder), "--backend", "cpu", "-o", output], capsys)
        assert code == 1 and out == "" and err == (
            f"swcli: error: {output}: -o is the same file as DATABASE's {name}; the output would replace it\n")
    assert (folder / name).read_bytes() == kept and len(database.load(folder)) == 43


def test_makedb_refuses_an_existing_folder_and_search_another_alphabet(search_files, tmp_path, capsys):
    q, db = search_files
    (tmp_path / "taken").mkdir()
    code, out, err = cli(["makedb", db, str(tmp_path / "taken")], capsys)
    assert code == 1 and "already exists" in err and out == ""
    code, out, err = cli(["makedb", db, str(tmp_path / "missing" / "db")], capsys)
    assert code == 1 and err == f"swcli: error: {tmp_path}/missing/db: {tmp_path}/missing does not exist\n"
    code, out, err = cli(["makedb", db, f"{db}/db"], capsys)
    assert code == 1 and err == f"swcli: error: {db}/db: {db} is not a folder\n"
    code, out, err = cli(["makedb", db, ""], capsys)
    assert code == 1 and err == "swcli: error: FOLDER is empty: give the path of the new folder\n"
    if os.geteuid() != 0:  # root may write any folder
        (tmp_path / "locked").mkdir(mode=0o500)
        code, out, err = cli(["makedb", "/nonexistent.fa", str(tmp_path / "locked" / "db")], capsys)
        assert code == 1 and "is not writable for this user" in err  # before the FASTA is read
    assert cli(["makedb", db, str(tmp_path / "prepared")], capsys)[0] == 0
    out_path = tmp_path / "hits.tsv"
    code, out, err = cli(["search", q, str(tmp_path / "prepared"), "-m", "NUC.4.4", "--unknown-as", "N",
                          "-o", str(out_path)], capsys)
    assert code == 1 and "encoded for the alphabet" in err and not out_path.exists()
    assert "search it with --matrix BLOSUM62" in err


def test_makedb_with_a_matrix_file_hints_a_path_that_searches_from_elsewhere(search_files, tmp_path, capsys,
                                                                             monkeypatch):
    """A matrix file given with its folder: the folder keeps its absolute path, and the --matrix a refused
    search suggests works from another directory; once the file is gone there is no such hint."""
    import json

    from Bio.Align import substitution_matrices

    q, db = search_files
    (tmp_path / "matrices").mkdir()
    matrix_file = tmp_path / "matrices" / "b62.mat"
    matrix_file.write_text(str(substitution_matrices.load("BLOSUM62")))
    monkeypatch.chdir(tmp_path)
    assert cli(["makedb", db, "prepared", "--matrix", "matrices/b62.mat"], capsys)[0] == 0
    assert json.loads((tmp_path / "prepared" / "meta.json").read_text())["matrix"] == str(matrix_file)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    prepared = str(tmp_path / "prepared")
    code, _, err = cli(["search", q, prepared, "-m", "NUC.4.4", "--unknown-as", "N"], capsys)
    assert code == 1 and f"search it with --matrix {matrix_file}, or" in err and err.count("\n") == 1
    _, from_fasta, _ = cli(["search", q, db, "-t", "0", "--backend", "cpu"], capsys)
    code, hinted, _ = cli(["search", q, prepared, "--matrix", str(matrix_file), "-t", "0", "--backend", "cpu"],
                          capsys)
    assert code == 0 and hinted == from_fasta
    matrix_file.unlink()
    code, _, err = cli(["search", q, prepared, "-m", "NUC.4.4", "--unknown-as", "N"], capsys)
    assert code == 1 and f"(the matrix {matrix_file}, not found here with that alphabet)" in err
    assert "search it with" not in err


@pytest.mark.parametrize("quiet", [False, True])
def test_makedb_shows_its_reading_as_a_bar_of_bytes(search_files, tmp_path, capsys, monkeypatch, quiet):
    import swcli.commands

    monkeypatch.setattr(swcli.commands, "_progress_shown", lambda q: not q)  # as on a terminal
    _, db = search_files
    code, out, err = cli(["makedb", db, str(tmp_path / "db"), *(["-q"] if quiet else [])], capsys)
    assert code == 0 and out == "" and database.load(tmp_path / "db").residues > 0
    lines = err.replace("\r", "\n").splitlines()
    assert lines[-1].startswith(f"{tmp_path / 'db'}: ")
    assert quiet == (len(lines) == 1) and (quiet or any(line.startswith("100%") for line in lines))


def test_a_folder_that_is_not_a_database_is_named_as_such(search_files, tmp_path, capsys):
    q, _ = search_files
    (tmp_path / "empty").mkdir()
    code, out, err = cli(["search", q, str(tmp_path / "empty")], capsys)
    assert code == 1 and out == ""
    assert err == (f"swcli: error: {tmp_path / 'empty'}: a folder, but not a swcli database (no meta.json): give a "
                   "FASTA file, or a folder made by swcli makedb\n")


def test_search_bad_query_letter_is_refused_before_output(search_files, tmp_path, capsys):
    from swcli.testing import write_fasta

    _, db = search_files
    q = write_fasta(tmp_path / "bad.fa", [("a", "MKV"), ("b", "MK1V")])
    code, out, err = cli(["search", q, db, "--backend", "cpu"], capsys)
    assert code == 1 and out == "" and "bad.fa: record 2 (b): invalid letter '1' at position 3" in err
    assert cli(["search", q, db, "--top", "0"], capsys)[0] == 2


def test_search_rank_evalue_on_the_command_line(search_files, capsys):
    """--rank evalue: rows by ascending E-value, the best of align's all-vs-all pairs by E-value (align's
    E-value of a pair, times the sequences searched); the default ranking stays by score."""
    from swcli.testing import read_tsv

    q, db = search_files
    statistics = ["--lambda", "0.27", "--k", "0.04", "--alpha", "1.9", "--beta", "-30"]
    common = ["-t", "0", "--gap-open", "-12", "--gap-extend", "-1", "--backend", "cpu", *statistics]
    code, out, err = cli(["search", q, db, "-k", "4", "--rank", "evalue", *common, "--format-output",
                          "query,target,tlen,score,evalue"], capsys)
    assert code == 0 and "alpha 1.9, beta -30 (given)" in err
    rows = read_tsv(out)[1:]
    code, every, _ = cli(["align", q, db, "--all-vs-all", *common, "--no-header", "--format-output",
                          "query,target,tlen,score,evalue"], capsys)
    assert code == 0
    by_query: dict[str, list] = {}
    for k, row in enumerate(read_tsv(every)):
        by_query.setdefault(row[0], []).append((43 * float(row[4]), -float(row[3]), k % 43, row[1]))
    for query in by_query:
        mine = [row for row in rows if row[0] == query]
        assert [float(row[4]) for row in mine] == sorted(float(row[4]) for row in mine)
        best = sorted(by_query[query])[:4]
        assert [row[1] for row in mine] == [target for *_, target in best]
        assert [float(row[4]) for row in mine] == pytest.approx([e for e, *_ in best], rel=1e-2)  # 3 digits
    code, by_score, _ = cli(["search", q, db, "-k", "4", *common, "--format-output", "query,target,tlen,score,evalue"],
                            capsys)
    assert code == 0  # (these few hits come in the same order either way; test_rank_by_evalue_... has others)
    assert all(float(a[3]) >= float(b[3]) for a, b in zip(read_tsv(by_score)[1:], read_tsv(by_score)[2:])
               if a[0] == b[0])


@pytest.mark.parametrize("rank", ["score", "evalue"])
def test_max_evalue_keeps_the_rows_within_it(search_files, capsys, rank):
    """--max-evalue (SSEARCH's -E): of each query's best --top hits, the rows whose E-value is at most the
    limit, as they are without it; with the default columns too (the E-value is computed all the same)."""
    from swcli.testing import read_tsv

    q, db = search_files
    statistics = ["--lambda", "0.27", "--k", "0.04"]
    common = ["search", q, db, "-k", "20", "--rank", rank, "-t", "0", "--gap-open", "-12", "--gap-extend", "-1",
              "--backend", "cpu", "-q", *statistics]
    columns = ["--format-output", "query,target,qlen,tlen,score,evalue"]
    _, every, _ = cli([*common, *columns], capsys)
    evalues = sorted(float(row[5]) for row in read_tsv(every)[1:])
    limit = evalues[len(evalues) // 3]  # a limit some rows pass and most do not
    within = [row for row in read_tsv(every)[1:] if float(row[5]) <= limit]
    assert 0 < len(within) < len(evalues)
    code, out, err = cli([*common, *columns, "--max-evalue", repr(limit)], capsys)
    assert code == 0 and err == "" and read_tsv(out)[1:] == within
    code, plain, _ = cli([*common, "--max-evalue", repr(limit)], capsys)
    assert code == 0 and read_tsv(plain) == [row[:5] for row in read_tsv(out)]
    assert cli([*common, "--max-evalue", "-1"], capsys)[0] == 2
    code, _, err = cli(["search", q, db, "-t", "0", "--backend", "cpu", "--lambda", "0.27", "--k", "0.04"], capsys)
    assert code == 2 and "by --rank evalue and by --max-evalue" in err


def test_db_sequences_counts_the_evalues_for_a_whole_database(search_files, capsys):
    """--db-sequences N (SSEARCH's -Z): each E-value N / 43 times the one for the 43 sequences searched,
    the same hits and order; it goes only with what counts E-values."""
    from swcli.testing import read_tsv

    q, db = search_files
    common = ["search", q, db, "-k", "5", "-t", "0", "--gap-open", "-12", "--gap-extend", "-1", "--backend", "cpu",
              "--lambda", "0.27", "--k", "0.04", "--rank", "evalue", "--format-output", "query,target,score,evalue"]
    _, searched, _ = cli(common, capsys)
    code, whole, err = cli([*common, "--db-sequences", "43000"], capsys)
    assert code == 0 and "E-values for 43,000 database sequences (given)" in err
    mine, theirs = read_tsv(whole)[1:], read_tsv(searched)[1:]
    assert [row[:3] for row in mine] == [row[:3] for row in theirs]
    assert [float(row[3]) for row in mine] == pytest.approx([1000 * float(row[3]) for row in theirs], rel=2e-2)
    code, _, err = cli(["search", q, db, "-t", "0", "--backend", "cpu", "--db-sequences", "5"], capsys)
    assert code == 2 and "--db-sequences counts E-values" in err
    assert cli([*common, "--db-sequences", "0"], capsys)[0] == 2


def test_search_of_an_empty_database_folder_writes_no_hits(search_files, tmp_path, capsys):
    """An empty database (saved by the library; makedb refuses a FASTA without records): a header only, with
    E-values too (nothing searched: no hit and no E-value to compute)."""
    q, _ = search_files
    database.save(database.build([], load_matrix("BLOSUM62"), "empty.fa"), tmp_path / "empty")
    for extra in ([], ["--rank", "evalue", "--format-output", "query,target,score,evalue"]):
        code, out, err = cli(["search", q, str(tmp_path / "empty"), "-t", "0", "--gap-open", "-11", "--gap-extend",
                              "-1", "--backend", "cpu", "-q", *extra], capsys)
        assert code == 0 and len(out.splitlines()) == 1 and "Traceback" not in err


def test_a_bad_query_is_said_before_lambda_and_k_are_estimated(search_files, tmp_path, capsys, monkeypatch):
    _, db = search_files
    (tmp_path / "q.fa").write_text(">q\nMKV1\n")

    def parameters(*args, **kwargs):
        raise AssertionError("lambda and K estimated before the queries were read")

    monkeypatch.setattr("swcli.statistics.parameters", parameters)
    code, out, err = cli(["search", str(tmp_path / "q.fa"), db, "--backend", "cpu", "--gap-open", "-11",
                          "--gap-extend", "-1", "--format-output", "query,target,evalue"], capsys)
    assert code == 1 and out == "" and err.startswith(f"swcli: error: {tmp_path / 'q.fa'}: record 1 (q): invalid "
                                                      "letter '1' at position 4")
