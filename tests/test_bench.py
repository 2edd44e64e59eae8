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


def test_bench_table_and_reference_refused(capsys):
    assert main(["bench", "--backend", "reference"]) == 1
    assert "choose --backend cpu" in capsys.readouterr().err
