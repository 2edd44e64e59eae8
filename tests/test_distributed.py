"""distributed.py: search and align on torchrun's ranks equal one process, byte for byte; failures stop all.

The shards and the merge are checked in this process against one Searcher (on every device), and which
processes join (launch.py) against given environments. The runs of several processes are 2 CPU ranks
(gloo): one torchrun start runs many commands in each rank (tests/distributed_worker.py), whose outputs
are compared with the same commands in one process; a few more run the real command line through
torchrun (a rank that dies, an error outside the exchanges, a subprocess of a worker). The failures that
leave a group broken (an error no exchange carries, a rank that dies or hangs) run the command line as
ranks started by hand, one pair of processes each, so that each rank's exit code and words are its own.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from swcli import database, distributed
from swcli.cli import main
from swcli.details import COLUMNS
from swcli.errors import SwcliError
from swcli.fasta import FastaRecord
from swcli.ops import load_engine
from swcli.scoring import load_matrix
from swcli.search import LOW, Searcher, hits_of, score_keys
from swcli.statistics import KarlinAltschul
from swcli.testing import DEVICE_PARAMS, random_protein, related_protein_pairs, run_cli, write_fasta

REPO = Path(__file__).resolve().parent.parent
BLOSUM62 = load_matrix("BLOSUM62")
ALL_COLUMNS = ",".join(COLUMNS)
STATISTICS = ["--lambda", "0.27", "--k", "0.04"]
RANKED = KarlinAltschul(0.27, 0.04, "given", 1.9, -30.0)  # BLOSUM62 11/1's values, with a length correction


def build(sequences):
    return database.build([FastaRecord("db.fa", k + 1, f"s{k}", s) for k, s in enumerate(sequences)], BLOSUM62, "db")


# --------------------------------------------------------------------------------------------------
# In this process: the shards, the payloads, the merge


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_shards_cover_the_length_order_balanced_by_residues(size):
    rng = random.Random(size)
    lengths = sorted((rng.randint(1, 400) for _ in range(500)), reverse=True)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    bounds = distributed.shard_bounds(offsets, size)
    assert len(bounds) == size and bounds[0][0] == 0 and bounds[-1][1] == len(lengths)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    share = offsets[-1] / size
    for first, last in bounds:  # each cut is at the boundary nearest its share: off by half a sequence at most
        assert abs(offsets[last] - offsets[first] - share) <= max(lengths)


def test_a_sequence_longer_than_a_share_is_a_shard_alone_and_leaves_empty_shards():
    offsets = np.concatenate([[0], np.cumsum([1000, 10, 10, 10])])
    assert distributed.shard_bounds(offsets, 2) == [(0, 1), (1, 4)]
    assert distributed.shard_bounds(offsets, 4) == [(0, 0), (0, 1), (1, 1), (1, 4)]
    assert distributed.shard_bounds(np.zeros(1, dtype=np.int64), 3) == [(0, 0)] * 3  # an empty database
    assert distributed.shard_bounds(np.array([0, 5]), 3) == [(0, 0), (0, 1), (1, 1)]  # fewer sequences than ranks


def sharded_hits(db, codes, top, size, device, t, rank=None, **limits):
    """Each query's hits as `size` ranks find them: each rank's Searcher on its shard, the payloads stacked
    (what the all-gather gives every rank) and merged."""
    bounds = distributed.shard_bounds(db.offsets, size)
    searchers = [Searcher(db, BLOSUM62.tensor(), -4.0, t, top, "cuda" if device.type == "cuda" else "cpu",
                          device, rank=rank, rows=rows, **limits) for rows in bounds]
    found = []
    for query in codes:
        payloads = []
        for searcher in searchers:
            pending = searcher.launch(query)
            searcher.rescore_flagged(pending)
            payloads.append(distributed.key_payload(pending.keys, pending.ranks, False, top, rank is not None, device))
        found.append(hits_of(*distributed.merge_payloads(torch.stack(payloads).cpu(), top, rank is not None)))
    return found, bounds


@pytest.mark.parametrize("device", DEVICE_PARAMS)
@pytest.mark.parametrize("t, rank", [(0.0, None), (1.0, None), (0.0, RANKED)], ids=["t0", "t1", "t0-evalue"])
def test_sharded_search_equals_one_searcher_bit_for_bit(device, t, rank):
    """Every rank count, shards cut inside blocks (the blocks keep the single process's shape), resident and
    streamed, by score and by E-value: the same hits, scores and E-values, ties by database order
    included. 1,500 sequences of one block make a batch past the CUDA engine's switch from 1 to 8 columns
    per lane (1,056 pairs on an H200)."""
    load_engine(device)
    rng = random.Random(3)
    pairs = related_protein_pairs(4, 3, 30, 90)
    sequences = [random_protein(rng, rng.randint(5, 60)) for _ in range(1500)] + [t for _, t in pairs]
    sequences.insert(700, random_protein(rng, 2500))  # a long one: the first block's width
    sequences += sequences[100:160]  # ties, in other shards
    db = build(sequences)
    codes = [BLOSUM62.encode(q, lambda: "query") for q, _ in pairs] + [b""]  # an empty query too
    for limits in ({}, {"max_cells": 20_000}, {"max_cells": 20_000, "max_bytes": 0}):
        whole = Searcher(db, BLOSUM62.tensor(), -4.0, t, 9, "cuda" if device.type == "cuda" else "cpu", device,
                         rank=rank, **limits)
        expected = [whole.best(c) for c in codes]
        for size in (2, 5):
            found, _ = sharded_hits(db, codes, 9, size, device, t, rank, **limits)
            for want, got in zip(expected, found, strict=True):
                assert torch.equal(got.targets, want.targets) and torch.equal(got.scores, want.scores)
                assert (got.evalues is None) == (rank is None)
                if rank is not None:
                    assert got.evalues.tolist() == want.evalues.tolist()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("gaps", [{"gap": -4.0}, {"gap": None, "gap_open": -11.0, "gap_extend": -1.0}])
@pytest.mark.parametrize("t", [0.5, 1.0])
def test_rows_of_length_zero_leave_the_other_rows_bits_on_cuda(gaps, t):
    """What the shards rely on where the CUDA engine's choices depend on the whole call (lanes by the
    batch's size, the longest pairs relayed by blocks of warps, at most 2 per SM): 1,500 pairs whose work
    all passes the relay threshold; zeroing the head or the tail of the block, as a shard's cut does,
    leaves every other row's score the same, bit for bit."""
    from swcli.ops import score_checked_codes

    load_engine("cuda")
    rng = random.Random(8)
    query = torch.tensor(list(BLOSUM62.encode(random_protein(rng, 1100), lambda: "q")), dtype=torch.uint8)
    lengths = torch.tensor(sorted((rng.randint(300, 900) for _ in range(1500)), reverse=True))
    codes = torch.randint(0, 20, (1500, int(lengths[0])), dtype=torch.uint8)
    gaps = dict(gaps)
    matrix, gap = BLOSUM62.tensor().cuda(), gaps.pop("gap")

    def scores(kept):
        cut = torch.where(kept, lengths, torch.zeros_like(lengths))
        return score_checked_codes(query.cuda().expand(1500, -1), codes.cuda(), matrix, gap, t, None, cut.cuda(),
                                   "cuda", **gaps).cpu()

    whole = scores(torch.ones(1500, dtype=torch.bool))
    rows = torch.arange(1500)
    for kept in (rows >= 700, rows < 800, (rows >= 300) & (rows < 1200)):
        assert torch.equal(scores(kept)[kept], whole[kept])


def test_a_shard_past_the_top_and_empty_shards_merge_to_the_whole():
    db = build(["MKV", "MKVL", "ACDEF"])
    codes = [BLOSUM62.encode("MKVLA", lambda: "q")]
    found, bounds = sharded_hits(db, codes, 10, 5, torch.device("cpu"), 0.0)
    assert sum(last > first for first, last in bounds) < 5  # some ranks have nothing
    assert sorted(found[0].targets.tolist()) == [0, 1, 2]
    empty, _ = sharded_hits(build([]), codes, 4, 3, torch.device("cpu"), 1.0)
    assert len(empty[0].scores) == 0


def test_payloads_carry_status_count_and_any_int64_key():
    keys = torch.tensor([torch.iinfo(torch.int64).max, 0, torch.iinfo(torch.int64).min])  # no value is special
    rows = [distributed.key_payload(keys, None, False, 4, False, "cpu"),
            distributed.key_payload(None, None, False, 4, False, "cpu"),
            distributed.key_payload(keys[:1], None, True, 4, False, "cpu")]
    assert rows[0].tolist()[:2] == [0, 3] and rows[1].tolist() == [0] * 6 and rows[2].tolist()[:2] == [1, 0]
    best, ranks = distributed.merge_payloads(torch.stack(rows[:2]), 2)
    assert best.tolist() == keys[:2].tolist() and ranks is None
    scores, order = torch.tensor([3.0, 3.0, 5.0]), torch.tensor([7, 2, 9])
    split = [distributed.key_payload(score_keys(scores[[k]], LOW - order[[k]]), None, False, 2, False, "cpu")
             for k in range(3)]
    merged = hits_of(*distributed.merge_payloads(torch.stack(split), 2))
    assert merged.targets.tolist() == [9, 2]  # the tie between 7 and 2 goes to the earlier in the database


def test_ranked_payloads_carry_r_bit_for_bit_and_merge_by_r_then_key():
    """By E-value: R (float64, sent as its bits) first, then the key; 3 ranks, one of them empty."""
    r = torch.tensor([-2.5, 1e-300, float("-inf"), 7.0, 7.0], dtype=torch.float64)
    keys = score_keys(torch.tensor([1.0, 2.0, 3.0, 4.0, 4.0]), LOW - torch.tensor([0, 1, 2, 5, 3]))
    rows = [distributed.key_payload(keys[:2], r[:2], False, 3, True, "cpu"),
            distributed.key_payload(None, None, False, 3, True, "cpu"),
            distributed.key_payload(keys[2:], r[2:], False, 3, True, "cpu")]
    assert rows[1].shape == (8,) and rows[0][5:7].view(torch.float64).tolist() == [-2.5, 1e-300]
    best, ranks = distributed.merge_payloads(torch.stack(rows), 3, ranked=True)
    assert ranks.tolist() == [7.0, 7.0, 1e-300]
    assert hits_of(best, ranks).targets.tolist() == [3, 5, 1]  # equal R: the earlier in the database


def test_without_torchrun_there_is_no_group(monkeypatch):
    for name in distributed.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    assert distributed.environment() is None and distributed.start(["-"]) is None
    monkeypatch.setenv("RANK", "one")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(SwcliError, match="must be integers"):
        distributed.environment()


TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_the_only_rank_runs_the_plain_command_unless_asked(monkeypatch):
    """torchrun --nproc-per-node 1: no process group (its start and exchanges would only cost time), and
    nothing said; --distributed on joins the group of one."""
    from swcli import launch

    for name, value in {**TORCHRUN, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(launch, "parent_environment", lambda pid: {})  # set for this process: torchrun's
    joined = []
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda *a, **k: joined.append(a) or 1 / 0)
    assert distributed.start(["q.fa", "db.fa"]) is None and joined == []
    with pytest.raises(SwcliError, match="rank 0: cannot join the other processes"):
        distributed.start(["q.fa", "db.fa"], "on")
    assert len(joined) == 1


@pytest.mark.parametrize("parent, inherited", [
    (None, False),  # unreadable: the variables count as this process's, as before
    ({}, False),  # torchrun's agent: it has none of them
    ({"PATH": "/bin"}, False),
    (TORCHRUN, True),  # a torchrun worker's subprocess
    ({**TORCHRUN, "MASTER_PORT": "29501"}, False),  # a torchrun started inside another one's rank
    ({**TORCHRUN, "RANK": "0"}, False),
])
def test_torchrun_variables_count_only_where_the_parent_does_not_hold_them(parent, inherited):
    from swcli import launch

    found = launch.find(TORCHRUN, parent, 4321)
    assert (found.rank, found.size, found.local_rank) == (1, 2, 1)
    assert found.inherited is inherited and found.parent == (4321 if inherited else None)
    assert launch.find({"RANK": "1", "WORLD_SIZE": "2"}, {}, 1) is None  # LOCAL_RANK missing: not torchrun's
    without_meeting = {name: TORCHRUN[name] for name in launch.VARIABLES}
    assert launch.find(without_meeting, TORCHRUN, 7).inherited  # the meeting point is compared where set


def test_a_torchrun_worker_whose_agent_holds_the_same_variables_is_a_rank():
    # the shell that started torchrun exported RANK, WORLD_SIZE, LOCAL_RANK and the meeting point: the
    # agent's environment holds them, but not the run id and error file torchrun gives each worker
    from swcli import launch

    worker = {**TORCHRUN, "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_ERROR_FILE": "/tmp/t/attempt_0/1/error.json"}
    assert not launch.find(worker, TORCHRUN, 11).inherited
    assert launch.find(worker, worker, 12).inherited  # a process that the worker starts


def test_the_parent_environment_is_read_from_proc():
    """A process's environment as it started: the child's own holds the variable given to it, its parent's
    (this process, which never had it) does not."""
    from swcli import launch

    if not os.path.exists(f"/proc/{os.getpid()}/environ"):
        pytest.skip("no /proc here: the parent's environment cannot be read (the variables then count)")
    script = ("import json, os, sys; sys.path.insert(0, sys.argv[1]); from swcli.launch import parent_environment; "
              "print(json.dumps([parent_environment(p).get('SWCLI_PROBE') for p in (os.getpid(), os.getppid())]))")
    child = subprocess.run([sys.executable, "-c", script, str(REPO)], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "SWCLI_PROBE": "a=b"})
    assert child.returncode == 0 and json.loads(child.stdout) == ["a=b", None]
    assert launch.parent_environment(0) is None and launch.parent_environment(2**22 + 12345) is None


def inherit_torchrun(monkeypatch, rank="1"):
    """This process as a subprocess of torchrun's rank `rank`: the variables set, and its parent's."""
    from swcli import launch

    variables = {**TORCHRUN, "RANK": rank, "LOCAL_RANK": rank}
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(launch, "parent_environment", lambda pid: dict(variables))


def test_inherited_variables_run_one_process_and_say_so(monkeypatch, capsys):
    inherit_torchrun(monkeypatch)
    assert distributed.start(["-"]) is None
    assert capsys.readouterr().err == (f"swcli: running as one process: RANK, WORLD_SIZE and LOCAL_RANK are those of "
                                       f"the parent process (pid {os.getppid()}), not set for this one "
                                       "(--distributed on joins their process group)\n")
    assert distributed.start(["-"], "auto", quiet=True) is None and distributed.start([], "off") is None
    assert capsys.readouterr().err == ""


def test_distributed_on_without_torchrun_is_an_error(monkeypatch, tmp_path, capsys):
    for name in distributed.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    fasta = write_fasta(tmp_path / "q.fa", [("a", "MKVL")])
    for command in (["search", fasta, fasta], ["align", fasta, fasta]):
        code, out, err = run_cli([*command, "--backend", "cpu", "--distributed", "on"], capsys)
        assert (code, out) == (1, "") and err == ("swcli: error: --distributed on: RANK, WORLD_SIZE, LOCAL_RANK are "
                                                  "not set: start the command with torchrun (torchrun "
                                                  "--nproc-per-node N -m swcli ...)\n")


def test_a_usage_error_is_said_by_rank_0_or_by_a_process_that_is_no_rank(monkeypatch, capsys):
    from swcli import launch

    for name, value in TORCHRUN.items():  # rank 1, started by torchrun: rank 0 says it
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(launch, "parent_environment", lambda pid: {})
    assert run_cli(["search", "--no-such-option"], capsys) == (2, "", "")
    inherit_torchrun(monkeypatch)  # a subprocess of rank 1: alone, it says it
    code, _, err = run_cli(["search", "--no-such-option"], capsys)
    assert code == 2 and err.startswith("swcli: usage error: No such option: --no-such-option")


@pytest.mark.parametrize("value", ["abc", "0", "-3", "nan"])
def test_the_waits_limits_must_be_seconds(monkeypatch, value):
    monkeypatch.setenv("SWCLI_DISTRIBUTED_SILENCE", value)
    with pytest.raises(SwcliError, match=f"^SWCLI_DISTRIBUTED_SILENCE={value}: give the seconds to wait, a number > 0$"):
        distributed._seconds("SWCLI_DISTRIBUTED_SILENCE", 15.0)
    monkeypatch.setenv("SWCLI_DISTRIBUTED_SILENCE", "2.5")
    assert distributed._seconds("SWCLI_DISTRIBUTED_SILENCE", 15.0) == 2.5
    monkeypatch.delenv("SWCLI_DISTRIBUTED_SILENCE")
    assert distributed._seconds("SWCLI_DISTRIBUTED_SILENCE", 15.0) == 15.0


def test_a_group_that_broke_is_not_used_again(monkeypatch):
    """One process, several commands (as the tests' worker runs them): after a command left the group
    broken, the next one says so rather than wait in it."""
    from swcli import launch

    monkeypatch.setattr(launch, "find", lambda: launch.Launch(1, 2, 1, None))
    monkeypatch.setattr(distributed, "_group", distributed.Group(1, 2, 1, 60.0, lost=True))
    with pytest.raises(SwcliError, match="^rank 1: the process group broke in an earlier command of this process$"):
        distributed.start([], "on")
    assert distributed.left_broken() and distributed.finish(KeyError("x")).args == ("x",)  # no command ran


def test_stats_name_the_ranks():
    from swcli.commands import _ranks

    assert _ranks(None) == ""
    assert _ranks(distributed.Group(0, 1, 0, 60.0)) == "; 1 rank"
    assert _ranks(distributed.Group(0, 3, 0, 60.0)) == "; 3 ranks, the scoring calls rank 0's, on its share"


def test_failures_are_reported_with_their_exit_code():
    import typer

    from swcli._build import BuildError

    assert distributed._report(BrokenPipeError()) == (141, None)
    assert distributed._report(typer.Exit(3)) == (3, None)
    assert distributed._report(SwcliError("q.fa: record 2")) == (1, "q.fa: record 2")
    assert distributed._report(BuildError("no compiler")) == (1, "no compiler")
    assert distributed._report(KeyError("x")) == (1, "KeyError: 'x'")
    assert distributed._expected(SwcliError("x")) and not distributed._expected(KeyError("x"))


# --------------------------------------------------------------------------------------------------
# Two ranks, through torchrun


def torchrun(args, tmp_path, env=None, timeout=300):
    """torchrun --standalone (a free port) with 2 ranks, this checkout first on the path."""
    environment = {**os.environ, **(env or {}),
                   "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           *args], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Queries; a database whose 2 shards are uneven (one long sequence holds half the residues); a
    database of one sequence (an empty shard); its makedb folder; pair files of 13 pairs."""
    folder = tmp_path_factory.mktemp("distributed")
    rng = random.Random(21)
    related = related_protein_pairs(22, 4, 20, 90)
    sequences = [random_protein(rng, rng.randint(5, 80)) for _ in range(120)] + [t for _, t in related]
    sequences.insert(40, random_protein(rng, 6000))
    sequences += sequences[:8]  # ties
    assert distributed.shard_bounds(build(sequences).offsets, 2)[0] == (0, 1)
    pairs = related_protein_pairs(23, 13, 1, 70)
    bad = [t for _, t in pairs]
    bad[4] = bad[4][:2] + "1" + bad[4][3:]  # pair 5: chunk 1 of --chunk-size 3, rank 1's
    paths = {
        "q": write_fasta(folder / "q.fa", [(f"q{k}", q) for k, (q, _) in enumerate(related)]),
        "db": write_fasta(folder / "db.fa", [(f"d{k}", s) for k, s in enumerate(sequences)]),
        "one": write_fasta(folder / "one.fa", [("only", sequences[3])]),
        "pq": write_fasta(folder / "pq.fa", [(f"p{k}", q) for k, (q, _) in enumerate(pairs)]),
        "pt": write_fasta(folder / "pt.fa", [(f"t{k}", t) for k, (_, t) in enumerate(pairs)]),
        "bad": write_fasta(folder / "bad.fa", [(f"t{k}", t) for k, t in enumerate(bad)]),
        "prepared": str(folder / "prepared"),
    }
    load_engine("cpu")  # built before the ranks start, so that no rank says it compiles
    assert main(["makedb", paths["db"], paths["prepared"]]) == 0
    return folder, paths


def commands(paths, folder):
    """(name, argv, env) of the commands each rank runs; failures between successes, so that a failure
    is seen to leave the ranks in step."""
    p, cpu = paths, ["--backend", "cpu"]
    out = lambda name: str(folder / name)  # noqa: E731
    return [
        ("search", ["search", p["q"], p["db"], "-k", "7", "-t", "1", *cpu], {}),
        ("search_fails_on_rank_1", ["search", p["q"], p["db"], "-t", "1", "-o", out("kept1.tsv"), *cpu],
         {"SWCLI_FAIL_AT": "1:query:2"}),
        ("search_details", ["search", p["q"], p["prepared"], "-t", "0", "--gap-open", "-11", "--gap-extend", "-1",
                            "--format-output", ALL_COLUMNS, *STATISTICS, "-o", out("details.tsv"), *cpu], {}),
        ("search_fails_on_rank_0", ["search", p["q"], p["db"], *cpu], {"SWCLI_FAIL_AT": "0:query:0"}),
        ("search_by_evalue", ["search", p["q"], p["db"], "-k", "5", "-t", "0", "--gap-open", "-11", "--gap-extend", "-1",
                              "--rank", "evalue", *STATISTICS, "--alpha", "1.9", "--beta", "-30", "--max-evalue", "50",
                              "--format-output",
                              "query,target,tlen,score,evalue,cigar", *cpu], {}),
        ("search_empty_shard", ["search", p["q"], p["one"], "-k", "3", "-t", "1", "--max-memory", "0", *cpu], {}),
        ("align_details", ["align", p["pq"], p["pt"], "--chunk-size", "3", "-t", "1", "--format-output", ALL_COLUMNS,
                           *STATISTICS, "-o", out("align.tsv"), *cpu], {}),
        ("align_bad_letter_on_rank_1", ["align", p["pq"], p["bad"], "--chunk-size", "3", "-o", out("kept2.tsv"), *cpu],
         {}),
        ("align_fails_at_setup", ["align", p["pq"], p["pt"], *cpu], {"SWCLI_FAIL_AT": "1:setup"}),
        ("align_all_vs_all", ["align", p["pq"], "--all-vs-all", "--chunk-size", "7", "-t", "0", *cpu], {}),
        ("align_fails_midway", ["align", p["pq"], p["pt"], "--chunk-size", "3", "-o", out("kept3.tsv"), *cpu],
         {"SWCLI_FAIL_AT": "1:chunk:1"}),
        ("stdin", ["search", "-", p["db"], *cpu], {}),
        ("search_final_write_fails", ["search", p["q"], p["db"], "-t", "1", "-o", out("kept4.tsv"), *cpu], {}),
        ("align_final_write_fails", ["align", p["pq"], p["pt"], "--chunk-size", "3", "-o", out("kept5.tsv"), *cpu],
         {}),
        ("search_alone", ["search", p["q"], p["db"], "-k", "3", "--distributed", "off", *cpu], {}),
        ("search_fails_on_rank_1_at_the_end", ["search", p["q"], p["db"], "-t", "1", "-o", out("kept6.tsv"), *cpu],
         {"SWCLI_FAIL_AT": "1:closing"}),
        ("search_disk_full", ["search", p["q"], p["db"], "-t", "1", "-o", "/dev/full", *cpu], {}),
        ("search_stats", ["search", p["q"], p["db"], "-t", "0", "--stats", "-o", out("stats.tsv"), *cpu], {}),
        ("align_stats", ["align", p["pq"], p["pt"], "--chunk-size", "3", "--stats", "-q", "-o", out("stats2.tsv"),
                         *cpu], {}),
    ]


# Faults of the operating system, made in the worker (tests/distributed_worker.py) by rank 0 alone: the
# last steps of putting the output in place fail as on a full disk, or in a folder made read-only.
FAULTS = {
    "search_final_write_fails": {"rank": 0, "call": "fsync", "errno": "ENOSPC"},
    "align_final_write_fails": {"rank": 0, "call": "replace", "errno": "EACCES"},
}
KEPT = ("kept1.tsv", "kept2.tsv", "kept3.tsv", "kept4.tsv", "kept5.tsv", "kept6.tsv")


@pytest.fixture(scope="module")
def ranks(files):
    """Every command run by 2 ranks in one torchrun start: {name: [rank 0's, rank 1's outcome]}."""
    folder, paths = files
    for name in KEPT:
        (folder / name).write_text("old\n")
    cases = [{"name": n, "argv": argv, "env": env, "fault": FAULTS.get(n)} for n, argv, env in commands(paths, folder)]
    (folder / "cases.json").write_text(json.dumps(cases))
    (folder / "results").mkdir()
    run = torchrun([str(REPO / "tests" / "distributed_worker.py"), str(folder / "cases.json"),
                    str(folder / "results")], folder)
    assert run.returncode == 0, run.stderr[-3000:]
    outcomes = [json.loads((folder / "results" / f"rank{r}.json").read_text()) for r in (0, 1)]
    return {name: [outcome[name] for outcome in outcomes] for name in outcomes[0]}


def one_process(argv, capsys):
    """The command in this process (no torchrun): exit code, stdout, stderr."""
    return run_cli(argv, capsys)


@pytest.mark.parametrize("name", ["search", "search_details", "search_by_evalue", "search_empty_shard",
                                  "align_details", "align_all_vs_all"])
def test_two_ranks_write_what_one_process_writes(ranks, files, capsys, tmp_path, name):
    folder, paths = files
    argv = {n: argv for n, argv, _ in commands(paths, folder)}[name]
    written = None
    if "-o" in argv:  # the same command, into a file of its own
        at = argv.index("-o") + 1
        written = Path(argv[at]).read_bytes()
        argv = [*argv[:at], str(tmp_path / "one.tsv"), *argv[at + 1:]]
    code, out, err = one_process(argv, capsys)
    first, second = ranks[name]
    assert code == first["code"] == second["code"] == 0
    if written is not None:
        assert written == (tmp_path / "one.tsv").read_bytes() and written.count(b"\n") > 3
    else:
        assert first["stdout"].encode("latin-1") == out.encode() and out.count("\n") > 3
    assert first["stderr"] == err and second["stderr"] == second["stdout"] == ""  # rank 0 speaks alone


@pytest.mark.parametrize("name", ["search_stats", "align_stats"])
def test_stats_are_rank_0s_and_count_every_ranks_work(ranks, files, capsys, tmp_path, name):
    """--stats: rank 0 says the whole run's work (the same counts as one process) and that its scoring
    calls are its own share; rank 1 says nothing."""
    folder, paths = files
    argv = {n: argv for n, argv, _ in commands(paths, folder)}[name]
    at = argv.index("-o") + 1
    code, _, err = one_process([*argv[:at], str(tmp_path / "one.tsv"), *argv[at + 1:]], capsys)
    first, second = ranks[name]
    assert code == first["code"] == second["code"] == 0 and second["stderr"] == ""
    number = r"[\d,.]+"
    alone, together = (re.sub(f"in {number} s, {number} GCUPS; scoring calls {number} s", "TIMES", text)
                       for text in (err, first["stderr"]))
    assert together == alone.rstrip("\n") + "; 2 ranks, the scoring calls rank 0's, on its share\n"
    assert "TIMES" in alone and alone.startswith("swcli: ")


@pytest.mark.parametrize("name, rank, message", [
    ("search_fails_on_rank_1", 1, "failure injected at query:2 (SWCLI_FAIL_AT)"),
    ("search_fails_on_rank_0", 0, "failure injected at query:0 (SWCLI_FAIL_AT)"),
    ("align_fails_at_setup", 1, "failure injected at setup (SWCLI_FAIL_AT)"),
    ("align_fails_midway", 1, "failure injected at chunk:1 (SWCLI_FAIL_AT)"),
    ("stdin", 0, "with several processes (torchrun) every rank reads the inputs: give files, not stdin ('-')"),
])
def test_a_failing_rank_stops_every_rank_and_rank_0_says_why(ranks, files, name, rank, message):
    folder, _ = files
    first, second = ranks[name]
    assert first["code"] == second["code"] == 1
    where = f"rank {rank}: " if rank else ""
    assert first["stderr"] == f"swcli: error: {where}{message}\n" and second["stderr"] == ""
    assert first["stdout"] == second["stdout"] == ""
    for kept in ("kept1.tsv", "kept3.tsv"):  # the existing outputs are as they were, and alone
        assert (folder / kept).read_text() == "old\n"
    assert not list(folder.glob(".*.part"))


def test_a_rank_failing_after_the_last_exchange_keeps_the_existing_output(ranks, files):
    # rank 1 fails once the hits are all written to rank 0's temporary file: the run stops before the rename
    folder, _ = files
    first, second = ranks["search_fails_on_rank_1_at_the_end"]
    assert first["code"] == second["code"] == 1
    assert first["stderr"] == "swcli: error: rank 1: failure injected at closing (SWCLI_FAIL_AT)\n"
    assert (folder / "kept6.tsv").read_text() == "old\n" and not list(folder.glob(".*.part"))


def test_a_bad_letter_seen_by_one_rank_is_its_error(ranks, files, capsys):
    folder, paths = files
    code, _, err = one_process(["align", paths["pq"], paths["bad"], "--backend", "cpu"], capsys)
    assert code == 1 and "bad.fa: record 5 (t4): invalid letter '1' at position 3" in err
    first, second = ranks["align_bad_letter_on_rank_1"]
    assert first["code"] == second["code"] == 1
    assert first["stderr"] == err.replace("swcli: error: ", "swcli: error: rank 1: ") and second["stderr"] == ""
    assert (folder / "kept2.tsv").read_text() == "old\n"


@pytest.mark.parametrize("name, kept, why", [
    ("search_final_write_fails", "kept4.tsv", "No space left on device"),
    ("align_final_write_fails", "kept5.tsv", "Permission denied"),
])
def test_a_final_write_that_fails_on_rank_0_fails_every_rank(ranks, files, name, kept, why):
    """Rank 0 puts the output in place once every rank is done: where that fails, every rank exits with
    its error, which rank 0 alone prints, and the existing file is kept."""
    folder, _ = files
    first, second = ranks[name]
    assert first["code"] == second["code"] == 1
    assert first["stderr"] == f"swcli: error: {folder / kept}: cannot write output ({why})\n"
    assert second["stderr"] == first["stdout"] == second["stdout"] == ""
    assert (folder / kept).read_text() == "old\n" and not list(folder.glob(".*.part"))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_a_full_disk_on_rank_0_is_one_error_on_every_rank(ranks):
    """/dev/full fails rank 0's first rows as a full disk does."""
    first, second = ranks["search_disk_full"]
    assert first["code"] == second["code"] == 1
    assert first["stderr"] == "swcli: error: /dev/full: cannot write output (No space left on device)\n"
    assert second["stderr"] == first["stdout"] == second["stdout"] == ""


def test_a_rank_that_dies_fails_the_run_and_keeps_the_output(files, tmp_path):
    """The real command line: rank 1 ends at once (as when killed); rank 0 stops, removes its temporary
    file, and torchrun exits non-zero."""
    _, paths = files
    out = tmp_path / "hits.tsv"
    out.write_text("old\n")
    run = torchrun(["-m", "swcli", "search", paths["q"], paths["db"], "--backend", "cpu", "-o", str(out)], tmp_path,
                   {"SWCLI_FAIL_AT": "1:query:1:exit"})
    assert run.returncode != 0
    assert out.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["hits.tsv"]


def test_rank_0_says_the_error_before_torchrun_stops_it(files, tmp_path):
    """The real command line: rank 1 fails and its process ends with the error's code, which makes torchrun
    stop the other ranks; rank 0, slow to say why (a pause of a second), still says it: rank 1's process
    ends after rank 0's."""
    _, paths = files
    out = tmp_path / "hits.tsv"
    run = torchrun(["-m", "swcli", "search", paths["q"], paths["db"], "--backend", "cpu", "-o", str(out)], tmp_path,
                   {"SWCLI_FAIL_AT": "1:query:1,0:say:slow"})
    assert run.returncode != 0 and not out.exists()
    assert "swcli: error: rank 1: failure injected at query:1 (SWCLI_FAIL_AT)" in run.stderr.splitlines()
    assert "swcli: interrupted" not in run.stderr


def test_the_exchange_benchmark_runs_on_two_ranks(tmp_path):
    """benchmarks/distributed_exchange.py calls the group's exchange as the search does: a change of its
    signature must not leave the benchmark behind."""
    run = torchrun([str(REPO / "benchmarks" / "distributed_exchange.py"), "--count", "5", "--warm-up", "2"], tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert re.search(r"^2 ranks, cpu, top 10: \d+ us per exchange", run.stdout, re.M), run.stdout


def test_distributed_off_runs_each_rank_alone(ranks, files, capsys):
    folder, paths = files
    argv = {n: argv for n, argv, _ in commands(paths, folder)}["search_alone"]
    code, out, err = one_process(argv, capsys)
    assert code == 0 and out.count("\n") > 3
    for outcome in ranks["search_alone"]:  # each rank the whole search, in silence on stderr
        assert (outcome["code"], outcome["stdout"].encode("latin-1"), outcome["stderr"]) == (0, out.encode(), err)


def test_a_subprocess_of_a_torchrun_worker_runs_as_one_process(files, capsys, tmp_path):
    """torchrun's variables, inherited by a command that a worker starts, are not this command's: it runs
    alone (and says why), the same rows as without torchrun; --distributed off runs alone in silence."""
    _, paths = files
    argv = ["search", paths["q"], paths["db"], "-k", "3", "-t", "1", "--backend", "cpu"]
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([argv, [*argv, "--distributed", "off"]]))
    run = torchrun([str(REPO / "tests" / "torchrun_subprocess.py"), str(cases), str(tmp_path / "result.json")],
                   tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    inherited, off = json.loads((tmp_path / "result.json").read_text())
    code, out, err = one_process(argv, capsys)
    assert code == 0 and out.count("\n") > 3
    assert inherited["code"] == 0 and inherited["stdout"] == out
    assert inherited["stderr"] == (f"swcli: running as one process: RANK, WORLD_SIZE and LOCAL_RANK are those of "
                                   f"the parent process (pid {inherited['parent']}), not set for this one "
                                   "(--distributed on joins their process group)\n")
    assert (off["code"], off["stdout"], off["stderr"]) == (0, out, "")


# --------------------------------------------------------------------------------------------------
# Two ranks started by hand: the variables set, and no torchrun agent that stops the others when one
# ends (as for the ranks of the other hosts of a cluster), so that what each rank says and its exit code
# are its own.


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def by_hand(argv, cwd, env=None, hung=(), size=2):
    """`python -m swcli ARGV` as `size` ranks: [(exit code, stdout, stderr)] by rank. The ranks in `hung`
    are killed once rank 0 has ended (code None). A run that does not end within 90 s (the waits' own
    limit is set to 120 s) is killed, and fails the test."""
    base = {**os.environ, **(env or {}), "WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()), "SWCLI_DISTRIBUTED_TIMEOUT": "120",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    processes = [subprocess.Popen([sys.executable, "-m", "swcli", *argv], cwd=cwd, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)})
                 for r in range(size)]
    outcomes = []
    try:
        for rank, process in enumerate(processes):
            if rank in hung:
                process.kill()
            out, err = process.communicate(timeout=90)
            outcomes.append((None if rank in hung else process.returncode, out, err))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return outcomes


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_signal_ends_a_rank_waiting_for_the_others_to_join(files, tmp_path, signal_name):
    """Rank 0 alone, its peer never started: the rendezvous waits in C++, where no Python handler runs;
    Ctrl-C or SIGTERM there still ends the run at once, exit 130, one line, no output file."""
    import signal
    import time

    _, paths = files
    port = free_port()
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "SWCLI_DISTRIBUTED_TIMEOUT": "120",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-m", "swcli", *search_argv(paths, "-o", "hits.tsv")], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # rank 0 holds the store: its port opens once it waits in the join
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert process.poll() is None, process.communicate()
            time.sleep(0.2)
        else:
            pytest.fail("rank 0 never opened its store")
        time.sleep(1.0)
        process.send_signal(getattr(signal, signal_name))
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert (process.returncode, out, err) == (130, "", "swcli: interrupted\n")
    assert os.listdir(tmp_path) == []


def search_argv(paths, *extra):
    return ["search", paths["q"], paths["db"], "-t", "1", "--backend", "cpu", *extra]


def align_argv(paths, *extra):
    return ["align", paths["pq"], paths["pt"], "--chunk-size", "3", "--backend", "cpu", *extra]


CRASH = "InjectedCrash: crash injected at {} (SWCLI_FAIL_AT)"
ERROR = "failure injected at {} (SWCLI_FAIL_AT)"


@pytest.mark.parametrize("command, spec", [
    ("search", "1:read:crash"),
    ("search", "1:query:1:crash"),
    ("search", "1:merge:1"),  # the exchange itself fails: even an expected error leaves it
    ("search", "1:merge:2:crash"),
    ("search", "0:write:3:crash"),  # rank 0 writing a query's rows
    ("search", "0:write:crash"),  # rank 0 putting the output in place
    ("align", "1:chunk:1:crash"),
    ("align", "1:merge:2"),
    ("align", "0:write:crash"),
])
def test_an_error_that_leaves_the_exchanges_is_reported_to_every_rank(files, tmp_path, command, spec):
    """An exception that a rank's stage does not catch (as where a CUDA context broke: the rank cannot take
    part in its next exchange) at each stage: reading, scoring, the exchange, rank 0's writing and its
    final write. The rank sends its report through the run's store before it ends, and the others stop
    with it: rank 0 says it once, every rank exits 1, the existing output is kept. An error the command
    line does not expect also shows its traceback, on its own rank."""
    _, paths = files
    out = tmp_path / "out.tsv"
    out.write_text("old\n")
    argv = (search_argv if command == "search" else align_argv)(paths, "-o", str(out))
    (first, out0, err0), (second, out1, err1) = by_hand(argv, tmp_path, {"SWCLI_FAIL_AT": spec})
    assert first == second == 1 and out0 == out1 == ""
    crash, where = spec.endswith(":crash"), spec[2:].removesuffix(":crash")
    message = (CRASH if crash else ERROR).format(where)
    if spec.startswith("0:"):
        assert err0.startswith("Traceback") and err0.endswith(message + "\n") and err1 == ""
    else:
        assert err0 == f"swcli: error: rank 1: {message}\n"
        assert err1.startswith("Traceback") and err1.endswith(message + "\n") if crash else err1 == ""
    assert out.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.tsv"]


def test_an_error_that_leaves_the_exchanges_under_torchrun(files, tmp_path):
    """The same through torchrun, whose agent stops the other ranks once one ends: the failing rank ends
    only once the others have, so that rank 0 has said its error (not "interrupted")."""
    _, paths = files
    out = tmp_path / "out.tsv"
    out.write_text("old\n")
    run = torchrun(["-m", "swcli", *search_argv(paths, "-o", str(out))], tmp_path, {"SWCLI_FAIL_AT": "1:merge:1:crash"})
    assert run.returncode != 0 and "interrupted" not in run.stderr
    said = [line for line in run.stderr.splitlines() if line.startswith("swcli:")]
    assert said == ["swcli: error: rank 1: " + CRASH.format("merge:1")]
    assert out.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.tsv"]


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
@pytest.mark.parametrize("argv, spec", [(search_argv, "1:query:1:device"), (align_argv, "1:chunk:1:device")])
def test_a_broken_cuda_context_on_one_rank_stops_every_rank(files, tmp_path, argv, spec):
    """A device-side assert on rank 1's GPU: its CUDA context is broken, so in search it cannot take part
    in the next NCCL exchange (it reports through the store); align's exchanges are on the host. Either
    way rank 0 says it in one line, every rank exits 1, and the existing output is kept."""
    _, paths = files
    load_engine("cuda")  # built before the ranks start
    out = tmp_path / "out.tsv"
    out.write_text("old\n")
    arguments = [a if a != "cpu" else "cuda" for a in argv(paths, "-o", str(out))]
    (first, _, err0), (second, _, err1) = by_hand(arguments, tmp_path, {"SWCLI_FAIL_AT": spec})
    assert first == second == 1 and "device-side assert triggered" in err1
    said = [line for line in err0.splitlines() if line.startswith("swcli:")]  # among what torch may warn of
    assert said == ["swcli: error: rank 1: RuntimeError: CUDA error: device-side assert triggered"]
    assert out.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.tsv"]


def test_a_rank_that_dies_is_named_by_rank_0(files, tmp_path):
    """Its connection closes: the others watch for a few heartbeats which rank stopped beating."""
    _, paths = files
    (first, _, err0), (second, _, err1) = by_hand(search_argv(paths), tmp_path, {"SWCLI_FAIL_AT": "1:query:1:exit"})
    assert (first, second) == (1, 3) and err1 == ""
    assert err0 == ("swcli: error: rank 1 stopped answering (its connection closed, and its process shows no sign of "
                    "life: it may have died or been killed)\n")


def test_a_rank_0_that_dies_is_named_by_rank_1(files, tmp_path):
    """Started by hand, rank 0's process holds the run's store: the others lose it too, and rank 1 says so
    (among torch's own warnings of the closed connection)."""
    _, paths = files
    out = tmp_path / "out.tsv"
    out.write_text("old\n")
    (first, _, err0), (second, _, err1) = by_hand(search_argv(paths, "-o", str(out)), tmp_path,
                                                  {"SWCLI_FAIL_AT": "0:query:1:exit"})
    assert (first, second) == (3, 1) and err0 == "" and out.read_text() == "old\n"
    said = [line for line in err1.splitlines() if line.startswith("swcli:")]
    assert said == ["swcli: error: rank 0 stopped answering (the run's store, which its process holds, does not answer: "
                    "it may have died or been killed)"]


@pytest.mark.parametrize("argv, spec", [
    (search_argv, "1:query:1:hang"),  # at the exchange of a query's hits
    (search_argv, "0:query:1,1:report:hang"),  # at the exchange of the failure reports
    (lambda paths: align_argv(paths, "--format-output", "query,target,evalue", *STATISTICS), "1:broadcast:hang"),
])
def test_a_rank_that_hangs_is_named_within_seconds(files, tmp_path, argv, spec):
    """A rank whose process stops (its heartbeat with it) while the others wait for it in an exchange,
    polled or the exchange of objects: they stop once it has been silent for SWCLI_DISTRIBUTED_SILENCE
    (here 3 s) and rank 0 names it."""
    _, paths = files
    (first, _, err0), (second, _, _) = by_hand(argv(paths), tmp_path,
                                               {"SWCLI_FAIL_AT": spec, "SWCLI_DISTRIBUTED_SILENCE": "3"}, hung={1})
    assert first == 1 and second is None
    assert err0 == ("swcli: error: rank 1 stopped answering (no sign of life from its process for 3 s, "
                    "SWCLI_DISTRIBUTED_SILENCE: it may have died or hung)\n")
