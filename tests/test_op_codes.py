"""The public op soft_smith_waterman_codes (uint8 codes, a K x K matrix): oracles, layout, a shared query, errors."""

from __future__ import annotations

import pytest
import torch

from swcli.ops import soft_smith_waterman_codes
from swcli.testing import (
    DEVICE_PARAMS,
    assert_close_to_reference,
    biopython_score,
    code_batch,
    random_protein_pairs,
    reference,
    related_protein_pairs,
    score_matrices,
)


# --------------------------------------------------------------------------------------------------
# The codes path (soft_smith_waterman_codes): scores looked up from uint8 codes and a K x K matrix


def test_codes_function_is_public():
    import swcli

    assert swcli.soft_smith_waterman_codes is soft_smith_waterman_codes
    assert "soft_smith_waterman_codes" in swcli.__all__


@pytest.mark.parametrize("gap", [-1.0, -4.0])
def test_codes_temperature_zero_equals_biopython(gap):
    pairs = random_protein_pairs(seed=10_100, count=20, min_length=1, max_length=120)
    pairs += related_protein_pairs(seed=10_101, count=20, min_length=30, max_length=250)
    pairs += related_protein_pairs(seed=10_102, count=1, min_length=1200, max_length=1200)
    query, target, qlen, tlen, matrix = code_batch(pairs)
    out = soft_smith_waterman_codes(query, target, matrix, gap, 0.0, qlen, tlen).tolist()
    assert out == [biopython_score(q, s, gap) for q, s in pairs]


@pytest.mark.parametrize("t", [0.1, 1.0])
def test_codes_match_reference(t):
    pairs = related_protein_pairs(seed=10_200, count=6, min_length=5, max_length=30)
    query, target, qlen, tlen, matrix = code_batch(pairs)
    out = soft_smith_waterman_codes(query, target, matrix, -0.5, t, qlen, tlen)
    S, _, _ = score_matrices(pairs, dtype=torch.float32)
    assert_close_to_reference(out, S, -0.5, t, qlen, tlen)
    ref = soft_smith_waterman_codes(query, target, matrix, -0.5, t, qlen, tlen, backend="reference")
    assert ref.dtype == torch.float64  # the reference runs in the matrix's dtype
    assert torch.equal(ref, reference(S.double(), -0.5, t, qlen, tlen))


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_codes_scores_carry_no_gradient(backend):
    """No gradient, as documented, and none silently dropped: a matrix that requires grad is refused where
    grad mode is on; under no_grad its scores are those of the plain matrix, and require no grad."""
    pairs = related_protein_pairs(seed=10_250, count=3, min_length=5, max_length=20)
    query, target, qlen, tlen, matrix = code_batch(pairs)
    learnable = matrix.clone().requires_grad_()
    with pytest.raises(ValueError, match=r"^soft_smith_waterman_codes has no gradient, and matrix requires grad: "
                                         r"score soft_smith_waterman\(matrix\[query\]\[:, target\], ...\)"):
        soft_smith_waterman_codes(query, target, learnable, -1.0, 1.0, qlen, tlen, backend=backend)
    with torch.no_grad():
        out = soft_smith_waterman_codes(query, target, learnable, -1.0, 1.0, qlen, tlen, backend=backend)
    assert not out.requires_grad
    assert torch.equal(out, soft_smith_waterman_codes(query, target, matrix, -1.0, 1.0, qlen, tlen, backend=backend))


def test_codes_padding_and_layout_do_not_matter():
    pairs = related_protein_pairs(seed=10_300, count=40, min_length=0, max_length=60)
    query, target, qlen, tlen, matrix = code_batch(pairs, pad_code=0)
    expected = soft_smith_waterman_codes(query, target, matrix, -1.0, 1.0, qlen, tlen)
    empty_pairs = (qlen == 0) | (tlen == 0)
    assert empty_pairs.any() and (expected[empty_pairs] == 0).all()
    # other padding codes
    junk_q, junk_t, _, _, _ = code_batch(pairs, pad_code=22)
    assert torch.equal(soft_smith_waterman_codes(junk_q, junk_t, matrix, -1.0, 1.0, qlen, tlen), expected)
    # non-contiguous codes: columns of a wider tensor
    wide_q = torch.zeros(query.shape[0], 2 * query.shape[1], dtype=torch.uint8)
    wide_q[:, ::2] = query
    wide_t = torch.zeros(target.shape[1], target.shape[0], dtype=torch.uint8).T
    wide_t.copy_(target)
    assert not wide_q[:, ::2].is_contiguous() and not wide_t.is_contiguous()
    out = soft_smith_waterman_codes(wide_q[:, ::2], wide_t, matrix, -1.0, 1.0, qlen, tlen)
    assert torch.equal(out, expected)
    # a float32 matrix gives the same scores as the float64 one
    assert torch.equal(soft_smith_waterman_codes(query, target, matrix.float(), -1.0, 1.0, qlen, tlen),
                       expected)
    # and an empty batch
    empty = torch.zeros(0, 5, dtype=torch.uint8)
    assert soft_smith_waterman_codes(empty, empty, matrix).shape == (0,)


def _codes_ok():
    query = torch.zeros(3, 5, dtype=torch.uint8)
    target = torch.zeros(3, 6, dtype=torch.uint8)
    return query, target, torch.zeros(24, 24)


@pytest.mark.parametrize("change,message", [
    ({"query_codes": torch.zeros(3, 5, dtype=torch.int64)}, r"query_codes must be a 2-D uint8 tensor"),
    ({"target_codes": torch.zeros(3, 6, 1, dtype=torch.uint8)}, r"target_codes must be a 2-D uint8"),
    ({"target_codes": torch.zeros(4, 6, dtype=torch.uint8)}, r"hold 3 and 4 pairs"),
    ({"matrix": torch.zeros(24, 23)}, r"matrix must be a square floating-point tensor"),
    ({"matrix": torch.zeros(24, 24, dtype=torch.int64)}, r"matrix must be a square floating-point"),
    ({"matrix": torch.zeros(257, 257)}, r"at most 256 x 256"),
    ({"matrix": torch.zeros(0, 0)}, r"matrix must be a square floating-point tensor"),
    ({"query_codes": torch.full((3, 5), 24, dtype=torch.uint8)},
     r"query_codes holds code 24, outside the 24 x 24 matrix"),
    ({"target_codes": torch.full((3, 6), 30, dtype=torch.uint8)},
     r"target_codes holds code 30, outside the 24 x 24 matrix"),
    ({"temperature": -1.0}, r"temperature must be >= 0"),
    ({"gap": float("nan")}, r"gap must be a finite number"),
    ({"query_lengths": torch.tensor([1, 6, 2])}, r"query_lengths must lie in \[0, 5\]"),
    ({"target_lengths": torch.tensor([1.0, 2.0, 3.0])}, r"target_lengths must hold integers"),
    ({"backend": "nope"}, r"unknown backend 'nope'"),
    ({"backend": "cuda"}, r"backend='cuda' needs the score matrix on a CUDA device"),
], ids=lambda x: next(iter(x)) if isinstance(x, dict) else None)
def test_codes_bad_arguments_raise(change, message):
    query, target, matrix = _codes_ok()
    kwargs = {"query_codes": query, "target_codes": target, "matrix": matrix, **change}
    with pytest.raises(ValueError, match=message):
        soft_smith_waterman_codes(**kwargs)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_one_query_shared_by_every_pair_is_read_in_place(device, t):
    """A query expanded over the batch (stride 0, as a search passes it) scores as its copies do,
    bit for bit, with and without lengths, as given and transposed (targets shorter than the query)."""
    from swcli.ops import soft_smith_waterman_codes as codes_op

    g = torch.Generator().manual_seed(77)
    matrix = torch.randint(-4, 9, (24, 24), generator=g).float().to(device)
    for B, M, N in ((1200, 60, 90), (1200, 90, 40), (7, 33, 20)):  # many pairs (wide lanes on CUDA), few
        query = torch.randint(0, 24, (1, M), generator=g, dtype=torch.uint8).to(device)
        target = torch.randint(0, 24, (B, N), generator=g, dtype=torch.uint8).to(device)
        tlen = torch.randint(0, N + 1, (B,), generator=g).to(device)
        shared = query.expand(B, M)
        assert shared.stride(0) == 0
        for lengths in (None, tlen):
            alone = codes_op(shared, target, matrix, -2.0, t, None, lengths)
            copied = codes_op(shared.contiguous(), target, matrix, -2.0, t, None, lengths)
            assert torch.equal(alone, copied)
