"""pipeline.py: chunked scoring in input order, and the counters behind progress and the benchmark."""

import torch

from swcli.fasta import FastaRecord
from swcli.pipeline import Settings, Stats, align
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


def test_chunking_and_batching_do_not_change_scores():
    pairs = records(random_protein_pairs(22, 30, 1, 70))
    matrix = load_matrix("BLOSUM62")
    one = [r.score for r in align(pairs, Settings(matrix, chunk_size=1, backend="cpu"))]
    many = [r.score for r in align(pairs, Settings(matrix, chunk_size=1000, backend="cpu", max_cells=500))]
    assert one == many
