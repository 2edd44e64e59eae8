"""batching.py: padding from codes without per-pair loops, length sorting, the cell and residue budgets."""

import random

import numpy as np
import torch

from swcli.batching import DEFAULT_MAX_RESIDUES, Codes, batches_of, chunked, gather_rows, pad_rows, plan_batches


def padded_residues(batch) -> int:
    return batch.query_codes.numel() + batch.target_codes.numel()


def short_pairs_and_one_long(count: int, long_length: int, seed: int = 5):
    """count - 1 pairs of 50-300 residues each, and one whose query has long_length residues, placed
    in the middle (the order must not matter)."""
    rng = random.Random(seed)
    queries = [bytes(rng.randrange(20) for _ in range(rng.randint(50, 300))) for _ in range(count - 1)]
    targets = [bytes(rng.randrange(20) for _ in range(rng.randint(50, 300))) for _ in range(count)]
    queries.insert(count // 2, bytes(rng.randrange(20) for _ in range(long_length)))
    return queries, targets


def test_chunked_is_lazy_and_complete():
    consumed = []

    def items():
        for k in range(10):
            consumed.append(k)
            yield k

    chunks = chunked(items(), 4)
    assert next(chunks) == [0, 1, 2, 3] and consumed == [0, 1, 2, 3]
    assert list(chunks) == [[4, 5, 6, 7], [8, 9]]


def test_pad_rows_gathers_any_rows_in_any_order():
    codes = Codes.of_list([b"\x01\x02\x03", b"\x04", b"\x05\x06"])
    starts, lengths = torch.tensor([3, 0, 4, 0]), torch.tensor([1, 3, 2, 0])
    padded = pad_rows(codes, starts, lengths, 3)
    assert padded.dtype == torch.uint8
    assert padded.tolist() == [[4, 0, 0], [1, 2, 3], [5, 6, 0], [0, 0, 0]]
    assert pad_rows(codes, starts[:0], lengths[:0], 0).shape == (0, 0)
    assert pad_rows(Codes.of_list([]), torch.tensor([0]), torch.tensor([0]), 0).shape == (1, 0)


def test_the_host_copy_and_the_device_gather_pad_alike():
    rng = np.random.default_rng(2)
    sizes = rng.integers(0, 70, 500)
    codes = Codes.of_list([bytes(rng.integers(1, 25, n).astype(np.uint8)) for n in sizes])
    pick = torch.from_numpy(rng.integers(0, 500, 300))
    starts, lengths = torch.from_numpy(codes.offsets)[pick], torch.from_numpy(sizes)[pick]
    for width in (int(lengths.max()), 90):
        host = pad_rows(codes, starts, lengths, width)
        assert torch.equal(host, gather_rows(codes.flat, starts, lengths, width))
        assert all(host[r, :n].tolist() == codes.flat[s:s + n].tolist() and not host[r, n:].any()
                   for r, (s, n) in enumerate(zip(starts.tolist(), lengths.tolist())))


def greedy_groups(q, t, max_cells, max_residues):
    """The batch cut, one pair at a time: the rule plan_batches applies with array operations."""
    order = sorted(range(len(q)), key=lambda k: (q[k], t[k]))
    groups, rows, cols = [], 0, 0
    for k in order:
        grown_rows, grown_cols = max(rows, q[k]), max(cols, t[k])
        size = len(groups[-1]) + 1 if groups else 1
        if groups and size * grown_rows * grown_cols <= max_cells and size * (grown_rows + grown_cols) <= max_residues:
            groups[-1].append(k)
            rows, cols = grown_rows, grown_cols
        else:
            groups.append([k])
            rows, cols = q[k], t[k]
    return groups


def test_plan_batches_is_the_greedy_cut():
    rng = np.random.default_rng(8)
    for n, top, cells, residues in [(10, 50, 2_000, 1 << 30), (3000, 400, 1 << 62, 100_000),
                                    (20_000, 30, 1 << 62, 1 << 62), (20_000, 3000, 5_000_000, 1 << 20), (0, 5, 10, 10)]:
        q, t = rng.integers(1, top, n), rng.integers(1, top, n)
        got = [g.tolist() for g in plan_batches(q, t, cells, residues)]
        assert got == greedy_groups(q.tolist(), t.tolist(), cells, residues)


def test_batches_cover_every_pair_once_sorted_and_within_budget():
    rng = random.Random(3)
    queries = [bytes(rng.randrange(20) for _ in range(rng.randint(1, 60))) for _ in range(200)]
    targets = [bytes(rng.randrange(20) for _ in range(rng.randint(1, 60))) for _ in range(200)]
    batches = batches_of(queries, targets, max_cells=20_000)
    positions = [p for b in batches for p in b.positions]
    assert sorted(positions) == list(range(200))
    assert [len(queries[p]) for p in positions] == sorted(len(q) for q in queries)
    for batch in batches:
        b, M = batch.query_codes.shape
        N = batch.target_codes.shape[1]
        assert b * M * N <= 20_000 or b == 1
        assert b * (M + N) <= DEFAULT_MAX_RESIDUES
        for row, p in enumerate(batch.positions):
            assert bytes(batch.query_codes[row, : len(queries[p])].tolist()) == queries[p]
            assert bytes(batch.target_codes[row, : len(targets[p])].tolist()) == targets[p]
            assert batch.query_lengths[row] == len(queries[p]) and batch.target_lengths[row] == len(targets[p])
        assert batch.cells == sum(len(queries[p]) * len(targets[p]) for p in batch.positions)


def test_one_pair_over_budget_gets_a_batch_of_its_own():
    batches = batches_of([b"\x00" * 100, b"\x00"], [b"\x00" * 100, b"\x00"], max_cells=50)
    assert sorted(len(b.positions) for b in batches) == [1, 1]


def test_a_budget_that_holds_the_chunk_gives_one_batch():
    rng = random.Random(4)
    queries = [bytes(rng.randrange(20) for _ in range(rng.randint(1, 40))) for _ in range(100)]
    targets = [bytes(rng.randrange(20) for _ in range(rng.randint(1, 40))) for _ in range(100)]
    whole = 100 * max(map(len, queries)) * max(map(len, targets))
    order = sorted(range(100), key=lambda k: (len(queries[k]), len(targets[k])))
    for budget in (1 << 62, whole):
        (batch,) = batches_of(queries, targets, max_cells=budget)
        assert batch.positions.tolist() == order
        assert batch.query_codes.shape == (100, max(map(len, queries)))
    assert len(batches_of(queries, targets, max_cells=whole - 1)) > 1


def test_residue_budget_cuts_batches():
    rng = random.Random(6)
    queries = [bytes(rng.randrange(20) for _ in range(rng.randint(1, 60))) for _ in range(300)]
    targets = [bytes(rng.randrange(20) for _ in range(rng.randint(1, 60))) for _ in range(300)]
    batches = batches_of(queries, targets, max_cells=1 << 62, max_residues=2_000)
    assert sorted(p for b in batches for p in b.positions) == list(range(300))
    assert len(batches) > 1
    assert all(padded_residues(b) <= 2_000 for b in batches)
    (whole,) = batches_of(queries, targets, max_cells=1 << 62, max_residues=1 << 62)
    assert len(whole.positions) == 300


def test_one_long_pair_among_short_ones_is_a_batch_of_its_own():
    # The padding blow-up: without a residue budget, the compiled engines' batches (no cell cap) padded
    # every row of the chunk to the longest record: 4,096 pairs with one 1,000,000-residue query took
    # 4.25 GB. Here 1,024 pairs and one 20,000-residue query: 20.8 M padded residues in one batch.
    queries, targets = short_pairs_and_one_long(1024, 20_000)
    batches = batches_of(queries, targets, max_cells=1 << 62)  # as the pipeline calls it for cpu/cuda
    long_batch = next(b for b in batches if 1024 // 2 in b.positions)
    assert long_batch.positions.tolist() == [1024 // 2]
    assert long_batch.query_codes.shape == (1, 20_000)
    real = sum(map(len, queries)) + sum(map(len, targets))
    assert sum(padded_residues(b) for b in batches) <= 2 * real
    assert all(padded_residues(b) <= DEFAULT_MAX_RESIDUES or len(b.positions) == 1 for b in batches)
    assert sorted(p for b in batches for p in b.positions) == list(range(1024))


def test_pipeline_batches_stay_under_the_residue_budget():
    # encode_chunk, as `swcli align` calls it for the compiled engines (no cell cap), with the default
    # residue budget: the chunk's padded codes stay near its real residues.
    from swcli.fasta import FastaRecord
    from swcli.pipeline import Settings, encode_chunk
    from swcli.scoring import load_matrix

    letters = "ACDEFGHIKLMNPQRSTVWY"
    queries, targets = short_pairs_and_one_long(1024, 20_000)
    chunk = [(FastaRecord("q", k + 1, f"q{k}", "".join(letters[c] for c in q)),
              FastaRecord("t", k + 1, f"t{k}", "".join(letters[c] for c in t)))
             for k, (q, t) in enumerate(zip(queries, targets))]
    batches = encode_chunk(chunk, Settings(load_matrix("BLOSUM62"), backend="cpu"))
    real = sum(map(len, queries)) + sum(map(len, targets))
    assert sum(padded_residues(b) for b in batches) <= 2 * real
    assert all(padded_residues(b) <= DEFAULT_MAX_RESIDUES or len(b.positions) == 1 for b in batches)
