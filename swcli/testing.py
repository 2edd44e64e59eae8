"""Shared test helpers (pytorch_scatter style): devices, dtypes, oracles, the tolerance rule, and the
engine calls the kernel tests make.

Imported by tests/ and tools/ only (`from swcli.testing import ...`), never by the package itself, so that
`import swcli` stays light. Every op test parametrises over DEVICES and DTYPES from here and checks
results with assert_close_to_reference, which applies the tolerance rule:

* the ground truth is the Python reference loop in float64;
* a float64 result must be within 1e-6 of it;
* a float32 result must be within max(1e-4, 2 * err32), where err32 is the largest error, over the
  batch, of the float32 reference loop on the same input against the float64 one.

The reference loop is slow (tens of microseconds per cell), so its results are memoised by input
content: a test that checks float32 and float64 on the same float32-representable input pays once.

The engines' Python interface is called from here only (CpuEngineCalls, CudaEngineCalls), so that a
change of that interface changes these helpers, not the tests.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from Bio.Align import PairwiseAligner, substitution_matrices

from swcli.reference import soft_smith_waterman_affine_reference, soft_smith_waterman_reference

DEVICES = [torch.device("cpu")]
if torch.cuda.is_available():
    DEVICES.append(torch.device("cuda"))

DTYPES = [torch.float32, torch.float64]

# The marker for the GPU suite: registered in pyproject.toml, skipped where there is no CUDA device.
cuda = pytest.mark.cuda
# CI has no GPU: the CUDA cases run on the H200 machine (see docs/benchmarks/h200.md).
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# The long GPU sweeps, run apart from the fast GPU suite: pytest -m "cuda and slow". Registered in
# pyproject.toml; the default run deselects nothing.
slow = pytest.mark.slow


def slow_unless(values, fast, several=False):
    """The parameters `values` of a long sweep, each marked slow unless it is in `fast`: the cases in `fast`
    stay in the fast GPU suite, so that it keeps one case of each property. several: each value is a
    tuple holding the values of several arguments ("gap,t,wide")."""
    def slow_param(value):
        return pytest.param(*value, marks=slow) if several else pytest.param(value, marks=slow)

    return [value if value in fast else slow_param(value) for value in values]


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


# pytest parameters of DEVICES (the CUDA ones marked `cuda` and skipped without a CUDA device) and DTYPES
DEVICE_PARAMS = [
    pytest.param(d, id=device_id(d), marks=[cuda, requires_cuda] if d.type == "cuda" else [])
    for d in DEVICES
]
DTYPE_PARAMS = [pytest.param(dt, id=dtype_id(dt)) for dt in DTYPES]
TEMPERATURES = [0.0, 0.1, 1.0, 10.0]
GAPS = [-0.5, -1.0, -4.0]
# Affine gaps (gap_open, gap_extend) with BLOSUM62: BLAST's defaults 11/1 (-12, -1) and its neighbours,
# and open == extend, where the affine op is the linear one.
AFFINE_GAPS = [(-12.0, -1.0), (-11.0, -1.0), (-10.0, -2.0), (-4.0, -4.0)]

parametrize_device = pytest.mark.parametrize("device", DEVICE_PARAMS)
parametrize_dtype = pytest.mark.parametrize("dtype", DTYPE_PARAMS)


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


def biopython_score(query: str, target: str, gap: float, matrix=BLOSUM62, *, gap_extend=None) -> float:
    """The independent t = 0 oracle: Biopython's local alignment score with a linear gap, or with
    gap_extend affine gaps (gap is then the open score: a gap's first position)."""
    aligner = PairwiseAligner(mode="local", substitution_matrix=matrix, open_gap_score=gap,
                              extend_gap_score=gap if gap_extend is None else gap_extend)
    return float(aligner.score(query, target))


def example_proteins() -> list[str]:
    """The 40 real protein sequences of data/example.fasta (UniProt, at most 500 residues)."""
    from Bio.SeqIO.FastaIO import SimpleFastaParser

    from swcli._files import packaged_file

    with open(packaged_file("data", "example.fasta")) as handle:
        return [sequence for _, sequence in SimpleFastaParser(handle)]


def example_protein_pairs(count: int | None = None, seed: int = 0):
    """Pairs of real proteins from data/example.fasta: its 20 pairs (record 1 with 2, 3 with 4, ...) and,
    past 20, pairs of two different records drawn at random. count None: the 20."""
    proteins = example_proteins()
    pairs = [(proteins[k], proteins[k + 1]) for k in range(0, len(proteins) - 1, 2)]
    count = len(pairs) if count is None else count
    rng = random.Random(seed)
    while len(pairs) < count:
        a, b = rng.sample(range(len(proteins)), 2)
        pairs.append((proteins[a], proteins[b]))
    return pairs[:count]


# --------------------------------------------------------------------------------------------------
# The reference, memoised, and the tolerance rule

_REFERENCE_CACHE: dict = {}


def _key(S: torch.Tensor, gap, temperature, qlen, tlen, gap_extend=None) -> tuple:
    def digest(x):
        if x is None:
            return None
        x = torch.as_tensor(x).detach().cpu().contiguous()
        return (str(x.dtype), tuple(x.shape), hashlib.sha1(x.numpy().tobytes()).hexdigest())

    extend = None if gap_extend is None else float(gap_extend)
    return digest(S), float(gap), extend, float(temperature), digest(qlen), digest(tlen)


def reference(S: torch.Tensor, gap: float, temperature: float, qlen=None, tlen=None, *,
              gap_extend=None) -> torch.Tensor:
    """The reference loop's scores for S in S's own dtype, on the CPU, memoised by content. With
    gap_extend, the affine loop, gap being the open score (as in every helper here)."""
    S = S.detach().cpu()
    qlen = None if qlen is None else torch.as_tensor(qlen).cpu()
    tlen = None if tlen is None else torch.as_tensor(tlen).cpu()
    key = _key(S, gap, temperature, qlen, tlen, gap_extend)
    if key not in _REFERENCE_CACHE:
        if gap_extend is None:
            _REFERENCE_CACHE[key] = soft_smith_waterman_reference(S, gap, temperature, qlen, tlen)
        else:
            _REFERENCE_CACHE[key] = soft_smith_waterman_affine_reference(S, gap, gap_extend, temperature, qlen,
                                                                         tlen)
    return _REFERENCE_CACHE[key].clone()


def tolerance(S: torch.Tensor, gap: float, temperature: float, qlen=None, tlen=None, *,
              gap_extend=None) -> float:
    """The absolute tolerance for a result of S's dtype (float32 or float64): the rule above."""
    if S.dtype == torch.float64:
        return FLOAT64_ATOL
    if S.dtype != torch.float32:
        raise ValueError(f"no tolerance rule for {S.dtype}")
    exact = reference(S.double(), gap, temperature, qlen, tlen, gap_extend=gap_extend)
    single = reference(S.float(), gap, temperature, qlen, tlen, gap_extend=gap_extend).double()
    finite = torch.isfinite(exact)
    err32 = (single - exact)[finite].abs().max().item() if finite.any() else 0.0
    return max(FLOAT32_MIN_ATOL, 2.0 * err32)


def assert_close_to_reference(out: torch.Tensor, S: torch.Tensor, gap: float, t: float, qlen=None,
                              tlen=None, *, gap_extend=None) -> None:
    """out (B,) must match the float64 reference on S within the tolerance for S's dtype (the affine
    reference with gap_extend, gap being the open score)."""
    assert isinstance(out, torch.Tensor)
    assert out.shape == (S.shape[0],), f"shape {tuple(out.shape)}, expected ({S.shape[0]},)"
    assert out.dtype == S.dtype, f"dtype {out.dtype}, expected {S.dtype}"
    assert out.device == S.device, f"device {out.device}, expected {S.device}"
    expected = reference(S.double(), gap, t, qlen, tlen, gap_extend=gap_extend)
    atol = tolerance(S, gap, t, qlen, tlen, gap_extend=gap_extend)
    got = out.detach().cpu().double()
    nan_got, nan_expected = torch.isnan(got), torch.isnan(expected)
    assert torch.equal(nan_got, nan_expected), (
        f"NaN mismatch: got NaN at {nan_got.nonzero().flatten().tolist()}, "
        f"expected NaN at {nan_expected.nonzero().flatten().tolist()}"
    )
    err = (got - expected).abs()
    err[nan_got] = 0.0
    worst = int(err.argmax()) if err.numel() else 0
    gaps = f"gap {gap}" if gap_extend is None else f"gap_open {gap}, gap_extend {gap_extend}"
    assert err.numel() == 0 or err.max().item() <= atol, (
        f"max error {err.max().item():.3g} > tolerance {atol:.3g} (dtype {S.dtype}, {gaps}, "
        f"t {t}, shape {tuple(S.shape)}): pair {worst} got {got[worst].item()!r}, "
        f"expected {expected[worst].item()!r}"
    )


# --------------------------------------------------------------------------------------------------
# The op, masks and the reference gradient


def run(S, gap=-1.0, t=1.0, qlen=None, tlen=None, backend=None, *, gap_extend=None):
    """The op on S's device with the compiled backend for that device (unless told otherwise); with
    gap_extend affine gaps, gap being the open score."""
    import swcli

    if backend is None:
        backend = BACKENDS_FOR(S.device)
    if qlen is not None:
        qlen = qlen.to(S.device)
    if tlen is not None:
        tlen = tlen.to(S.device)
    if gap_extend is not None:
        return swcli.soft_smith_waterman(S, None, t, qlen, tlen, backend=backend, gap_open=gap,
                                         gap_extend=gap_extend)
    return swcli.soft_smith_waterman(S, gap, t, qlen, tlen, backend=backend)


def window_mask(B, M, N, qlen, tlen):
    """True outside each pair's (qlen, tlen) window."""
    rows = torch.arange(M).view(1, M, 1) >= qlen.cpu().view(B, 1, 1)
    cols = torch.arange(N).view(1, 1, N) >= tlen.cpu().view(B, 1, 1)
    return rows | cols


def reference_gradient(S, gap, t, qlen, tlen, grad_out, *, gap_extend=None):
    """(scores, grad of (scores * grad_out).sum() by S) through the float64 reference loop, on the CPU
    (the affine loop with gap_extend, gap being the open score)."""
    S64 = S.detach().cpu().double().requires_grad_()
    qlen = None if qlen is None else torch.as_tensor(qlen).cpu()
    tlen = None if tlen is None else torch.as_tensor(tlen).cpu()
    if gap_extend is None:
        out = soft_smith_waterman_reference(S64, gap, t, qlen, tlen)
    else:
        out = soft_smith_waterman_affine_reference(S64, gap, gap_extend, t, qlen, tlen)
    (out * grad_out.cpu().double()).sum().backward()
    return out.detach(), S64.grad


def parameter_gradients(S, gaps: dict, temperature, qlen=None, tlen=None, grad_out=None, backend=None):
    """(scores, {name: gradient}) of (scores * grad_out).sum() by S and by every tensor among `gaps`
    (gap, or gap_open and gap_extend) and `temperature` that requires grad: the op on S's device with the
    compiled backend for it, or `backend`. The inputs are cloned, so one set serves several backends."""
    import swcli

    if backend is None:
        backend = BACKENDS_FOR(S.device)
    S = S.detach().clone().requires_grad_()

    def fresh(value):
        if not isinstance(value, torch.Tensor):
            return value
        return value.detach().clone().requires_grad_(value.requires_grad)

    gaps = {name: fresh(value) for name, value in gaps.items()}
    temperature = fresh(temperature)
    scores = swcli.soft_smith_waterman(S, temperature=temperature, query_lengths=qlen, target_lengths=tlen,
                                       backend=backend, **gaps)
    named = {"S": S, **gaps, "temperature": temperature}
    named = {name: x for name, x in named.items() if isinstance(x, torch.Tensor) and x.requires_grad}
    if grad_out is None:
        grad_out = torch.ones_like(scores)
    grads = torch.autograd.grad((scores * grad_out).sum(), list(named.values()))
    return scores.detach(), dict(zip(named, grads))


# --------------------------------------------------------------------------------------------------
# The engines called directly, past the op: the one place that knows their Python interface


class CpuEngineCalls:
    """Mixin of a test class: the CPU engine's operators called directly, with the count of pairs it
    scored in log space (the scaled sweep's fallback)."""

    @staticmethod
    def dense(S, qlen, tlen, gap, t, scaled=True):
        from swcli.ops import load_engine

        load_engine("cpu")
        scores, log_pairs = torch.ops.swcli.scores_counted(S, qlen, tlen, gap, t, scaled=scaled)
        return scores, int(log_pairs.item())

    @staticmethod
    def codes(query, target, qlen, tlen, matrix, gap, t, scaled=True):
        from swcli.ops import load_engine

        load_engine("cpu")
        scores, log_pairs = torch.ops.swcli.scores_codes_counted(query, target, matrix, qlen, tlen, gap, t,
                                                                 scaled=scaled)
        return scores, int(log_pairs.item())


# Shapes of the gradient by rows' tests ((B, M, N), with per-pair lengths): every case of its kernels.
ROWS_SHAPES = {
    "300x256 full": ((40, 300, 256), False),  # 38 bands, every lane full
    "37x200 lengths": ((60, 37, 200), True),  # columns past the target in a lane (masked)
    "1x4": ((9, 1, 4), False),
    "20x8 full": ((9, 20, 8), False),  # 31 lanes past N, on S = 0
    "70x132 lengths": ((30, 70, 132), True),
    "17x12": ((25, 17, 12), False),  # N not a multiple of 8: masked
    "90x254": ((30, 90, 254), False),  # N not a multiple of 4: through the staging row
    "45x250 lengths": ((50, 45, 250), True),
    "33x7": ((20, 33, 7), False),
    "1x1": ((5, 1, 1), False),
}


class CudaEngineCalls:
    """Mixin of a test class: the CUDA engine's operators called directly (dense, from codes, the
    gradient by rows), each with what the tests check of it."""

    device = torch.device("cuda")

    @staticmethod
    def counted(counted_call):
        """(scores, how many pairs the call scored in log space) of one call of a counted operator."""
        scores, log_pairs = counted_call()
        return scores, int(log_pairs.item())

    def codes_engine(self, query, target, qlen, tlen, table, gap, t, scaled=True, lane_columns=4):
        """(scores, how many pairs the engine scored in log space) of one engine call."""
        from swcli.ops import load_engine

        load_engine("cuda")
        return self.counted(lambda: torch.ops.swcli.scores_codes_counted(
            query, target, table, qlen, tlen, gap, t, lane_columns=lane_columns, scaled=scaled))

    def dense_engine(self, S, qlen, tlen, gap, t, scaled=True, lane_columns=4):
        """The same for dense scores (the forward without the DP table)."""
        from swcli.ops import load_engine

        load_engine("cuda")
        return self.counted(lambda: torch.ops.swcli.scores_counted(S, qlen, tlen, gap, t, lane_columns=lane_columns,
                                                                   scaled=scaled))

    @staticmethod
    def engine_gradient(S, qlen, tlen, gap, t, grad_out, lane_columns):
        """(scores, state, grad_S) of the engine's forward and backward that keep a state (not by rows),
        called directly with lane_columns (-1: the tiles of long pairs)."""
        from swcli.ops import load_engine

        load_engine("cuda")
        scores, state, best, failed = torch.ops.swcli.forward(S, qlen, tlen, gap, t, False, lane_columns=lane_columns)
        grad = torch.ops.swcli.backward(grad_out, S, state, best, failed, qlen, tlen, gap, t, False,
                                        lane_columns=lane_columns)
        return scores, state, grad

    @staticmethod
    def rows_gradient(S, qlen, tlen, gap, t, grad_out):
        """(scores, grad_S) of the engine's forward and backward by rows, asserting that the scaled rows
        hold every pair (no table needed)."""
        from swcli.ops import load_engine

        load_engine("cuda")
        scores, kept, best_row, failed = torch.ops.swcli.forward(S, qlen, tlen, gap, t, True)
        assert failed.item() == 0
        return scores, torch.ops.swcli.backward(grad_out, S, kept, best_row, failed, qlen, tlen, gap, t, True)

    @staticmethod
    def affine_rows_gradient(S, qlen, tlen, gap_open, gap_extend, t, grad_out):
        """The same with affine gaps."""
        from swcli.ops import load_engine

        load_engine("cuda")
        scores, kept, best_row, failed = torch.ops.swcli.affine_forward(S, qlen, tlen, gap_open, gap_extend, t, True)
        assert failed.item() == 0
        return scores, torch.ops.swcli.affine_backward(grad_out, S, kept, best_row, failed, qlen, tlen, gap_open,
                                                       gap_extend, t, True)


# --------------------------------------------------------------------------------------------------
# Blocks of the search kernels' tests


def search_block_lengths(width: int, around: list[int], seed: int, count: int = 40) -> list[int]:
    """A block's target lengths, longest first: the lengths of `around` up to width, `count` random ones,
    and the width itself first (a block's width sets the exact search kernel's tile shape)."""
    rng = random.Random(seed)
    lengths = sorted([L for L in around if L <= width] + [rng.randint(0, width) for _ in range(count)], reverse=True)
    lengths[0] = width
    return lengths


def warp_width_lengths(lanes: int, most: int, seed: int) -> list[int]:
    """A block's target lengths, one warp (32 / lanes groups of two targets) for each columns a lane an
    exact search kernel's warp may take, 8 to `most` by 2, each warp's longest first: its widest exactly
    lanes x R or one past lanes x (R - 2) (which rounds up to R), the others shorter. The first sets the
    launch class."""
    rng = random.Random(seed)
    per_warp = 2 * (32 // lanes)
    lengths = []
    for R in range(most, 7, -2):
        widest = lanes * R if R % 4 == most % 4 else lanes * (R - 2) + 1
        lengths += sorted([widest] + [rng.randint(0, widest) for _ in range(per_warp - 1)], reverse=True)
    return lengths


def padded_code_targets(rng: torch.Generator, lengths: list[int], K: int, device, width: int | None = None):
    """(B, width) random codes below K, junk past each length included, and the (B,) int64 lengths."""
    width = max(lengths + [1]) if width is None else width
    codes = torch.randint(0, K, (len(lengths), width), generator=rng, dtype=torch.uint8)
    return codes.to(device), torch.tensor(lengths, dtype=torch.int64, device=device)


def encoded(matrix, sequence: str) -> np.ndarray:
    """A protein's codes in `matrix` (swcli.scoring's), int64."""
    return np.frombuffer(matrix.encode(sequence, lambda: "test"), np.uint8).astype(np.int64)


def padded_encoded(matrix, sequences: list, width: int | None = None, junk: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(B, width) int64 codes of protein strings (or lists of codes) with `junk` past each length (a real
    letter: a kernel must not read it), and the (B,) lengths."""
    coded = [s if isinstance(s, list) else encoded(matrix, s) for s in sequences]
    width = max([len(c) for c in coded] + [1]) if width is None else width
    block = np.full((len(coded), width), junk, np.int64)
    for b, letters in enumerate(coded):
        block[b, :len(letters)] = letters
    return block, np.array([len(c) for c in coded], np.int64)


def random_search_set(seed: int, matrix=None):
    """A database of 301 random proteins of 1 to 80 or 200 to 700 residues, and the codes of 5 random
    queries of 1 to 400: a search across the exact kernel's short and long tile shapes, and the soft
    kernel's targets end to end across its tiles."""
    from swcli import database
    from swcli.fasta import FastaRecord
    from swcli.scoring import load_matrix

    matrix = matrix or load_matrix("BLOSUM62")
    rng = random.Random(seed)
    sequences = [random_protein(rng, rng.choice([rng.randint(1, 80), rng.randint(200, 700)])) for _ in range(301)]
    queries = [random_protein(rng, rng.randint(1, 400)) for _ in range(5)]
    db = database.build([FastaRecord("db.fa", k + 1, f"s{k}", s) for k, s in enumerate(sequences)], matrix, "db.fa")
    return db, [matrix.encode(q, lambda: "query") for q in queries]


def search_block(targets: torch.Tensor, lengths: torch.Tensor):
    """A search.Block of padded codes (database order 0 for every row: the kernels do not read it)."""
    from swcli.search import Block

    return Block(targets, lengths, torch.zeros_like(lengths))


# --------------------------------------------------------------------------------------------------
# The soft search kernel's algorithm in NumPy (kernels/cuda/search_soft.cu)

_FLOAT_TINY = 2.0 ** -126


def _ftz(x) -> np.ndarray:
    """float32, values under the smallest normal flushed to 0 (the kernel's arithmetic)."""
    x = np.asarray(x, dtype=np.float32)
    return np.where(np.abs(x) < _FLOAT_TINY, np.float32(0), x)


def _fma(a, b, c) -> np.ndarray:
    """A float32 fused multiply-add: the product exact in float64, the sum rounded there and again to
    float32 (which can differ from one rounding in the last bit, rarely)."""
    return _ftz(np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64))


def _pow2(k) -> np.ndarray:
    """2^k as float32 for integers k in [-126, 127], 0 below: its bits, the exponent field k + 127."""
    k = np.asarray(k, dtype=np.int64)
    bits = ((np.minimum(np.maximum(k, -126), 127) + 127) << 23).astype(np.int32)
    return np.where(k < -126, np.float32(0), bits.view(np.float32))


def _times_pow2(x, delta) -> np.ndarray:
    """x 2^delta in two factors (delta clamped to [-252, 254]): exact wherever the result is normal."""
    d = np.minimum(np.maximum(np.asarray(delta, dtype=np.int64), -252), 254)
    if not d.any():  # times 2^0: x itself, flushed
        return _ftz(x)
    half = d >> 1
    first, second = _pow2(np.stack([half, d - half]))
    with np.errstate(over="ignore", invalid="ignore"):
        return _ftz(_ftz(np.asarray(x, np.float32) * first) * second)


def _exponent(x) -> np.ndarray:
    return (np.asarray(x, np.float32).view(np.int32) >> 23).astype(np.int64) - 127


def _scaled_key(sigma, x) -> np.ndarray:
    return (np.asarray(sigma, np.int64) << 23) + np.asarray(x, np.float32).view(np.int32).astype(np.int64)


def soft_floor_first(plan: dict) -> np.float32:
    """The kernel's floor_first, 2^-F / C^7 (C = G (1 - 1e-6), under G (1 - 2^-24); affine O for G), the
    least float at or above it: a segment whose first cell reaches it has every cell above the floor 2^-F."""
    chain = plan["gap_factor"] * (1.0 - 1e-6)
    bound = math.ldexp(1.0, -plan["floor"]) / (chain * chain * chain * chain * chain * chain * chain)  # its order
    f = np.float32(bound)
    return np.nextafter(f, np.float32(np.inf)) if float(f) < bound else f


def soft_landing(plan: dict) -> int:
    """The exponent at which the kernel lands a segment whose input passed 2^U: T, linear 2T - U."""
    return plan["middle"] if plan["affine"] else 2 * plan["middle"] - plan["upper"]


def soft_rises(hi, first, sigma, plan: dict) -> np.ndarray:
    """Which segments the kernel rescales up (to 2^T): those with sigma > F whose first cell is under
    soft_floor_first, where their largest value hi is under 2^T."""
    return (np.asarray(sigma) > plan["floor"]) & (first < soft_floor_first(plan)) & (hi < _pow2(plan["middle"]))


def soft_segment_cells(up, yt, diag, left, xt, powers, one, plan: dict):
    """One row of a segment's 8 cells (B, 8), in the kernel's order of operations: the stored values of
    the row above (up) and, for affine gaps, Y~ of this row (yt), the diagonal factor of the first column
    (diag), the input from the left (left; affine: and X~ entering, xt), P of each cell, the 1 (one).
    Returns the row's values, Y~ of the next row, and X~ leaving the segment."""
    gf, ef = np.float32(plan["gap_factor"]), np.float32(plan["extend_factor"])
    cells = np.empty_like(up)
    # The terms from the row above, every column at once; then the chain along the row, column by column.
    dp = _fma(np.concatenate([diag[:, None], up[:, :-1]], 1), powers, np.asarray(one)[:, None])
    if plan["affine"]:
        whole = np.float32(gf + ef)  # E
        z = _fma(gf, yt, dp)
        for r in range(up.shape[1]):
            cells[:, r] = _fma(gf, xt, z[:, r])
            xt = _fma(whole, xt, z[:, r])
        return cells, _fma(ef, yt, cells), xt
    t = _fma(up, gf, dp)
    for r in range(up.shape[1]):
        cells[:, r] = left = _fma(left, gf, t[:, r])
    return cells, yt.copy(), xt


def soft_search_model(query: np.ndarray, targets: np.ndarray, lengths: np.ndarray, plan: dict,
                      counts: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The soft search kernel's scores of one query (M,) against padded targets (B, N) with lengths (B,),
    and which pairs it flags, from search.SoftSearch.plan's settings: the same cells, 8-column scales,
    rescaling rules, checks and padding, segment by segment along each row (the order of the kernel's
    wavefront within a row; its lanes and tiles hand on the same values). float32 with flushing, the
    fused multiply-adds up to a last-bit rounding. counts, if given, gets the rescalings, the rescalings
    up (rises) and the segment steps. Flagged pairs' scores are what the sweep ended with: the kernel
    writes -1 instead."""
    from swcli.search import SoftSearch

    seg = SoftSearch.SEGMENT
    M, (B, N) = len(query), targets.shape
    segments = max(1, -(-N // seg))
    K = plan["powers"].shape[0]
    letters = np.full((B, segments * seg), K, dtype=np.int64)
    inside = np.arange(segments * seg)[None, :] < lengths[:, None]
    letters[:, :N] = np.where(inside[:, :N], targets, K)
    powers = np.concatenate([plan["powers"], np.zeros((K, 1), np.float32)], 1)
    upper = _pow2(plan["upper"])
    middle, floor = plan["middle"], plan["floor"]
    landing = soft_landing(plan)
    up = np.ones((B, segments, seg), np.float32)
    yt = np.ones((B, segments, seg), np.float32)
    sigma = np.zeros((B, segments), np.int64)
    one, diag = np.ones((B, segments), np.float32), np.ones((B, segments), np.float32)
    best = np.zeros((B, segments), np.float32)
    best_key = np.full(B, _scaled_key(0, np.float32(1)), np.int64)
    failed = np.zeros(B, bool)
    rescalings = rises = 0

    def fold(rows, s):
        nonlocal best_key, failed
        failed |= rows & ~(best[:, s] <= np.finfo(np.float32).max)
        folded = np.where(rows & (best[:, s] > 0), _scaled_key(sigma[:, s], best[:, s]), best_key)
        best_key = np.maximum(best_key, folded)
        best[:, s] = np.where(rows, np.float32(0), best[:, s])

    def rescale(rows, s, shift):
        nonlocal rescalings
        rescalings += int(rows.sum())
        fold(rows, s)
        sigma[:, s] = np.where(rows, sigma[:, s] + shift, sigma[:, s])
        scaled = _times_pow2(up[:, s], -shift[:, None])
        up[:, s] = np.where(rows[:, None], scaled, up[:, s])
        yt[:, s] = np.where(rows[:, None], _times_pow2(yt[:, s], -shift[:, None]), yt[:, s])
        diag[:, s] = np.where(rows, _times_pow2(diag[:, s], -shift), diag[:, s])
        one[:, s] = np.where(sigma[:, s] <= 126, _pow2(-sigma[:, s]), np.float32(0))

    for i in range(M):
        P = powers[query[i]][letters].reshape(B, segments, seg)
        x_in, xt_in, sig_in = np.ones(B, np.float32), np.ones(B, np.float32), np.zeros(B, np.int64)  # the border
        for s in range(segments):
            delta = sig_in - sigma[:, s]
            lv, xt = _times_pow2(np.stack([x_in, xt_in]), delta)
            over = ~(lv <= upper)
            if over.any():  # the input past 2^U: the segment rescaled first, so that the input lands at 2^landing
                shift = np.where(over, _exponent(x_in) + delta - landing, 0)
                rescale(over, s, shift)
                lv, xt = np.where(over, _times_pow2(np.stack([x_in, xt_in]), sig_in - sigma[:, s]), (lv, xt))
            up[:, s], yt[:, s], xt = soft_segment_cells(up[:, s], yt[:, s], diag[:, s], lv, xt, P[:, s], one[:, s],
                                                        plan)
            hi = np.max(up[:, s], 1)
            best[:, s] = np.maximum(best[:, s], hi)
            deep = sigma[:, s] > floor
            if deep.any():  # the cells inside the target, against the floor
                lo = np.min(np.where(inside[:, s * seg:(s + 1) * seg], up[:, s], np.inf), 1)
                failed |= deep & ~(lo >= 2.0 ** -floor)
            diag[:, s] = lv
            x_in, xt_in, sig_in = up[:, s, -1].copy(), xt.copy(), sigma[:, s].copy()
        for s in range(segments):  # the segments whose largest value passed 2^U, or that rise
            hi = np.max(up[:, s], 1)
            rising = soft_rises(hi, up[:, s, 0], sigma[:, s], plan)
            need = (hi > upper) | rising
            rises += int(rising.sum())
            if need.any():
                rescale(need, s, np.where(need, np.maximum(_exponent(hi) - middle, -sigma[:, s]), 0))
    for s in range(segments):
        fold(np.ones(B, bool), s)
    exponent = (best_key >> 23) - 127
    mantissa = ((best_key & 0x7FFFFF) | 0x3F800000).astype(np.int32).view(np.float32).astype(np.float64)
    scores = plan["temperature"] * math.log(2) * (exponent + np.log2(mantissa))
    flagged = (failed | (best_key <= _scaled_key(0, np.float32(plan["bound"])))) & (lengths > 0) & (M > 0)
    scores = np.where((lengths > 0) & (M > 0), scores, 0.0)
    if counts is not None:
        counts["rescalings"] = counts.get("rescalings", 0) + rescalings
        counts["rises"] = counts.get("rises", 0) + rises
        counts["segment_steps"] = counts.get("segment_steps", 0) + M * segments * B
    return scores, flagged


# --------------------------------------------------------------------------------------------------
# FASTA files and the command line


def run_cli(argv, capsys):
    """swcli's main(argv) in this process: (exit code, stdout, stderr), read through pytest's capsys."""
    from swcli.cli import main

    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def subprocess_env() -> dict:
    """The environment for `python -m swcli` in a child: this checkout first, the caller's path kept."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                                         os.environ.get("PYTHONPATH", "")])}


def write_fasta(path, records, compress=False) -> str:
    """Write (id, sequence) records as FASTA (gzip when asked); returns the path as a string."""
    import gzip

    text = "".join(f">{name}\n{sequence}\n" for name, sequence in records).encode()
    path.write_bytes(gzip.compress(text) if compress else text)
    return str(path)


def read_tsv(text: str) -> list[list[str]]:
    return [line.split("\t") for line in text.splitlines()]
