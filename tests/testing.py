"""Shared test helpers (pytorch_scatter style): devices, dtypes, oracles and the tolerance rule.

Every test file parametrises over DEVICES and DTYPES from here and checks results with
assert_close_to_reference, which implements GUIDE section 1 ("Numbers"):

* the ground truth is the Python reference loop in float64;
* a float64 result must be within 1e-6 of it;
* a float32 result must be within max(1e-4, 2 * err32), where err32 is the largest error, over the
  batch, of the float32 reference loop on the same input against the float64 one.

The reference loop is slow (tens of microseconds per cell), so its results are memoised by input
content: a test that checks float32 and float64 on the same float32-representable input pays once.
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest
import torch
from Bio.Align import PairwiseAligner, substitution_matrices

from swcli.reference import soft_smith_waterman_reference

DEVICES = [torch.device("cpu")]
if torch.cuda.is_available():
    DEVICES.append(torch.device("cuda"))

DTYPES = [torch.float32, torch.float64]

# The marker for the GPU suite: registered in pyproject.toml, skipped where there is no CUDA device.
cuda = pytest.mark.cuda
# CI has no GPU: the CUDA cases run on the H200 machine (see docs/benchmarks/h200.md).
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

FLOAT64_ATOL = 1e-6
FLOAT32_MIN_ATOL = 1e-4

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
BLOSUM62 = substitution_matrices.load("BLOSUM62")


def BACKENDS_FOR(device) -> str:
    """The compiled backend that serves tensors on `device`."""
    kind = torch.device(device).type
    if kind == "cpu":
        return "cpu"
    if kind == "cuda":
        return "cuda"
    raise ValueError(f"no compiled backend for device {device}")


def device_id(device) -> str:
    return torch.device(device).type


def dtype_id(dtype) -> str:
    return str(dtype).replace("torch.", "")


# --------------------------------------------------------------------------------------------------
# Random inputs


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_scores(shape, seed: int, dtype=torch.float64, device="cpu", scale: float = 1.0,
                  shift: float = 0.0) -> torch.Tensor:
    """Random normal scores, drawn in float32 so every dtype variant holds exactly the same values."""
    S = torch.randn(*shape, generator=generator(seed), dtype=torch.float32) * scale + shift
    return S.to(device=device, dtype=dtype)


def random_lengths(batch: int, limit: int, seed: int, low: int = 0) -> torch.Tensor:
    """(batch,) int64 lengths in [low, limit], both ends included."""
    return torch.randint(low, limit + 1, (batch,), generator=generator(seed), dtype=torch.int64)


def random_protein(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(AMINO_ACIDS) for _ in range(length))


def random_protein_pairs(seed: int, count: int, min_length: int, max_length: int):
    """count (query, target) pairs of random proteins with lengths in [min_length, max_length]."""
    rng = random.Random(seed)
    return [
        (random_protein(rng, rng.randint(min_length, max_length)),
         random_protein(rng, rng.randint(min_length, max_length)))
        for _ in range(count)
    ]


def related_protein_pairs(seed: int, count: int, min_length: int, max_length: int,
                          mutation_rate: float = 0.3):
    """Pairs where the target is a mutated copy of the query (substitutions and indels), so that the
    local alignments are long and go through gaps, not just a few lucky matches."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        query = random_protein(rng, rng.randint(min_length, max_length))
        target = []
        for letter in query:
            roll = rng.random()
            if roll < mutation_rate / 3:
                continue  # deletion
            if roll < 2 * mutation_rate / 3:
                target.append(rng.choice(AMINO_ACIDS))  # substitution
            else:
                target.append(letter)
            if rng.random() < mutation_rate / 6:
                target.append(random_protein(rng, rng.randint(1, 4)))  # insertion
        pairs.append((query, "".join(target) or rng.choice(AMINO_ACIDS)))
    return pairs


def score_matrices(pairs, matrix=BLOSUM62, dtype=torch.float64, device="cpu", pad=0.0):
    """Padded (B, M, N) score matrices S[b, i, j] = matrix[q_b[i]][t_b[j]], with the lengths."""
    table = torch.tensor(np.asarray(matrix), dtype=torch.float64)
    code = {letter: k for k, letter in enumerate(matrix.alphabet)}
    B = len(pairs)
    M = max((len(q) for q, _ in pairs), default=0)
    N = max((len(t) for _, t in pairs), default=0)
    S = torch.full((B, M, N), pad, dtype=torch.float64)
    for b, (q, t) in enumerate(pairs):
        if q and t:
            qc = torch.tensor([code[a] for a in q])
            tc = torch.tensor([code[c] for c in t])
            S[b, : len(q), : len(t)] = table[qc[:, None], tc[None, :]]
    qlen = torch.tensor([len(q) for q, _ in pairs], dtype=torch.int64)
    tlen = torch.tensor([len(t) for _, t in pairs], dtype=torch.int64)
    return S.to(device=device, dtype=dtype), qlen, tlen


def code_batch(pairs, matrix=BLOSUM62, device="cpu", pad_code=0):
    """The codes form of `pairs`: uint8 (B, M) and (B, N) indices into matrix.alphabet, padded with
    pad_code, the lengths, and the K x K matrix as a float64 tensor."""
    code = {letter: k for k, letter in enumerate(matrix.alphabet)}
    B = len(pairs)
    M = max((len(q) for q, _ in pairs), default=0)
    N = max((len(t) for _, t in pairs), default=0)
    query = torch.full((B, M), pad_code, dtype=torch.uint8)
    target = torch.full((B, N), pad_code, dtype=torch.uint8)
    for b, (q, t) in enumerate(pairs):
        query[b, : len(q)] = torch.tensor([code[a] for a in q], dtype=torch.uint8)
        target[b, : len(t)] = torch.tensor([code[c] for c in t], dtype=torch.uint8)
    qlen = torch.tensor([len(q) for q, _ in pairs], dtype=torch.int64)
    tlen = torch.tensor([len(t) for _, t in pairs], dtype=torch.int64)
    table = torch.tensor(np.asarray(matrix), dtype=torch.float64)
    return query.to(device), target.to(device), qlen, tlen, table.to(device)


def biopython_score(query: str, target: str, gap: float, matrix=BLOSUM62) -> float:
    """The independent t = 0 oracle: Biopython's local alignment score with a linear gap."""
    aligner = PairwiseAligner(mode="local", substitution_matrix=matrix, open_gap_score=gap,
                              extend_gap_score=gap)
    return float(aligner.score(query, target))


# --------------------------------------------------------------------------------------------------
# The reference, memoised, and the tolerance rule

_REFERENCE_CACHE: dict = {}


def _key(S: torch.Tensor, gap, temperature, qlen, tlen) -> tuple:
    def digest(x):
        if x is None:
            return None
        x = torch.as_tensor(x).detach().cpu().contiguous()
        return (str(x.dtype), tuple(x.shape), hashlib.sha1(x.numpy().tobytes()).hexdigest())

    return digest(S), float(gap), float(temperature), digest(qlen), digest(tlen)


def reference(S: torch.Tensor, gap: float, temperature: float, qlen=None, tlen=None) -> torch.Tensor:
    """The reference loop's scores for S in S's own dtype, on the CPU, memoised by content."""
    S = S.detach().cpu()
    qlen = None if qlen is None else torch.as_tensor(qlen).cpu()
    tlen = None if tlen is None else torch.as_tensor(tlen).cpu()
    key = _key(S, gap, temperature, qlen, tlen)
    if key not in _REFERENCE_CACHE:
        _REFERENCE_CACHE[key] = soft_smith_waterman_reference(S, gap, temperature, qlen, tlen)
    return _REFERENCE_CACHE[key].clone()


def tolerance(S: torch.Tensor, gap: float, temperature: float, qlen=None, tlen=None) -> float:
    """The GUIDE's absolute tolerance for a result of S's dtype (float32 or float64)."""
    if S.dtype == torch.float64:
        return FLOAT64_ATOL
    if S.dtype != torch.float32:
        raise ValueError(f"no tolerance rule for {S.dtype}")
    exact = reference(S.double(), gap, temperature, qlen, tlen)
    single = reference(S.float(), gap, temperature, qlen, tlen).double()
    finite = torch.isfinite(exact)
    err32 = (single - exact)[finite].abs().max().item() if finite.any() else 0.0
    return max(FLOAT32_MIN_ATOL, 2.0 * err32)


def assert_close_to_reference(out: torch.Tensor, S: torch.Tensor, gap: float, t: float, qlen=None,
                              tlen=None) -> None:
    """out (B,) must match the float64 reference on S within the GUIDE's tolerance for S's dtype."""
    assert isinstance(out, torch.Tensor)
    assert out.shape == (S.shape[0],), f"shape {tuple(out.shape)}, expected ({S.shape[0]},)"
    assert out.dtype == S.dtype, f"dtype {out.dtype}, expected {S.dtype}"
    assert out.device == S.device, f"device {out.device}, expected {S.device}"
    expected = reference(S.double(), gap, t, qlen, tlen)
    atol = tolerance(S, gap, t, qlen, tlen)
    got = out.detach().cpu().double()
    nan_got, nan_expected = torch.isnan(got), torch.isnan(expected)
    assert torch.equal(nan_got, nan_expected), (
        f"NaN mismatch: got NaN at {nan_got.nonzero().flatten().tolist()}, "
        f"expected NaN at {nan_expected.nonzero().flatten().tolist()}"
    )
    err = (got - expected).abs()
    err[nan_got] = 0.0
    worst = int(err.argmax()) if err.numel() else 0
    assert err.numel() == 0 or err.max().item() <= atol, (
        f"max error {err.max().item():.3g} > tolerance {atol:.3g} (dtype {S.dtype}, gap {gap}, "
        f"t {t}, shape {tuple(S.shape)}): pair {worst} got {got[worst].item()!r}, "
        f"expected {expected[worst].item()!r}"
    )


# --------------------------------------------------------------------------------------------------
# FASTA files and the command line


def write_fasta(path, records, compress=False) -> str:
    """Write (id, sequence) records as FASTA (gzip when asked); returns the path as a string."""
    import gzip

    text = "".join(f">{name}\n{sequence}\n" for name, sequence in records).encode()
    path.write_bytes(gzip.compress(text) if compress else text)
    return str(path)


def read_tsv(text: str) -> list[list[str]]:
    return [line.split("\t") for line in text.splitlines()]
