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
    # search's loop: t = 0 and 1, gap -4 and affine, over the records repeated
    search = [r for r in record["rows"] if r["workload"].startswith("search (")]
    assert [(r["temperature"], "affine" in r["note"]) for r in search] == [(0.0, False), (1.0, False), (0.0, True),
                                                                         (1.0, True)]
    assert all(r["pairs"] == 4 * int(r["workload"][8:].split()[0].replace(",", "")) for r in search)
    assert all("the op's sweep from codes" in r["note"] for r in search)  # the search kernels are CUDA's
