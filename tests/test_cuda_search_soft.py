"""The soft search kernel (kernels/cuda/search_soft.cu, search.SoftSearch): one query against padded
targets at t > 0 in float32 scaled space, against the float64 engine, its NumPy model
(swcli.testing.soft_search_model), and the search's CPU engine."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from swcli import database
from swcli.fasta import FastaRecord, read_fasta
from swcli.ops import load_engine
from swcli.scoring import load_matrix
from swcli.search import Searcher, SoftSearch, make_block, search
from swcli.testing import (cuda, encoded, padded_code_targets, padded_encoded, random_protein, random_search_set,
                           related_protein_pairs, requires_cuda, search_block, search_block_lengths, slow,
                           soft_search_model)

BLOSUM62 = load_matrix("BLOSUM62")
LINEAR = {"gap": -4.0, "gap_open": None, "gap_extend": None}
AFFINE = {"gap": None, "gap_open": -11.0, "gap_extend": -1.0}
ROOT = Path(__file__).resolve().parents[1]


def soft_scores(settings: dict, query, targets, lengths, device) -> tuple[np.ndarray, int]:
    """The soft kernel's scores (on the host) and flagged count for SoftSearch.plan's settings (its powers
    included) and codes on the host, numpy or torch: the emulated kernel's interface."""
    soft = SoftSearch(torch.as_tensor(settings["powers"]).to(device),
                      {k: v for k, v in settings.items() if k != "powers"})
    scores, count = soft.scores(torch.as_tensor(query).to(torch.uint8).to(device),
                                search_block(torch.as_tensor(targets).to(torch.uint8).to(device),
                                             torch.as_tensor(lengths).to(device)))
    return scores.cpu().numpy(), int(count.item())


def float64_scores(query: torch.Tensor, targets: torch.Tensor, lengths: torch.Tensor, gaps: dict, t: float):
    """The float64 engine's scores, on the CPU (the CUDA engine takes a single long pair in 1-column
    lanes, slowly): dense float64 score matrices (the codes path computes in float32), a chunk of targets
    at a time, each chunk as wide as its longest target."""
    from swcli.ops import soft_smith_waterman

    load_engine("cpu")
    S = BLOSUM62.tensor(dtype=torch.float64)
    q, targets, cpu_lengths = query.long().cpu(), targets.cpu(), lengths.cpu()
    keywords = {"gap_open": gaps["gap_open"], "gap_extend": gaps["gap_extend"]} if gaps["gap"] is None else {}
    out = torch.empty(len(lengths), dtype=torch.float64)
    order = torch.argsort(cpu_lengths, descending=True).tolist()
    start = 0
    while start < len(order):
        width = max(int(cpu_lengths[order[start]]), 1)
        rows = max(1, (1 << 26) // (width * max(len(q), 1)))
        chunk = order[start:start + rows]
        dense = S[q[None, :, None], targets[chunk, :width].long()[:, None, :]]
        out[chunk] = soft_smith_waterman(dense, gaps["gap"], t, None, cpu_lengths[chunk], **keywords)
        start += rows
    return out.to(lengths.device)


def assert_cpu_hits(found, codes, db, gaps: dict, top: int, rtol: float, atol: float) -> None:
    """The hits are the CPU engine's search at t = 1: each hit's score within the tolerance of the CPU's
    score of the same target, and the hits are the CPU's best `top` up to that tolerance (two float32
    engines may order scores closer than it differently)."""
    load_engine("cpu")
    every = list(search(codes, db, BLOSUM62.tensor(), gaps["gap"], 1.0, len(db), "cpu", "cpu",
                        gap_open=gaps["gap_open"], gap_extend=gaps["gap_extend"]))
    assert len(found) == len(every)
    for hits, cpu in zip(found, every):
        by_target = dict(zip(cpu.targets.tolist(), cpu.scores.tolist()))
        scores = hits.scores.double()
        expected = torch.tensor([by_target[t] for t in hits.targets.tolist()], dtype=torch.float64)
        torch.testing.assert_close(scores, expected, rtol=rtol, atol=atol)
        assert len(hits.targets) == min(top, len(db))
        kth = cpu.scores[len(hits.targets) - 1].item()
        assert scores.min().item() >= kth - (atol + rtol * abs(kth))  # nothing better left out


def proteins() -> list[str]:
    """Real proteins: the benchmark's 250 (.bench/proteins.fasta) where the tree has them, else the
    package's example."""
    path = ROOT / ".bench" / "proteins.fasta"
    path = path if path.exists() else ROOT / "data" / "example.fasta"
    return [r.sequence for r in read_fasta(str(path)) if set(r.sequence) <= set(BLOSUM62.alphabet)]


@cuda
@requires_cuda
class TestCudaSearchSoft:
    device = torch.device("cuda")

    # target lengths around whole lanes (24 and 32 columns) and tiles (768 and 1,024), and several tiles
    LENGTHS = [0, 1, 2, 7, 8, 9, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 383, 384, 385, 511, 512,
               513, 767, 768, 769, 1000, 1100, 2049]

    @pytest.mark.parametrize("gaps", [LINEAR, AFFINE], ids=["linear", "affine"])
    @pytest.mark.parametrize("width", [64, 96, 128, 192, 256, 320, 384, 512, 600, 768, 1024, 1100, 2049])
    def test_scores_equal_the_float64_engine(self, gaps, width):
        load_engine("cuda")
        rng = torch.Generator().manual_seed(50_000 + width)
        S = BLOSUM62.tensor(device=self.device)
        K = S.shape[0]
        targets, tlen = padded_code_targets(rng, search_block_lengths(width, self.LENGTHS, width), K, self.device)
        soft = SoftSearch.of(S, 1.0, **gaps)
        for M in (1, 7, 33, 300):
            query = torch.randint(0, K, (M,), generator=rng, dtype=torch.uint8).to(self.device)
            scores, flagged = soft.scores(query, search_block(targets, tlen))
            expected = float64_scores(query, targets, tlen, gaps, 1.0)
            assert int(flagged.item()) == 0, f"M = {M}"
            torch.testing.assert_close(scores.double(), expected, rtol=2e-6, atol=2e-6, msg=f"M = {M}")
            assert torch.equal(scores[tlen == 0], torch.zeros_like(scores[tlen == 0]))

    @pytest.mark.parametrize("gaps", [LINEAR, AFFINE], ids=["linear", "affine"])
    def test_a_score_has_the_same_bits_in_every_block(self, gaps):
        """The scales are per 8 columns of the target, whatever the lanes and tiles: the same targets in
        blocks padded to widths from 64 to 1,500 columns give the same floats."""
        load_engine("cuda")
        rng = torch.Generator().manual_seed(50_100)
        S = BLOSUM62.tensor(device=self.device)
        pairs = related_protein_pairs(51, 12, 20, 60)
        query = torch.tensor(list(BLOSUM62.encode(pairs[0][0], lambda: "q")), dtype=torch.uint8, device=self.device)
        sequences = [t for _, t in pairs] + [pairs[0][0]]
        soft = SoftSearch.of(S, 1.0, **gaps)
        results = []
        longest = max(map(len, sequences))
        for width in [longest] + [w for w in (64, 128, 192, 256, 384, 512, 768, 1024, 1500) if w > longest]:
            codes = torch.randint(0, S.shape[0], (len(sequences), width), generator=rng, dtype=torch.uint8)
            for b, s in enumerate(sequences):
                codes[b, :len(s)] = torch.tensor(list(BLOSUM62.encode(s, lambda: "t")), dtype=torch.uint8)
            lengths = torch.tensor([len(s) for s in sequences], device=self.device)
            results.append(soft.scores(query, search_block(codes.to(self.device), lengths))[0])
        for other in results[1:]:
            assert torch.equal(other, results[0])

    @pytest.mark.parametrize("gaps", [LINEAR, AFFINE], ids=["linear", "affine"])
    def test_a_score_has_the_same_bits_whatever_its_neighbours_and_warps(self, gaps):
        """Each warp takes the launch's targets in turn, end to end in its lanes: the same targets after
        others of every length (each then starts at another lane and tile, some across a tile's edge), in
        an order that is not by length, among empty ones, swept by 1, 2, 3 or 7 warps or as many as the
        GPU holds (at most one a target), give the same floats as in a block of their own."""
        load_engine("cuda")
        rng = random.Random(50_120)
        S = BLOSUM62.tensor(device=self.device)
        pairs = related_protein_pairs(52, 6, 20, 120)
        query = torch.tensor(list(BLOSUM62.encode(pairs[0][0], lambda: "q")), dtype=torch.uint8, device=self.device)
        targets = [t for _, t in pairs] + [pairs[0][0]]
        soft = SoftSearch.of(S, 1.0, **gaps)
        settings = soft.settings
        columns = SoftSearch.COLUMNS[gaps["gap"] is None]

        def scores(sequences: list[str], warps: int) -> torch.Tensor:
            codes = torch.zeros((len(sequences), max(max(map(len, sequences)), 1)), dtype=torch.uint8)
            for b, letters in enumerate(sequences):
                codes[b, :len(letters)] = torch.tensor(list(BLOSUM62.encode(letters, lambda: "t")), dtype=torch.uint8)
            lengths = torch.tensor([len(c) for c in sequences], device=self.device)
            found, flagged = torch.ops.swcli.search_scores_soft(
                query, codes.to(self.device), lengths, soft.powers, warps, settings["affine"],
                settings["gap_factor"], settings["extend_factor"], settings["temperature"], settings["upper"],
                settings["middle"], settings["floor"], settings["bound"])
            assert int(flagged.item()) == 0
            return found

        alone = torch.stack([scores([t], 0)[0] for t in targets])
        for trial, warps in enumerate((1, 2, 3, 7, 0)):
            ahead = [random_protein(rng, rng.choice([1, columns - 1, columns, columns + 1, 7 * columns + 3,
                                                     33 * columns + 5])) for _ in range(3 * trial + 1)]
            sequences = ahead + targets + [""] * 3 + [random_protein(rng, rng.randint(1, 300)) for _ in range(20)]
            order = list(range(len(sequences)))
            rng.shuffle(order)
            found = scores([sequences[i] for i in order], warps)
            at = {i: k for k, i in enumerate(order)}
            assert torch.equal(found[[at[len(ahead) + j] for j in range(len(targets))]], alone), warps
            assert (found[[at[len(ahead) + len(targets) + j] for j in range(3)]] == 0).all()

    @pytest.mark.parametrize("gaps", [LINEAR, AFFINE], ids=["linear", "affine"])
    def test_blocks_of_any_size_give_the_same_bits(self, gaps):
        """Targets from 2,500 residues down to 1 in the search's blocks: one block, or blocks of at most
        2^12 or 2^10 padded cells (one launch each, its warps taking the block's targets in turn)."""
        load_engine("cuda")
        rng = random.Random(50_150)
        sequences = [random_protein(rng, n) for n in [2500, 1100, 1000, 800, 600, 500, 400, 300, 200, 150, 100, 70,
                                                       64, 30, 1]]
        db = database.build([FastaRecord("db.fa", k + 1, f"s{k}", s) for k, s in enumerate(sequences)], BLOSUM62,
                            "db.fa")
        query = torch.tensor(list(BLOSUM62.encode(sequences[5][:300], lambda: "q")), dtype=torch.uint8,
                             device=self.device)
        results = []
        for max_cells, blocks in ((1 << 26, 1), (1 << 12, 4), (1 << 10, 8)):
            searcher = Searcher(db, BLOSUM62.tensor(), gaps["gap"], 1.0, 10, "cuda", self.device,
                                max_cells=max_cells, gap_open=gaps["gap_open"], gap_extend=gaps["gap_extend"])
            assert len(searcher.bounds) == blocks and searcher.soft is not None
            parts = [searcher.soft.scores(query, block) for block in searcher.blocks()]
            assert all(int(flagged.item()) == 0 for _, flagged in parts)
            results.append(torch.cat([scores for scores, _ in parts]))
        assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])

    def test_an_odd_batch_and_junk_past_the_lengths(self):
        load_engine("cuda")
        rng = torch.Generator().manual_seed(50_200)
        S = BLOSUM62.tensor(device=self.device)
        targets, tlen = padded_code_targets(rng, [300, 299, 120, 5, 1], S.shape[0], self.device)
        query = torch.randint(0, S.shape[0], (77,), generator=rng, dtype=torch.uint8).to(self.device)
        for gaps in (LINEAR, AFFINE):
            soft = SoftSearch.of(S, 1.0, **gaps)
            clean, _ = soft.scores(query, search_block(targets, tlen))
            junk = targets.clone()
            junk[torch.arange(300, device=self.device)[None, :] >= tlen[:, None]] = 0  # 'A': a real letter
            assert torch.equal(soft.scores(query, search_block(junk, tlen))[0], clean)

    def test_exponents_out_of_range_are_refused(self):
        """The op checks its exponents: past [-126, 126] the scales leave the float range (a linear
        segment lands at 2^(2 middle - upper)), and middle < upper."""
        load_engine("cuda")
        plan = SoftSearch.plan(BLOSUM62.tensor(), 1.0, **LINEAR)
        targets, lengths = padded_encoded(BLOSUM62, ["MKV", "W"])
        query = encoded(BLOSUM62, "MKVL")
        assert soft_scores(plan, query, targets, lengths, self.device)[1] == 0
        for bad in (dict(middle=plan["upper"]), dict(upper=127), dict(middle=-127), dict(middle=-20, upper=100),
                    dict(floor=127), dict(floor=-1)):
            with pytest.raises(RuntimeError, match="exponents must be"):
                soft_scores(dict(plan, **bad), query, targets, lengths, self.device)

    @pytest.mark.parametrize("gaps", [LINEAR, AFFINE], ids=["linear", "affine"])
    def test_the_kernel_is_its_model(self, gaps):
        """The kernel and its NumPy model (the same algorithm, float32) on random and related pairs, with
        the settings of the search and with a low upper exponent that rescales every strong segment again
        and again: the same flags, scores within float32 rounding."""
        load_engine("cuda")
        S = BLOSUM62.tensor(device=self.device)
        pairs = related_protein_pairs(52, 6, 30, 70)
        rng = random.Random(52)
        query = pairs[0][0]
        sequences = [t for _, t in pairs] + [query, "", "W"]
        sequences += [random_protein(rng, rng.randint(1, 90)) for _ in range(9)]
        width = max(map(len, sequences))
        block = np.zeros((len(sequences), width), np.int64)
        for b, s in enumerate(sequences):
            block[b, :len(s)] = list(BLOSUM62.encode(s, lambda: "t"))
        lengths = np.array([len(s) for s in sequences])
        q = np.array(list(BLOSUM62.encode(query, lambda: "q")))
        plan = SoftSearch.plan(S, 1.0, **gaps)
        for settings in (plan, dict(plan, upper=30, middle=20, floor=126), dict(plan, floor=30)):
            scores, count = soft_scores(settings, q, block, lengths, self.device)
            expected, flagged = soft_search_model(q, block, lengths, settings)
            assert count == int(flagged.sum()) and (scores == -1).tolist() == flagged.tolist()
            assert count == 0 or settings["floor"] == 30
            np.testing.assert_allclose(scores[~flagged], expected[~flagged], rtol=1e-6, atol=1e-7)

    @pytest.mark.parametrize("gaps", [LINEAR, AFFINE], ids=["linear", "affine"])
    def test_the_floors_check_flags_what_the_model_flags(self, gaps):
        """Segments past the floor are checked cell by cell only where their first cell does not bound
        their cells above it: with floors from 2^0 to 2^-40 and values up to 2^60, the same flags as the
        model (which checks every cell), some pairs flagged and some not, and the same scores."""
        load_engine("cuda")
        S = BLOSUM62.tensor(device=self.device)
        pairs = related_protein_pairs(55, 6, 200, 320)
        rng = random.Random(55)
        query = pairs[0][0]
        sequences = [t for _, t in pairs] + [random_protein(rng, rng.randint(150, 400)) for _ in range(6)]
        targets, lengths = padded_encoded(BLOSUM62, sequences)
        q = encoded(BLOSUM62, query)
        plan = SoftSearch.plan(S, 1.0, **gaps)
        counts = []
        for floor in (0, 8, 16, 24, 40):
            settings = dict(plan, upper=60, middle=40, floor=floor)
            scores, count = soft_scores(settings, q, targets, lengths, self.device)
            expected, flags = soft_search_model(q, targets, lengths, settings)
            assert (scores < 0).tolist() == flags.tolist() and count == int(flags.sum())
            np.testing.assert_allclose(scores[~flags], expected[~flags], rtol=1e-6, atol=1e-7)
            counts.append(int(flags.sum()))
        assert counts[0] > 0 and counts[-1] < len(sequences), counts

    def test_flagged_pairs_score_minus_one_and_are_counted(self):
        """A floor of 2^0 with a low upper exponent flags the strong pairs (as the model says); a bound of
        1e30 (a score of ln 1e30 = 69 at t = 1) flags the weak pairs, not the empty target."""
        load_engine("cuda")
        S = BLOSUM62.tensor(device=self.device)
        query = related_protein_pairs(53, 1, 60, 60)[0][0]
        sequences = [query, query[10:50], "", "G", "WWW"]
        codes = torch.zeros((len(sequences), 60), dtype=torch.uint8)
        for b, s in enumerate(sequences):
            codes[b, :len(s)] = torch.tensor(list(BLOSUM62.encode(s, lambda: "t")), dtype=torch.uint8)
        lengths = torch.tensor([len(s) for s in sequences])
        q = torch.tensor(list(BLOSUM62.encode(query, lambda: "q")), dtype=torch.uint8)
        plan = SoftSearch.plan(S, 1.0, **LINEAR)
        strict = dict(plan, upper=30, middle=20, floor=0)
        _, expected = soft_search_model(q.long().numpy(), codes.long().numpy(), lengths.numpy(), strict)
        assert expected.tolist() == [True, True, False, False, False]
        loose = dict(plan, bound=1e30)
        model_scores, below_bound = soft_search_model(q.long().numpy(), codes.long().numpy(), lengths.numpy(), loose)
        assert below_bound.tolist() == [False, False, False, True, True] and model_scores[1] > 69 > model_scores[4]
        for settings, flags in ((strict, expected.tolist()), (loose, below_bound.tolist())):
            scores, count = soft_scores(settings, q, codes, lengths, self.device)
            assert (scores < 0).tolist() == flags and count == sum(flags)
            assert scores[scores < 0].tolist() == [-1.0] * sum(flags) and scores[2].item() == 0.0

    @pytest.mark.parametrize("gaps", [LINEAR, AFFINE], ids=["linear", "affine"])
    def test_flagged_pairs_are_scored_again_by_the_search(self, gaps, monkeypatch):
        """The search scores the flagged pairs again through the general op: its hits are the CPU engine's,
        and it counts them."""
        rng = random.Random(53)
        pairs = related_protein_pairs(54, 4, 40, 90)
        sequences = [t for _, t in pairs] + [random_protein(rng, rng.randint(1, 200)) for _ in range(150)]
        db = database.build([FastaRecord("db.fa", k + 1, f"s{k}", s) for k, s in enumerate(sequences)], BLOSUM62,
                            "db.fa")
        codes = [BLOSUM62.encode(q, lambda: "query") for q, _ in pairs]
        load_engine("cuda")
        load_engine("cpu")
        plan = SoftSearch.plan
        monkeypatch.setattr(SoftSearch, "plan", classmethod(
            lambda cls, *args: dict(plan(*args), upper=30, middle=20, floor=0)))
        searcher = Searcher(db, BLOSUM62.tensor(), gaps["gap"], 1.0, 10, "cuda", self.device, max_cells=1 << 13,
                            gap_open=gaps["gap_open"], gap_extend=gaps["gap_extend"])
        assert searcher.soft is not None
        on_gpu = [searcher.best(c) for c in codes]
        assert searcher.rescored >= len(codes)  # at least each query's relative
        assert_cpu_hits(on_gpu, codes, db, gaps, 10, rtol=2e-5, atol=1e-4)

    @pytest.mark.parametrize("gaps", [LINEAR, AFFINE], ids=["linear", "affine"])
    def test_search_equals_the_cpu_engines(self, gaps):
        db, codes = random_search_set(50_300, BLOSUM62)
        load_engine("cuda")
        load_engine("cpu")
        searcher = Searcher(db, BLOSUM62.tensor(), gaps["gap"], 1.0, 20, "cuda", self.device, max_cells=1 << 14,
                            gap_open=gaps["gap_open"], gap_extend=gaps["gap_extend"])
        assert searcher.soft is not None and searcher.exact is None
        on_gpu = list(search(codes, db, BLOSUM62.tensor(), gaps["gap"], 1.0, 20, "cuda", self.device,
                             max_cells=1 << 14, gap_open=gaps["gap_open"], gap_extend=gaps["gap_extend"]))
        assert_cpu_hits(on_gpu, codes, db, gaps, 20, rtol=2e-6, atol=1e-5)

    def test_queries_past_the_limit_take_the_ops_sweep(self, monkeypatch):
        """Queries on both sides of a SoftSearch.MAX_QUERY (linear gaps) in one search: the CPU engine's hits,
        none flagged by a kernel that did not score them."""
        rng = random.Random(50_500)
        sequences = [random_protein(rng, rng.randint(1, 300)) for _ in range(120)]
        db = database.build([FastaRecord("db.fa", k + 1, f"s{k}", s) for k, s in enumerate(sequences)], BLOSUM62,
                            "db.fa")
        limit = 400
        monkeypatch.setattr(SoftSearch, "MAX_QUERY", {False: limit, True: None})
        queries = [random_protein(rng, n) for n in (40, limit, limit + 1)]
        codes = [BLOSUM62.encode(q, lambda: "query") for q in queries]
        load_engine("cuda")
        on_gpu = list(search(codes, db, BLOSUM62.tensor(), -4.0, 1.0, 20, "cuda", self.device, max_cells=1 << 14))
        assert_cpu_hits(on_gpu, codes, db, LINEAR, 20, rtol=2e-6, atol=1e-5)

    @pytest.mark.parametrize("gaps", [LINEAR, AFFINE], ids=["linear", "affine"])
    def test_real_proteins_within_2e6_of_float64(self, gaps):
        """Real proteins against real proteins, their mutated copies and a target of 12,000 residues (real
        proteins end to end): every score within 2e-6 relative of the float64 engine, none flagged."""
        load_engine("cuda")
        rng = random.Random(50_400)
        real = proteins()
        sequences = rng.sample(real, min(120, len(real)))
        long = "".join(rng.sample(real, len(real)))
        while len(long) < 12_000:
            long += long
        S = BLOSUM62.tensor(device=self.device)
        soft = SoftSearch.of(S, 1.0, **gaps)
        for query in rng.sample([s for s in sequences if len(s) <= 600], 3):
            relatives = [t for _, t in related_protein_pairs(rng.randint(0, 99), 4, 50, 300)]
            targets = sequences + relatives + [long[:12_000]]
            targets += [query, query[len(query) // 3:]]
            targets.sort(key=len, reverse=True)
            width = len(targets[0])
            codes = torch.zeros((len(targets), width), dtype=torch.uint8)
            for b, s in enumerate(targets):
                codes[b, :len(s)] = torch.tensor(list(BLOSUM62.encode(s, lambda: "t")), dtype=torch.uint8)
            codes, lengths = codes.to(self.device), torch.tensor([len(s) for s in targets], device=self.device)
            q = torch.tensor(list(BLOSUM62.encode(query, lambda: "q")), dtype=torch.uint8, device=self.device)
            scores, flagged = soft.scores(q, search_block(codes, lengths))
            expected = float64_scores(q, codes, lengths, gaps, 1.0)
            assert int(flagged.item()) == 0
            relative = ((scores.double() - expected).abs() / expected.abs().clamp_min(1e-30)).max().item()
            assert relative <= 2e-6, relative

    @slow
    @pytest.mark.parametrize("t", [0.9, 1.5, 3.0])
    @pytest.mark.parametrize("gaps", [LINEAR, AFFINE], ids=["linear", "affine"])
    def test_other_temperatures_against_float64(self, gaps, t):
        load_engine("cuda")
        rng = torch.Generator().manual_seed(50_500)
        S = BLOSUM62.tensor(device=self.device)
        soft = SoftSearch.of(S, t, **gaps)
        if soft is None:
            pytest.skip(f"the kernel does not take t = {t} with these gaps")
        lengths = [700] + torch.randint(0, 700, (200,), generator=rng).tolist()
        targets, tlen = padded_code_targets(rng, lengths, S.shape[0], self.device)
        query = torch.randint(0, S.shape[0], (250,), generator=rng, dtype=torch.uint8).to(self.device)
        scores, flagged = soft.scores(query, search_block(targets, tlen))
        assert int(flagged.item()) == 0
        torch.testing.assert_close(scores.double(), float64_scores(query, targets, tlen, gaps, t), rtol=2e-6,
                                   atol=2e-6)

    def test_which_kernel_the_searcher_takes(self, monkeypatch):
        load_engine("cuda")
        db = database.build([FastaRecord("db.fa", 1, "s0", "MKVLA"), FastaRecord("db.fa", 2, "s1", "WW")], BLOSUM62,
                            "db.fa")
        soft = Searcher(db, BLOSUM62.tensor(), -4.0, 1.0, 5, "cuda", self.device)
        assert soft.soft is not None and soft.kernel is soft.soft
        assert SoftSearch.MAX_QUERY == {False: None, True: None} and soft.kernel_for(100_000) is soft.soft
        affine = Searcher(db, BLOSUM62.tensor(), None, 1.0, 5, "cuda", self.device, gap_open=-11.0, gap_extend=-1.0)
        assert affine.kernel_for(100_000) is affine.soft
        monkeypatch.setattr(SoftSearch, "MAX_QUERY", {False: 1000, True: None})
        assert soft.kernel_for(1000) is soft.soft and soft.kernel_for(1001) is None
        exact = Searcher(db, BLOSUM62.tensor(), -4.0, 0.0, 5, "cuda", self.device)
        assert exact.exact is not None and exact.soft is None
        general = Searcher(db, BLOSUM62.tensor(), -4.0, 0.5, 5, "cuda", self.device)
        assert general.kernel is None

    def test_make_block_then_search_one_block(self):
        """A block made by the search (its padding from the flat codes), scored by the kernel, equals the
        float64 engine on the same block."""
        load_engine("cuda")
        rng = random.Random(50_600)
        sequences = [random_protein(rng, rng.randint(1, 300)) for _ in range(70)]
        db = database.build([FastaRecord("db.fa", k + 1, f"s{k}", s) for k, s in enumerate(sequences)], BLOSUM62,
                            "db.fa")
        block = make_block(db, 0, len(db), self.device)
        query = torch.tensor(list(BLOSUM62.encode(sequences[3], lambda: "q")), dtype=torch.uint8, device=self.device)
        soft = SoftSearch.of(BLOSUM62.tensor(device=self.device), 1.0, **AFFINE)
        scores, flagged = soft.scores(query, block)
        assert int(flagged.item()) == 0
        torch.testing.assert_close(scores.double(), float64_scores(query, block.codes, block.lengths, AFFINE, 1.0),
                                   rtol=2e-6, atol=2e-6)
