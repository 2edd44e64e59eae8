"""batching.py: padding from codes without per-pair loops, length sorting, the cell and residue budgets."""

import random

import torch

from swcli.batching import DEFAULT_MAX_RESIDUES, chunked, make_batches, pad_codes


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


def test_pad_codes():
    codes, lengths = pad_codes([b"\x01\x02\x03", b"\x04", b"\x05\x06"])
    assert lengths.tolist() == [3, 1, 2]
    assert codes.dtype == torch.uint8
    assert codes.tolist() == [[1, 2, 3], [4, 0, 0], [5, 6, 0]]
    empty, none = pad_codes([])
    assert empty.shape == (0, 0) and none.tolist() == []


def test_batches_cover_every_pair_once_sorted_and_within_budget():
    rng = random.Random(3)
    queries = [bytes(rng.randrange(20) for _ in range(rng.randint(1, 60))) for _ in range(200)]
    targets = [bytes(rng.randrange(20) for _ in range(rng.randint(1, 60))) for _ in range(200)]
    batches = make_batches(queries, targets, max_cells=20_000)
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
    batches = make_batches([b"\x00" * 100, b"\x00"], [b"\x00" * 100, b"\x00"], max_cells=50)
    assert sorted(len(b.positions) for b in batches) == [1, 1]


def test_a_budget_that_holds_the_chunk_gives_one_batch():
    rng = random.Random(4)
    queries = [bytes(rng.randrange(20) for _ in range(rng.randint(1, 40))) for _ in range(100)]
    targets = [bytes(rng.randrange(20) for _ in range(rng.randint(1, 40))) for _ in range(100)]
    whole = 100 * max(map(len, queries)) * max(map(len, targets))
    order = sorted(range(100), key=lambda k: (len(queries[k]), len(targets[k])))
    for budget in (1 << 62, whole):
        (batch,) = make_batches(queries, targets, max_cells=budget)
        assert batch.positions == order
        assert batch.query_codes.shape == (100, max(map(len, queries)))
    assert len(make_batches(queries, targets, max_cells=whole - 1)) > 1


def test_residue_budget_cuts_batches():
    rng = random.Random(6)
    queries = [bytes(rng.randrange(20) for _ in range(rng.randint(1, 60))) for _ in range(300)]
    targets = [bytes(rng.randrange(20) for _ in range(rng.randint(1, 60))) for _ in range(300)]
    batches = make_batches(queries, targets, max_cells=1 << 62, max_residues=2_000)
    assert sorted(p for b in batches for p in b.positions) == list(range(300))
    assert len(batches) > 1
    assert all(padded_residues(b) <= 2_000 for b in batches)
    (whole,) = make_batches(queries, targets, max_cells=1 << 62, max_residues=1 << 62)
    assert len(whole.positions) == 300


def test_one_long_pair_among_short_ones_is_a_batch_of_its_own():
    # The padding blow-up: without a residue budget, the compiled engines' batches (no cell cap) padded
    # every row of the chunk to the longest record: 4,096 pairs with one 1,000,000-residue query took
    # 4.25 GB. Here 1,024 pairs and one 20,000-residue query: 20.8 M padded residues in one batch.
    queries, targets = short_pairs_and_one_long(1024, 20_000)
    batches = make_batches(queries, targets, max_cells=1 << 62)  # as the pipeline calls it for cpu/cuda
    long_batch = next(b for b in batches if 1024 // 2 in b.positions)
    assert long_batch.positions == [1024 // 2]
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
