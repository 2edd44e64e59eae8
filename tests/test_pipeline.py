"""pipeline.py: chunked scoring in input order, and the counters behind progress and the benchmark."""

import time

import numpy as np
import pytest
import torch

from swcli.fasta import FastaRecord, PairChunk
from swcli.pipeline import Settings, Stats, align, align_chunks
from swcli.scoring import load_matrix
from swcli.testing import random_protein_pairs, score_matrices


def records(pairs):
    return [(FastaRecord("x", 2 * k + 1, f"q{k}", q), FastaRecord("x", 2 * k + 2, f"t{k}", t))
            for k, (q, t) in enumerate(pairs)]


def test_scores_in_input_order_and_stats():
    pairs = random_protein_pairs(21, 40, 1, 90)
    settings = Settings(load_matrix("BLOSUM62"), gap=-2.0, temperature=0.7, backend="cpu", chunk_size=7,
                        max_cells=3000)
    stats = Stats()
    chunks = []
    results = list(align(records(pairs), settings, stats, on_chunk=lambda s: chunks.append(s.pairs)))
    assert [r.query.id for r in results] == [f"q{k}" for k in range(40)]
    S, qlen, tlen = score_matrices(pairs)
    from swcli import soft_smith_waterman

    expected = soft_smith_waterman(S, -2.0, 0.7, qlen, tlen, backend="reference")
    got = torch.tensor([r.score for r in results], dtype=torch.float64)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-4)
    assert chunks == [7, 14, 21, 28, 35, 40, 40][: len(chunks)] and chunks[-1] == 40
    assert stats.pairs == 40 and stats.cells == int((qlen * tlen).sum())
    assert 0 < stats.kernel_seconds <= stats.seconds


def test_affine_settings_score_with_the_affine_op():
    pairs = random_protein_pairs(24, 25, 1, 70)
    settings = Settings(load_matrix("BLOSUM62"), None, 0.7, "cpu", chunk_size=6, max_cells=2000, gap_open=-11.0,
                        gap_extend=-1.0)
    assert settings.gaps.affine and settings.gaps.describe() == "affine gaps: open -11, extend -1"
    results = list(align(records(pairs), settings))
    S, qlen, tlen = score_matrices(pairs)
    from swcli import soft_smith_waterman

    expected = soft_smith_waterman(S, None, 0.7, qlen, tlen, backend="reference", gap_open=-11.0, gap_extend=-1.0)
    got = torch.tensor([r.score for r in results], dtype=torch.float64)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-4)
    linear = torch.tensor([r.score for r in align(records(pairs), Settings(load_matrix("BLOSUM62"), -11.0, 0.7,
                                                                           "cpu"))])
    assert not torch.allclose(got, linear.double())
    with pytest.raises(ValueError, match="both gap_open and gap_extend"):
        Settings(load_matrix("BLOSUM62"), gap_open=-11.0)


def test_chunking_and_batching_do_not_change_scores():
    pairs = records(random_protein_pairs(22, 30, 1, 70))
    matrix = load_matrix("BLOSUM62")
    one = [r.score for r in align(pairs, Settings(matrix, chunk_size=1, backend="cpu"))]
    many = [r.score for r in align(pairs, Settings(matrix, chunk_size=1000, backend="cpu", max_cells=500))]
    assert one == many


def test_align_chunks_yields_each_chunk_in_order_with_its_scores():
    pairs = records(random_protein_pairs(23, 10, 1, 30))
    settings = Settings(load_matrix("BLOSUM62"), temperature=0.5, backend="cpu")
    chunks = [PairChunk.of(pairs[k:k + 4]) for k in range(0, 10, 4)]
    results = list(align_chunks(chunks, settings))
    assert [chunk for chunk, _ in results] == chunks and [len(s) for _, s in results] == [4, 4, 2]
    expected = [r.score for r in align(pairs, settings)]
    assert np.concatenate([s for _, s in results]).tolist() == expected


def slow_scoring(monkeypatch, seconds, release=None):
    """score_batches that takes `seconds` (or until `release` is set) in the scoring thread."""
    import swcli.pipeline

    real = swcli.pipeline.score_batches

    def slow(*args, **kwargs):
        if release is not None:
            release.wait(seconds)
        else:
            time.sleep(seconds)
        return real(*args, **kwargs)

    monkeypatch.setattr(swcli.pipeline, "score_batches", slow)


def test_the_wait_for_scores_is_in_short_steps_that_check_for_a_signal(monkeypatch):
    import swcli.interrupt

    checks = []
    monkeypatch.setattr(swcli.interrupt, "check", lambda: checks.append(time.monotonic()))
    slow_scoring(monkeypatch, 0.5)
    pairs = records(random_protein_pairs(24, 2, 1, 20))
    results = list(align(pairs, Settings(load_matrix("BLOSUM62"), backend="cpu")))
    assert len(results) == 2
    assert len(checks) >= 3 and max(b - a for a, b in zip(checks, checks[1:])) < 0.3


def test_an_error_does_not_wait_for_the_engine_call_in_progress(monkeypatch):
    import threading

    from swcli.errors import SwcliError
    from swcli.pipeline import scoring_in_progress

    release = threading.Event()
    slow_scoring(monkeypatch, 10.0, release)

    def pairs():
        yield from records(random_protein_pairs(25, 2, 1, 20))
        raise SwcliError("a bad record after the first chunk")

    started = time.monotonic()
    try:
        with pytest.raises(SwcliError, match="bad record"):
            list(align(pairs(), Settings(load_matrix("BLOSUM62"), chunk_size=2, backend="cpu")))
        assert time.monotonic() - started < 2.0  # not the 10 s of the call in progress
        assert scoring_in_progress()
    finally:
        release.set()
    deadline = time.monotonic() + 10
    while scoring_in_progress() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not scoring_in_progress()


def test_the_scoring_thread_runs_on_the_callers_gpu(monkeypatch):
    """A thread's current CUDA device is its own (a new one's is GPU 0): the worker takes its creator's,
    as a distributed rank on GPU 3 needs. Checked through the calls, so without a GPU."""
    from swcli.pipeline import scoring_pool

    calls = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    for device, expected in ((torch.device("cpu"), []), (torch.device("cuda"), [3])):
        calls.clear()
        pool = scoring_pool(device, "swcli-test")
        try:
            pool.submit(lambda: None).result()
        finally:
            pool.shutdown()
        assert calls == expected
