"""The exact 16-bit search kernel (kernels/cuda/search_s16.cu, search.ExactSearch): one query against
padded targets at t = 0, two targets a register, against the float32 engine's exact scores."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
import torch

from swcli import database
from swcli.fasta import FastaRecord
from swcli.ops import load_engine, soft_smith_waterman_codes
from swcli.scoring import load_matrix
from swcli.search import ExactSearch, make_block, search
from swcli.statistics import KarlinAltschul
from swcli.testing import (cuda, padded_code_targets, random_protein, random_search_set, requires_cuda,
                           search_block, search_block_lengths, warp_width_lengths)

BLOSUM62 = load_matrix("BLOSUM62")


def test_the_table_holds_both_targets_scores_and_the_padding():
    S = BLOSUM62.tensor()
    exact = ExactSearch(S, -11, -1)
    K = S.shape[0]
    assert exact.table.shape == (K, K + 1, K + 1) and exact.table.dtype == torch.int32
    low = (exact.table & 0xFFFF).to(torch.int16).long()  # [q, b, a]: low half S[q][a]
    high = (exact.table >> 16).to(torch.int16).long()  # the high half S[q][b]
    pad = min(int(S.min()), 0)
    expected_low = torch.cat([S.long(), torch.full((K, 1), pad)], 1)[:, None, :].expand(K, K + 1, K + 1)
    expected_high = torch.cat([S.long(), torch.full((K, 1), pad)], 1)[:, :, None].expand(K, K + 1, K + 1)
    assert torch.equal(low, expected_low) and torch.equal(high, expected_high)
    assert exact.limit == 32767 - int(S.max())


def test_only_integer_settings_at_t0_on_cuda_take_the_kernel():
    S = BLOSUM62.tensor()
    assert ExactSearch.of(S, 0.0, -4.0, None, None) is None  # a CPU matrix
    if torch.cuda.is_available():
        G = S.cuda()
        assert ExactSearch.of(G, 0.0, -4.0, None, None) is not None
        assert ExactSearch.of(G, 0.0, None, -11.0, -1.0) is not None
        for refused in [(1.0, -4.0, None, None), (0.0, -4.5, None, None), (0.0, None, -11.0, -0.5),
                        (0.0, -2000.0, None, None), (0.0, None, -1.0, -5.0)]:
            assert ExactSearch.of(G, *refused) is None
        assert ExactSearch.of(G + 0.5, 0.0, -4.0, None, None) is None


@cuda
@requires_cuda
class TestCudaSearchS16:
    device = torch.device("cuda")

    # target lengths around the tile shapes' widths (64 to 1024 columns) and several tiles
    LENGTHS = [0, 1, 2, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 319, 320, 321, 447, 448, 449, 511,
               512, 513, 600, 1100, 2049]

    @pytest.mark.parametrize("gaps", [(-4, -4), (-11, -1), (-10, -2), (-1, 0)], ids=str)
    @pytest.mark.parametrize("width", [64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512, 600, 896, 1024, 1100, 2049])
    def test_scores_equal_the_float_engine(self, gaps, width):
        load_engine("cuda")
        rng = torch.Generator().manual_seed(40_000 + width)
        S = BLOSUM62.tensor(device=self.device)
        K = S.shape[0]
        targets, tlen = padded_code_targets(rng, search_block_lengths(width, self.LENGTHS, width), K, self.device)
        exact = ExactSearch(S, *gaps)
        for M in (1, 7, 31, 32, 33, 300):
            query = torch.randint(0, K, (M,), generator=rng, dtype=torch.uint8).to(self.device)
            block = search_block(targets, tlen)
            scores, overflows = exact.scores(query, block)
            keywords = {"gap": float(gaps[0])} if gaps[0] == gaps[1] else {"gap_open": float(gaps[0]),
                                                                           "gap_extend": float(gaps[1])}
            expected = soft_smith_waterman_codes(query.expand(len(tlen), -1), targets, S, temperature=0.0,
                                                 target_lengths=tlen, **keywords)
            assert int(overflows.item()) == 0
            assert torch.equal(scores.float(), expected), f"M = {M}"

    @pytest.mark.parametrize("gaps", [(-4, -4), (-11, -1)], ids=str)
    @pytest.mark.parametrize("lanes", [8, 16, 32])
    def test_every_warp_width_of_every_class(self, gaps, lanes):
        """Each warp takes the columns a lane its widest target needs (8 to the class's most, by 2): one
        warp for each, the widest exactly G R or one past G (R - 2), the others shorter; the block's
        widest sets the class (G lanes)."""
        load_engine("cuda")
        rng = torch.Generator().manual_seed(40_050 + lanes)
        S = BLOSUM62.tensor(device=self.device)
        lengths = warp_width_lengths(lanes, ExactSearch.SHAPES[gaps[0] != gaps[1]][0][1], lanes)
        targets, tlen = padded_code_targets(rng, lengths, S.shape[0], self.device)
        keywords = {"gap": float(gaps[0])} if gaps[0] == gaps[1] else {"gap_open": float(gaps[0]),
                                                                       "gap_extend": float(gaps[1])}
        for M in (1, 40, 301):
            query = torch.randint(0, S.shape[0], (M,), generator=rng, dtype=torch.uint8).to(self.device)
            scores, overflows = ExactSearch(S, *gaps).scores(query, search_block(targets, tlen))
            expected = soft_smith_waterman_codes(query.expand(len(tlen), -1), targets, S, temperature=0.0,
                                                 target_lengths=tlen, **keywords)
            assert int(overflows.item()) == 0
            assert torch.equal(scores.float(), expected), f"M = {M}"

    def test_an_odd_batch_and_junk_past_the_lengths(self):
        load_engine("cuda")
        rng = torch.Generator().manual_seed(40_100)
        S = BLOSUM62.tensor(device=self.device)
        targets, tlen = padded_code_targets(rng, [300, 299, 120, 5, 1], S.shape[0], self.device)
        query = torch.randint(0, S.shape[0], (77,), generator=rng, dtype=torch.uint8).to(self.device)
        exact = ExactSearch(S, -11, -1)
        clean, _ = exact.scores(query, search_block(targets, tlen))
        junk = targets.clone()
        junk[torch.arange(300, device=self.device)[None, :] >= tlen[:, None]] = 0  # 'A': a real letter
        assert torch.equal(exact.scores(query, search_block(junk, tlen))[0], clean)

    def test_scores_past_int16_are_flagged_and_the_search_scores_them_wider(self):
        # a matrix that gives 1,000 a match: a 40-letter self-match scores 40,000, past int16
        load_engine("cuda")
        K = BLOSUM62.tensor().shape[0]
        S = torch.full((K, K), -3.0)
        S.fill_diagonal_(1000.0)
        S = S.to(self.device)
        rng = random.Random(7)
        query = random_protein(rng, 40)
        sequences = [query, random_protein(rng, 40), query[:20], query[5:38]]
        db = database.build([FastaRecord("db.fa", k + 1, f"s{k}", s) for k, s in enumerate(sequences)], BLOSUM62,
                            "db.fa")
        codes = BLOSUM62.encode(query, lambda: "query")
        exact = ExactSearch(S, -4, -4)
        block = make_block(db, 0, len(db), self.device)
        scores, overflows = exact.scores(torch.tensor(list(codes), dtype=torch.uint8, device=self.device), block)
        assert int(overflows.item()) == 2 and int((scores < 0).sum()) == 2  # 40,000 and 33,000
        hits = list(search([codes], db, S, -4.0, 0.0, 4, "cuda", self.device))[0]
        float_hits = list(search([codes], db, S.cpu(), -4.0, 0.0, 4, "cpu", "cpu"))[0]
        assert torch.equal(hits.scores, float_hits.scores) and torch.equal(hits.targets, float_hits.targets)
        assert hits.scores[0].item() == 40_000.0
        # ranked by E-value, the pairs scored again are ranked again: the CPU engine's hits and E-values
        statistics = KarlinAltschul(0.27, 0.04, "given", 1.9, -30.0)
        ranked = list(search([codes], db, S, -4.0, 0.0, 4, "cuda", self.device, rank=statistics))[0]
        float_ranked = list(search([codes], db, S.cpu(), -4.0, 0.0, 4, "cpu", "cpu", rank=statistics))[0]
        assert torch.equal(ranked.targets, float_ranked.targets) and torch.equal(ranked.scores, float_ranked.scores)
        assert ranked.evalues.tolist() == float_ranked.evalues.tolist() and ranked.scores.max().item() == 40_000.0

    @pytest.mark.parametrize("waves", [1e9, 0.0], ids=["blocks-by-cells", "a-block-per-tile-class"])
    @pytest.mark.parametrize("gap, gap_open, gap_extend", [(-4.0, None, None), (None, -11.0, -1.0)])
    def test_search_equals_the_cpu_engines(self, gap, gap_open, gap_extend, waves, monkeypatch):
        monkeypatch.setattr(ExactSearch, "FILL_WAVES", waves)
        db, codes = random_search_set(40_200, BLOSUM62)
        load_engine("cuda")
        load_engine("cpu")
        on_gpu = list(search(codes, db, BLOSUM62.tensor(), gap, 0.0, 20, "cuda", self.device, max_cells=1 << 14,
                             gap_open=gap_open, gap_extend=gap_extend))
        on_cpu = list(search(codes, db, BLOSUM62.tensor(), gap, 0.0, 20, "cpu", "cpu", gap_open=gap_open,
                             gap_extend=gap_extend))
        for a, b in zip(on_gpu, on_cpu):
            assert torch.equal(a.scores, b.scores) and torch.equal(a.targets, b.targets)

    def test_a_fresh_process_needs_no_engine_loaded_first(self):
        # search() at t = 0 on CUDA is the 16-bit kernel's: it loads the CUDA engine itself
        program = ("import random, torch\n"
                   "from swcli import database\n"
                   "from swcli.fasta import FastaRecord\n"
                   "from swcli.scoring import load_matrix\n"
                   "from swcli.search import search\n"
                   "from swcli.testing import random_protein\n"
                   "B = load_matrix('BLOSUM62'); rng = random.Random(3)\n"
                   "seqs = [random_protein(rng, 50) for _ in range(20)]\n"
                   "db = database.build([FastaRecord('db.fa', k + 1, f's{k}', s) for k, s in enumerate(seqs)], B, 'db.fa')\n"
                   "hits = list(search([B.encode(seqs[3], lambda: 'q')], db, B.tensor(), -4.0, 0.0, 1, 'cuda',"
                   " torch.device('cuda')))[0]\n"
                   "print(int(hits.targets[0]))\n")
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split()[-1] == "3"

