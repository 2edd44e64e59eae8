"""batching.py: padding from codes without per-pair loops, length sorting, the cell budget."""

import random

import torch

from swcli.batching import chunked, make_batches, pad_codes


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
