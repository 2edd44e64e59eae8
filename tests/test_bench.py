"""bench.py and `swcli bench`: the records it prints are complete and sane (speed lives in the records)."""

import json

from swcli.cli import main


def test_bench_json_smoke(capsys):
    code = main(["bench", "--backend", "cpu", "--pairs", "30", "--repeats", "1", "--json"])
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and "cores" in record["machine"]
    workloads = [(r["workload"], r["backend"], r["temperature"]) for r in record["rows"]]
    assert ("seed B=16 32x32", "cpu", 1.0) in workloads and ("seed B=16 32x32", "reference", 1.0) in workloads
    assert ("end-to-end (30 pairs)", "cpu", 0.0) in workloads
    for row in record["rows"]:
        assert row["seconds"] > 0 and row["cells"] > 0 and row["gcups"] > 0
    seed = {r["backend"]: r["seconds"] for r in record["rows"] if r["workload"].startswith("seed")}
    assert seed["cpu"] < seed["reference"]
    # the affine rows beside the linear ones: the same batch and S, the ratios in the notes
    for t in (1.0, 0.0):
        (real,) = [r for r in record["rows"] if (r["workload"], r["temperature"]) == ("affine real pairs (2048)", t)]
        assert "-12/-1" in real["note"] and "x the linear row's GCUPS" in real["note"]
    dense = [r for r in record["rows"] if r["workload"] == "affine random B=256 256x256"]
    assert [r["temperature"] for r in dense] == [1.0, 1.0]
    assert "x the linear forward's GCUPS" in dense[0]["note"]
    assert "forward + backward" in dense[1]["note"] and "x the affine forward alone" in dense[1]["note"]
    # search's loop: t = 0 and 1 with gap -4, and affine at t = 0, over the records repeated
    search = [r for r in record["rows"] if r["workload"].startswith("search (")]
    assert [(r["temperature"], "affine" in r["note"]) for r in search] == [(0.0, False), (1.0, False), (0.0, True)]
    assert all(r["pairs"] == 4 * int(r["workload"][8:].split()[0].replace(",", "")) for r in search)
    assert all("the op's sweep from codes" in r["note"] for r in search)  # the 16-bit kernel is CUDA's


def test_affine_rows_are_skipped_with_a_row_saying_so_when_the_engine_has_no_kernels(capsys, monkeypatch):
    """As on CUDA until its affine kernels are registered: a note row, no error, the linear rows kept."""
    from swcli import bench
    from swcli.fasta import read_fasta

    monkeypatch.setattr(bench, "missing_affine_kernels", lambda backend: ["affine_scores_codes"])
    records = list(read_fasta(str(bench.packaged_file("data", "example.fasta"))))
    rows = bench.real_rows("cpu", records, lambda run: bench.median_seconds(run, 1), 16)
    assert [r.workload for r in rows] == ["real pairs (16)", "real pairs (16)", "affine rows"]
    assert rows[-1].skipped and rows[-1].gcups == 0.0 and rows[-1].record()["gcups"] == 0.0
    assert rows[-1].note == "skipped: the cpu engine has no kernels for swcli::affine_scores_codes"
    assert not any(r.skipped for r in rows[:-1])
