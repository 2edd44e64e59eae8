"""The alignment details (swcli/details.py, kernels/host/traceback.cpp) against Biopython's optimal
alignment and the CPU engine's t = 0 backward, and the --format-output columns on the command line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from Bio.Align import PairwiseAligner

from swcli import _host
from swcli.details import COLUMNS, parse_columns
from swcli.scoring import load_matrix
from swcli.testing import BLOSUM62, example_protein_pairs, read_tsv, related_protein_pairs, write_fasta
from swcli.testing import run_cli as cli

MATRIX = load_matrix("BLOSUM62")
TABLE = np.asarray(MATRIX.scores, dtype=np.float32)
# (gap_open, gap_extend): affine BLAST 11/1 and 10/2, and linear -8 (equal scores)
GAPS = [(-12.0, -1.0), (-10.0, -2.0), (-8.0, -8.0)]


def held_out_pairs():
    """Random pairs of different example proteins (not the file's own 20 pairs) and mutated copies."""
    return example_protein_pairs(80, seed=5)[20:] + related_protein_pairs(3, 30, 40, 250)


def codes_of(pairs):
    query = [np.frombuffer(MATRIX.encode(q, lambda: "q"), np.uint8) for q, _ in pairs]
    target = [np.frombuffer(MATRIX.encode(t, lambda: "t"), np.uint8) for _, t in pairs]
    starts = lambda parts: np.cumsum([0] + [len(p) for p in parts])[:-1]  # noqa: E731
    return (np.concatenate(query), starts(query), [len(q) for q in query],
            np.concatenate(target), starts(target), [len(t) for t in target])


def traceback(pairs, gap_open, gap_extend, band_rows=0):
    return _host.traceback(*codes_of(pairs), TABLE, gap_open, gap_extend, 2, band_rows)


def operations(alignments, k) -> str:
    start = alignments.op_offsets[k]
    return alignments.ops[start:start + alignments.op_lengths[k]].tobytes().decode()


def rescore(query, target, ops, qstart, tstart, gap_open, gap_extend) -> float:
    """The score of an alignment given by its operations: the CIGAR re-scored."""
    i, j, score, previous = qstart - 1, tstart - 1, 0.0, "M"
    for op in ops:
        if op == "M":
            score += MATRIX.score(query[i], target[j])
            i, j = i + 1, j + 1
        else:
            score += gap_extend if op == previous else gap_open
            i, j = (i + 1, j) if op == "I" else (i, j + 1)
        previous = op
    return score


@pytest.mark.parametrize("gap_open,gap_extend", GAPS)
def test_unique_optima_equal_biopython(gap_open, gap_extend):
    pairs = held_out_pairs()
    alignments = traceback(pairs, gap_open, gap_extend)
    aligner = PairwiseAligner(mode="local", substitution_matrix=BLOSUM62, open_gap_score=gap_open,
                              extend_gap_score=gap_extend)
    unique = 0
    for k, (query, target) in enumerate(pairs):
        found = aligner.align(query, target)
        assert alignments.scores[k] == found.score
        ops = operations(alignments, k)
        qstart, qend, tstart, tend = alignments.ends[k]
        assert rescore(query, target, ops, qstart, tstart, gap_open, gap_extend) == found.score
        if len(found) != 1:
            continue
        unique += 1
        best = found[0]
        coordinates, counts = best.coordinates, best.counts()
        assert (qstart, qend, tstart, tend) == (coordinates[0][0] + 1, coordinates[0][-1],
                                                coordinates[1][0] + 1, coordinates[1][-1])
        assert len(ops) == best.length
        assert tuple(alignments.counts[k]) == (counts.identities, counts.mismatches, counts.open_gaps, counts.gaps)
    assert unique >= 20  # the comparison above is not vacuous


@pytest.mark.parametrize("gap_open,gap_extend", [(-12.0, -1.0), (-4.0, -4.0)])
def test_match_cells_are_the_engine_t0_gradient(gap_open, gap_extend):
    """The second oracle: at t = 0 the CPU engine's backward is the indicator of the alignment's matches,
    ties included (linear -4 has many)."""
    from swcli.ops import soft_smith_waterman
    from swcli.testing import score_matrices

    pairs = held_out_pairs()[:40]
    S, qlen, tlen = score_matrices(pairs, dtype=torch.float32)
    S.requires_grad_(True)
    gaps = dict(gap=gap_open) if gap_open == gap_extend else dict(gap_open=gap_open, gap_extend=gap_extend)
    scores = soft_smith_waterman(S, temperature=0.0, query_lengths=qlen, target_lengths=tlen, backend="cpu", **gaps)
    scores.sum().backward()
    alignments = traceback(pairs, gap_open, gap_extend)
    assert np.array_equal(alignments.scores, scores.detach().numpy())
    for k in range(len(pairs)):
        marked = np.zeros(S.shape[1:], dtype=np.float32)
        i, j = alignments.ends[k][0] - 1, alignments.ends[k][2] - 1
        for op in operations(alignments, k):
            if op == "M":
                marked[i, j] = 1
            i, j = i + (op != "D"), j + (op != "I")
        assert np.array_equal(marked, S.grad[k].numpy()), k


@pytest.mark.parametrize("gap_open,gap_extend", [(-12.0, -1.0), (-4.0, -4.0)])
def test_bands_swept_again_give_the_same_alignment(gap_open, gap_extend):
    pairs = related_protein_pairs(4, 12, 100, 300)
    whole, banded = traceback(pairs, gap_open, gap_extend), traceback(pairs, gap_open, gap_extend, band_rows=7)
    for field in ("scores", "ends", "counts", "op_lengths"):
        assert np.array_equal(getattr(whole, field), getattr(banded, field))
    assert all(operations(whole, k) == operations(banded, k) for k in range(len(pairs)))


def random_code_pairs(rng, count: int, alphabet: int, longest: int):
    """Flat codes, starts and lengths of `count` random pairs (lengths 0 .. longest, some of 0 to 3)."""
    query_lengths = rng.integers(0, longest + 1, count)
    query_lengths[: count // 4] = rng.integers(0, 4, count // 4)
    target_lengths = rng.integers(0, longest + 1, count)
    starts = lambda lengths: np.concatenate([[0], np.cumsum(lengths)[:-1]])  # noqa: E731
    query = rng.integers(0, alphabet, int(query_lengths.sum()) + 1).astype(np.uint8)
    target = rng.integers(0, alphabet, int(target_lengths.sum()) + 1).astype(np.uint8)
    return query, starts(query_lengths), query_lengths, target, starts(target_lengths), target_lengths


def same_tracebacks(a, b) -> bool:
    fields = ("scores", "ends", "counts", "op_lengths")
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in fields) and all(
        operations(a, k) == operations(b, k) for k in range(len(a.scores)))


@pytest.mark.parametrize("seed", range(3))
def test_integer_sweep_equals_the_float_sweep_byte_for_byte(seed):
    """The vector integer sweep against the cell-by-cell float one on fresh random integer matrices:
    small alphabets and narrow score ranges (ties everywhere), zero and positive-free gaps, linear and
    affine, lengths 0 to 70 (vectors cut short at the row's end), whole and banded walks."""
    rng = np.random.default_rng([seed, 41])
    empty = gapped = 0
    for _ in range(40):
        alphabet = int(rng.integers(1, 26))
        low, high = sorted(rng.integers(-5, 6, 2))
        table = rng.integers(low, high + 1, (alphabet, alphabet)).astype(np.float32)
        extend = -float(rng.integers(0, 4))
        gap_open = extend if rng.random() < 0.5 else extend - float(rng.integers(1, 8))
        band_rows = int(rng.choice([0, 1, 3, 16]))
        pairs = random_code_pairs(rng, 8, alphabet, 70)
        vector = _host.traceback(*pairs, table, gap_open, extend, 2, band_rows)
        scalar = _host.traceback(*pairs, table, gap_open, extend, 1, band_rows, integer_sweep=False)
        assert same_tracebacks(vector, scalar), (alphabet, gap_open, extend, band_rows)
        lengths = np.minimum(pairs[2], pairs[5])
        empty += int(np.sum((vector.op_lengths == 0) & (lengths > 0)))
        gapped += int(np.sum(vector.counts[:, 3] > 0))
    assert empty > 0 and gapped > 0  # empty alignments of non-empty pairs, and gaps, were compared


def test_fractional_scores_and_sums_past_2_24_stay_on_the_float_sweep():
    """Where int32 would not give float32's numbers the float sweep runs, whatever integer_sweep says:
    scores that are not whole numbers, and whole numbers whose sums round in float32."""
    rng = np.random.default_rng(9)
    pairs = random_code_pairs(rng, 6, 24, 60)
    fractional = _host.traceback(*pairs, TABLE + np.float32(0.25), -3.5, -0.75, 2)
    assert same_tracebacks(fractional, _host.traceback(*pairs, TABLE + np.float32(0.25), -3.5, -0.75, 1,
                                                       integer_sweep=False))
    assert np.any(fractional.scores != np.round(fractional.scores))
    # whole numbers past 2^24 (found by search): int32 would make this score 29,360,132, float32 rounds
    table = np.array([[-4194307, 8388611], [8388606, 4194303]], dtype=np.float32)
    big = _host.traceback(np.array([0, 1, 0, 1], np.uint8), [0], [4], np.array([1, 1, 1, 0], np.uint8), [0], [4],
                          table, -2.0, -2.0, 1)
    assert float(big.scores[0]) == 29_360_130.0


def test_text_columns_and_the_empty_alignment():
    pairs = [("MKVLAAGIVALLLAAGCSSSKEETP", "MKVLAGIVAWLLAAGCSKEETPQ"), ("W", "G"), ("", "AC")]
    alignments = traceback(pairs, -4.0, -4.0)
    cigar, offsets = _host.cigars(alignments)
    cigars = [cigar[offsets[k]:offsets[k + 1]].tobytes().decode() for k in range(3)]
    assert cigars[1:] == ["*", "*"]
    assert tuple(alignments.ends[1]) == (0, 0, 0, 0) and alignments.scores[1] == 0
    codes = codes_of(pairs[:1])
    qaln, _ = _host.aligned_text(alignments, codes[0], codes[1], alignments.ends[:1, 0] - 1, MATRIX.alphabet, b"I")
    taln, _ = _host.aligned_text(alignments, codes[3], codes[4], alignments.ends[:1, 2] - 1, MATRIX.alphabet, b"D")
    qaln, taln = qaln[:alignments.op_lengths[0]].tobytes().decode(), taln[:alignments.op_lengths[0]].tobytes().decode()
    qstart, qend, tstart, tend = alignments.ends[0]
    assert qaln.replace("-", "") == pairs[0][0][qstart - 1:qend]
    assert taln.replace("-", "") == pairs[0][1][tstart - 1:tend]
    runs = "".join(int(n) * op for n, op in __import__("re").findall(r"(\d+)([MID])", cigars[0]))
    assert runs == operations(alignments, 0)


@pytest.mark.parametrize("identical,length", [(23, 80), (49, 80), (1, 3), (2, 3), (1, 8), (7, 7), (0, 5)])
def test_identity_is_rounded_half_up_from_the_counts(tmp_path, capsys, identical, length):
    """fident and pident from nident and alnlen exactly: 23 / 80 is 0.288 and 28.8, where a float quotient
    printed 0.287 and 28.7."""
    query, target = "W" * identical + "I" * (length - identical), "W" * identical + "V" * (length - identical)
    fasta = write_fasta(tmp_path / "p.fa", [("q", query), ("t", target)])
    code, out, err = cli(["align", fasta, "-t", "0", "--backend", "cpu", "--format-output",
                          "alnlen,nident,fident,pident"], capsys)
    thousandths = (2000 * identical + length) // (2 * length)
    assert code == 0 and out.splitlines()[1].split("\t") == [
        str(length), str(identical), f"{thousandths // 1000}.{thousandths % 1000:03d}",
        f"{thousandths // 10}.{thousandths % 10}"]


def test_parse_columns_keeps_the_order():
    assert parse_columns("evalue,query, cigar") == ("evalue", "query", "cigar")
    assert len(COLUMNS) == 21


@pytest.mark.parametrize("value,message", [
    ("query,bogus", "unknown column 'bogus'"),
    ("query,,score", "an empty name"),
    ("query,score,query", "column 'query' is given twice"),
])
def test_bad_format_output_is_a_usage_error(tmp_path, capsys, value, message):
    fasta = write_fasta(tmp_path / "p.fa", [("a", "MKV"), ("b", "MKV")])
    out = tmp_path / "out.tsv"
    for command in (["align", fasta], ["search", fasta, fasta]):
        code, stdout, err = cli([*command, "--format-output", value, "-o", str(out)], capsys)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1
        assert not out.exists() and stdout == ""


@pytest.mark.parametrize("options,message", [
    (["--format-output", "query,evalue", "--lambda", "0.3"], "--lambda and --k go together"),
    (["--lambda", "0.3", "--k", "0.04"], "used only by the evalue and bits"),
    (["--format-output", "evalue", "--lambda", "-1", "--k", "0.04"], "not a finite number > 0"),
    (["--format-output", "evalue", "--lambda", "0.3", "--k", "0.04", "--alpha", "1.9"], "--alpha and --beta go"),
    (["--format-output", "evalue", "--alpha", "1.9", "--beta", "-30"], "go with --lambda and --k"),
    (["--format-output", "evalue", "--lambda", "0.3", "--k", "0.04", "--alpha", "0", "--beta", "-30"],
     "not a finite number > 0"),
    (["--format-output", "evalue", "--lambda", "0.3", "--k", "0.04", "--alpha", "1", "--beta", "nan"],
     "not a finite number"),
])
def test_bad_lambda_k_alpha_and_beta_are_usage_errors(tmp_path, capsys, options, message):
    fasta = write_fasta(tmp_path / "p.fa", [("a", "MKV"), ("b", "MKV")])
    out = tmp_path / "out.tsv"
    for command in (["align", fasta], ["search", fasta, fasta]):
        code, stdout, err = cli([*command, *options, "-o", str(out)], capsys)
        assert code == 2 and message in err and stdout == "" and not out.exists()


def test_rank_is_checked_and_needs_statistics_only_for_evalue(tmp_path, capsys, monkeypatch):
    from swcli import statistics

    fasta = write_fasta(tmp_path / "p.fa", [("a", "MKVLA"), ("b", "MKVLW")])
    code, _, err = cli(["search", fasta, fasta, "--rank", "bogus"], capsys)
    assert code == 2 and "--rank" in err
    code, out, err = cli(["search", fasta, fasta, "--rank", "evalue", "--lambda", "0.3", "--k", "0.04", "-q",
                          "--backend", "cpu"], capsys)
    assert code == 0 and out.splitlines()[0] == "query\ttarget\tqlen\ttlen\tscore" and err == ""
    monkeypatch.setattr(statistics, "cache_path", lambda s, *rest: tmp_path / "cache.json")
    monkeypatch.setattr(statistics, "ESTIMATION_PAIRS", 400)
    out_file = tmp_path / "out.tsv"
    code, _, err = cli(["search", fasta, fasta, "--rank", "evalue", "--gap", "-4", "-o", str(out_file),
                        "--backend", "cpu"], capsys)
    assert code == 1 and "E-values are not defined" in err and not out_file.exists()


def test_align_and_search_write_the_same_details(tmp_path, capsys):
    """A search hit's columns are align's for the same pair; E-values differ by the database's size."""
    pairs = related_protein_pairs(8, 3, 60, 120)
    queries = write_fasta(tmp_path / "q.fa", [(f"q{k}", q) for k, (q, _) in enumerate(pairs)])
    targets = write_fasta(tmp_path / "t.fa", [(f"t{k}", t) for k, (_, t) in enumerate(pairs)])
    columns = "query,target,score,qstart,qend,tstart,tend,alnlen,nident,mismatch,gapopen,gaps,cigar,qaln,taln,bits"
    options = ["-t", "0", "--gap-open", "-12", "--gap-extend", "-1", "--format-output", columns + ",evalue",
               "--lambda", "0.267", "--k", "0.041", "-q", "--backend", "cpu"]
    code, aligned, _ = cli(["align", queries, targets, *options], capsys)
    assert code == 0
    code, searched, _ = cli(["search", queries, targets, "-k", "1", *options], capsys)
    assert code == 0
    aligned, searched = read_tsv(aligned), read_tsv(searched)
    assert aligned[0] == columns.split(",") + ["evalue"] == searched[0]
    assert [row[:-1] for row in aligned] == [row[:-1] for row in searched]
    for a, s in zip(aligned[1:], searched[1:]):
        assert float(s[-1]) == pytest.approx(3 * float(a[-1]), rel=2e-3)  # 3 sequences searched
        score, bits = float(a[2]), float(a[-2])
        assert bits == pytest.approx((0.267 * score - np.log(0.041)) / np.log(2), abs=0.05)


def test_in_order_hands_results_back_in_order_within_its_depth():
    import threading

    from swcli.details import InOrder

    gate = threading.Event()

    def job(k):
        if k == 0:
            gate.wait(5)  # the first job finishes last: the order must still be the queue's
        return f"rows {k}".encode()

    queue = InOrder(depth=2)
    try:
        assert queue.put(job, 0) == [] and queue.put(job, 1) == []
        gate.set()
        assert queue.put(job, 2) == [b"rows 0"]
        assert queue.drain() == [b"rows 1", b"rows 2"] and queue.drain() == []

        def fails():
            raise ValueError("bad pair")

        queue.put(fails)
        with pytest.raises(ValueError, match="bad pair"):
            queue.drain()
    finally:
        queue.close(finished=True)
