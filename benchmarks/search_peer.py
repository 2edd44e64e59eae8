"""swcli search beside CUDASW++4.0 on one GPU, in one run: the same queries and database, BLOSUM62, linear
gap -4 (CUDASW4's --gop -4 --gex -4) or affine gaps (--gap-open -11 --gap-extend -1: CUDASW4's --gop -11
--gex -1, Biopython's open_gap_score, extend_gap_score), top 10.

1. `swcli makedb` prepares the database: timed, the folder's size stated.
2. In this process, the CUDA engine is loaded first (start-up is not timed) and a two-query search warms
   up; then, at t = 0 and t = 1, run_search against the prepared folder and against the FASTA. Kernel
   GCUPS: cells over the CUDA-event time of the scoring calls; end to end: cells over run_search's whole
   time (queries read, database opened, searched, TSV written); their ratio; the peak GPU memory (also of
   the warm-up's two queries: memory does not grow with the queries); the database's footprint.
3. The peer: `bash PEER QUERIES DB OPEN EXTEND WORK` (it builds CUDASW4 on first use, then runs its makedb and
   align --verbose --tsv). Its GCUPS come from its log, its top-10 scores per query from its TSV, compared
   with swcli's at t = 0 as multisets (the two break ties between equal scores differently).
4. A markdown table, printed last, and the JSON record OUTDIR/search_peer.json. A failing peer leaves
   swcli's figures and the peer's log tail in both.

    python3 benchmarks/search_peer.py QUERIES.fasta DB.fasta OUTDIR [--work DIR] [--peer SCRIPT]
                                      [--gap-open O --gap-extend E]
    python3 benchmarks/search_peer.py --check      # the parsers on inline samples, no GPU

The TSVs and logs go to --work (default /tmp/search_peer), so that OUTDIR holds the record alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

TOP, GAP = 10, -4.0

# CUDASW4's output, as its src/main.cu and src/cudasw4.cuh write it with --verbose --tsv:
#   "Processing query N ... Done. Scan time: S s, G GCUPS" per query (N from 0, in file order), then
#   "Total time: S s, G GCUPS" (a GPU timer from before the first scan to after the last one's output:
#   the database's load is outside it); printDBInfo's "D sequences, R characters"; printOptions'
#   "gop: G" and "gex: G". GCUPS there are query length x the database's residues over the seconds.
SCAN = re.compile(r"Processing query (\d+) \.\.\. Done\. Scan time: (\S+) s, (\S+) GCUPS")
TOTAL = re.compile(r"^Total time: (\S+) s, (\S+) GCUPS", re.M)
DB_INFO = re.compile(r"^(\d+) sequences, (\d+) characters", re.M)
GAPS = re.compile(r"^(gop|gex): (\S+)", re.M)
# Its TSV: a header line, then per hit "Query number, Query length, Query header (the whole header
# line), Result number (rank from 0), Result score (an int), Reference length, Reference header,
# Reference ID in DB".
PEER_COLUMNS = 8


def parse_peer_log(text: str) -> dict:
    scans = {int(q): (float(s), float(g)) for q, s, g in SCAN.findall(text)}
    total, info = TOTAL.search(text), DB_INFO.search(text)
    return {
        "total_seconds": float(total.group(1)) if total else None,
        "total_gcups": float(total.group(2)) if total else None,
        "scans": len(scans),
        "scan_seconds": sum(s for s, _ in scans.values()) if scans else None,
        # its cells over its summed scan times (each scan's cells are its GCUPS times its seconds)
        "scan_gcups": (sum(s * g for s, g in scans.values()) / sum(s for s, _ in scans.values())
                       if scans and sum(s for s, _ in scans.values()) > 0 else None),
        "sequences": int(info.group(1)) if info else None,
        "residues": int(info.group(2)) if info else None,
        "gaps": {name: float(value) for name, value in GAPS.findall(text)},
    }


def parse_peer_tsv(text: str) -> tuple[dict[int, dict], int]:
    """Per query number: its length, its header's first word and its scores in rank order; and the
    count of lines that are not 8 columns (a tab inside a header)."""
    queries, bad = {}, 0
    for line in text.splitlines()[1:]:
        cols = line.split("\t")
        if len(cols) != PEER_COLUMNS:
            bad += 1
            continue
        entry = queries.setdefault(int(cols[0]), {"qlen": int(cols[1]), "id": (cols[2].split() or [""])[0],
                                                  "ranked": []})
        entry["ranked"].append((int(cols[3]), int(round(float(cols[4])))))
    for entry in queries.values():
        entry["scores"] = [score for _, score in sorted(entry.pop("ranked"))]
    return queries, bad


def parse_swcli_tsv(text: str, per_query: int) -> list[dict]:
    """swcli's rows (header, then query target qlen tlen score), per_query rows per query in order."""
    rows = [line.split("\t") for line in text.splitlines()[1:]]
    return [{"id": chunk[0][0], "qlen": int(chunk[0][2]), "scores": [float(r[4]) for r in chunk]}
            for chunk in (rows[k:k + per_query] for k in range(0, len(rows), per_query))]


def compare_top(ours: list[dict], peer: dict[int, dict]) -> list[dict]:
    """Queries whose top scores differ as multisets (or whose id or length differ), with both lists."""
    mismatches = []
    for number, mine in enumerate(ours):
        theirs = peer.get(number)
        mine_scores = sorted((int(round(s)) for s in mine["scores"]), reverse=True)
        if (theirs is None or sorted(theirs["scores"], reverse=True) != mine_scores
                or theirs["id"] != mine["id"] or theirs["qlen"] != mine["qlen"]):
            mismatches.append({"query": number, "id": mine["id"], "qlen": mine["qlen"], "swcli": mine_scores,
                               "cudasw4": None if theirs is None else theirs["scores"],
                               "cudasw4_id": None if theirs is None else theirs["id"],
                               "cudasw4_qlen": None if theirs is None else theirs["qlen"]})
    return mismatches


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def tail(path: Path | str, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({path}: {exc.strerror})"


def makedb(fasta: str, folder: Path) -> dict:
    shutil.rmtree(folder, ignore_errors=True)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "swcli", "makedb", fasta, str(folder)], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"swcli makedb failed ({done.returncode}): {done.stderr[-2000:]}")
    return {"seconds": seconds, "folder_bytes": folder_bytes(folder), "message": done.stderr.strip()}


def swcli_runs(queries: str, fasta: str, folder: Path, work: Path, backend: str,
               gaps: tuple[float, float]) -> tuple[list[dict], dict]:
    """The in-process searches: a warm-up, then each temperature against the folder and the FASTA."""
    import torch

    from swcli import _host
    from swcli.ops import load_engine
    from swcli.pipeline import Settings
    from swcli.scoring import load_matrix
    from swcli.search import run_search

    cuda = backend == "cuda"
    started = time.perf_counter()
    load_engine(backend)
    _host.load()
    startup = time.perf_counter() - started
    matrix = load_matrix("BLOSUM62")

    def one(source: str, t: float, tsv: Path, query_file: str = queries) -> dict:
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        settings = (Settings(matrix, gaps[0], t, backend) if gaps[0] == gaps[1] else
                    Settings(matrix, None, t, backend, gap_open=gaps[0], gap_extend=gaps[1]))
        stats = run_search(query_file, source, settings, str(tsv), top=TOP)
        return {"t": t, "database": "folder" if source == str(folder) else "fasta", "tsv": str(tsv),
                "queries": stats.queries, "cells": stats.cells, "kernel_seconds": stats.kernel_seconds,
                "seconds": stats.seconds, "kernel_gcups": stats.kernel_gcups, "gcups": stats.gcups,
                "ratio": stats.kernel_seconds / stats.seconds, "sequences": stats.sequences,
                "residues": stats.residues, "host_bytes": stats.host_bytes, "device_bytes": stats.device_bytes,
                "resident": stats.resident, "kernel": stats.kernel, "rescored": stats.rescored,
                "peak_gpu_bytes": torch.cuda.max_memory_allocated() if cuda else None}

    # the warm-up: the first two queries at both temperatures (first calls, pinned buffers, page cache)
    from swcli.fasta import read_fasta

    warm_queries = work / "warm.fasta"
    warm_queries.write_text("".join(f">{r.id}\n{r.sequence}\n" for r, _ in zip(read_fasta(queries), range(2))))
    warm = [one(str(folder), t, work / f"warm_t{t:g}.tsv", str(warm_queries)) for t in (0.0, 1.0)]
    runs = []
    for t in (0.0, 1.0):
        for source, name in ((str(folder), "folder"), (fasta, "fasta")):
            runs.append(one(source, t, work / f"swcli_t{t:g}_{name}.tsv"))
            r = runs[-1]
            print(f"swcli t={t:g} {name}: {r['kernel_gcups']:.1f} GCUPS kernel, {r['gcups']:.1f} end to end "
                  f"({r['ratio']:.1%}), {r['seconds']:.2f} s; {r['kernel']}, {r['rescored']:,} pairs scored again",
                  flush=True)
    machine = {"torch": torch.__version__, "backend": backend, "startup_seconds": startup,
               "gpu": torch.cuda.get_device_name() if cuda else None,
               "warmup": [{k: w[k] for k in ("t", "queries", "seconds", "kernel_gcups", "peak_gpu_bytes")}
                          for w in warm],
               "host_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    return runs, machine


def run_peer(peer: str, queries: str, fasta: str, work: Path, timeout: float, gaps: tuple[float, float]) -> dict:
    built_before = os.path.exists("/tmp/cudasw4-build/align")
    started = time.perf_counter()
    # its own process group, so that a timeout ends the build's compilers too, not the script alone
    child = subprocess.Popen(["bash", peer, queries, fasta, f"{gaps[0]:g}", f"{gaps[1]:g}", str(work)],
                             stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, process_group=0)
    try:
        output, _ = child.communicate(timeout=timeout)
        code = child.returncode
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, 9)
        output, _ = child.communicate()
        code = "timeout"
    output = output.decode(errors="replace")
    record = {"command": f"bash {peer} {queries} {fasta} {gaps[0]:g} {gaps[1]:g} {work}", "exit": code,
              "wall_seconds": time.perf_counter() - started, "built_before": built_before}
    log, tsv = work / "cudasw4.log", work / "cudasw4.tsv"
    record.update(parse_peer_log(log.read_text(errors="replace")) if log.exists() else {})
    if code != 0 or record.get("total_gcups") is None:
        record["error"] = True
        record["output_tail"] = output[-3000:]
        record["log_tail"] = tail(log)
        record["build_log_tail"] = tail("/tmp/cudasw4_build.log", 20)
    if tsv.exists():
        record["tsv"] = str(tsv)
    return record


def table(record: dict) -> str:
    lines = ["| tool | t | database | kernel s | kernel GCUPS | end-to-end s | end-to-end GCUPS | e2e / kernel | "
             "peak GPU MiB |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in record.get("swcli", []):
        peak = f"{r['peak_gpu_bytes'] / 2**20:,.0f}" if r["peak_gpu_bytes"] is not None else "-"
        lines.append(f"| swcli | {r['t']:g} | {r['database']} | {r['kernel_seconds']:.3f} | {r['kernel_gcups']:,.1f} | "
                     f"{r['seconds']:.3f} | {r['gcups']:,.1f} | {r['ratio']:.1%} | {peak} |")
    p = record.get("cudasw4") or {}
    if p.get("total_gcups") is not None:
        scan = f"{p['scan_seconds']:.3f} | {p['scan_gcups']:,.1f}" if p.get("scan_gcups") else "- | -"
        lines.append(f"| CUDASW++4.0 | 0 | its makedb | {scan} | {p['total_seconds']:.3f} | "
                     f"{p['total_gcups']:,.1f} | - | - |")
    else:
        lines.append("| CUDASW++4.0 | 0 | - | failed: see the record's log tail | | | | | |")
    gap_open, gap_extend = record.get('gap_open', GAP), record.get('gap_extend', GAP)
    kind = "equal: a linear gap" if gap_open == gap_extend else "affine"
    notes = [f"BLOSUM62, gap open {gap_open:g}, extend {gap_extend:g} (scores; {kind}), top {TOP}"]
    if "makedb" in record:
        m = record["makedb"]
        notes.append(f"swcli makedb (the whole command): {m['seconds']:.2f} s, folder {m['folder_bytes'] / 2**20:,.1f} MiB")
    if record.get("swcli"):
        r = record["swcli"][0]
        notes.append(f"database: {r['sequences']:,} sequences, {r['residues']:,} residues; host "
                     f"{r['host_bytes'] / 2**20:,.1f} MiB, resident padded blocks on the GPU "
                     f"{r['device_bytes'] / 2**20:,.1f} MiB")
        notes.append("fasta rows: the database is read and encoded inside the timed run; folder rows: "
                     "memory-mapped from the makedb folder")
        warm = (record.get("machine") or {}).get("warmup") or []
        if warm and warm[0]["peak_gpu_bytes"] is not None and r["peak_gpu_bytes"] is not None:
            notes.append(f"peak GPU memory at t=0, folder: {warm[0]['peak_gpu_bytes'] / 2**20:,.0f} MiB for "
                         f"{warm[0]['queries']} queries, {r['peak_gpu_bytes'] / 2**20:,.0f} MiB for {r['queries']}")
    for t in sorted({r["t"] for r in record.get("swcli", [])}):
        r = next(r for r in record["swcli"] if r["t"] == t)
        if r.get("kernel"):
            notes.append(f"swcli at t={t:g}: {r['kernel']}; pairs it flagged and the general op scored again: "
                         f"{r['rescored']:,} of {r['queries'] * r['sequences']:,}")
    if record.get("folder_equals_fasta"):
        notes.append("TSV from the folder identical to the TSV from the FASTA: " +
                     ", ".join(f"{t} {'yes' if same else 'NO'}" for t, same in record["folder_equals_fasta"].items()))
    if p.get("residues") is not None and record.get("swcli"):
        notes.append(f"CUDASW++4.0's database: {p['sequences']:,} sequences, {p['residues']:,} residues; "
                     f"gaps {p.get('gaps')}")
    if "top_scores" in record:
        c = record["top_scores"]
        notes.append(f"top-{TOP} scores, swcli t=0 vs CUDASW++4.0: {c['identical']}/{c['queries']} queries identical")
    if p.get("total_gcups") is not None:
        notes.append("CUDASW++4.0: kernel columns are the sum of its per-query scan times; end to end its "
                     "'Total time' (the database's load excluded)")
    return "\n".join(lines + [""] + [f"- {n}" for n in notes])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("queries", nargs="?")
    parser.add_argument("database", nargs="?", help="the database as FASTA")
    parser.add_argument("outdir", nargs="?")
    parser.add_argument("--work", default="/tmp/search_peer", help="TSVs, logs and the prepared folder")
    parser.add_argument("--peer", default=".peer/peer-cudasw4")
    parser.add_argument("--peer-timeout", type=float, default=420.0)
    parser.add_argument("--backend", default="cuda", help="cuda; cpu only to try the script on a small database")
    parser.add_argument("--gap-open", type=float, default=GAP, help="the score of a gap's first position")
    parser.add_argument("--gap-extend", type=float, default=GAP, help="the score of each further gap position")
    parser.add_argument("--check", action="store_true", help="test the parsers on inline samples and exit")
    args = parser.parse_args(argv)
    gaps = (args.gap_open, args.gap_extend)
    if args.check:
        return self_check()
    if not (args.queries and args.database and args.outdir):
        parser.error("QUERIES, DB and OUTDIR are needed")
    outdir, work = Path(args.outdir), Path(args.work)
    outdir.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    record: dict = {"queries": args.queries, "database": args.database, "top": TOP, "gap_open": gaps[0],
                    "gap_extend": gaps[1], "matrix": "BLOSUM62"}
    folder = work / "db.swcli"
    try:
        from swcli import _host

        _host.load()  # built before makedb is timed, if it has to be
        record["makedb"] = makedb(args.database, folder)
        print(f"makedb: {record['makedb']['seconds']:.2f} s, {record['makedb']['folder_bytes']:,} bytes", flush=True)
        record["swcli"], record["machine"] = swcli_runs(args.queries, args.database, folder, work, args.backend,
                                                        gaps)
        record["cells"] = record["swcli"][0]["cells"]
        tsvs = {(r["t"], r["database"]): Path(r["tsv"]).read_text() for r in record["swcli"]}
        record["folder_equals_fasta"] = {f"t={t:g}": tsvs[(t, "folder")] == tsvs[(t, "fasta")] for t in (0.0, 1.0)}
    except Exception as exc:  # still run the peer and write what there is
        record["swcli_error"] = f"{type(exc).__name__}: {exc}"
        print(f"swcli failed: {record['swcli_error']}", flush=True)
    print(f"peer: {args.peer} ...", flush=True)
    record["cudasw4"] = run_peer(args.peer, args.queries, args.database, work, args.peer_timeout, gaps)
    p = record["cudasw4"]
    if p.get("error"):
        print(f"CUDASW++4.0 failed (exit {p['exit']}); its log's tail:\n{p['log_tail']}\n{p['output_tail']}", flush=True)
    if "tsv" in p and record.get("swcli"):
        peer_top, bad = parse_peer_tsv(Path(p["tsv"]).read_text(errors="replace"))
        ours = parse_swcli_tsv(Path(record["swcli"][0]["tsv"]).read_text(),
                               min(TOP, record["swcli"][0]["sequences"]))
        mismatches = compare_top(ours, peer_top)
        record["top_scores"] = {"queries": len(ours), "identical": len(ours) - len(mismatches),
                                "peer_queries": len(peer_top), "peer_unparsed_lines": bad, "mismatches": mismatches}
        for m in mismatches:
            print(f"query {m['query']} ({m['id']}, {m['qlen']}): swcli {m['swcli']} / CUDASW++4.0 {m['cudasw4']}"
                  f" ({m['cudasw4_id']}, {m['cudasw4_qlen']})", flush=True)
    (outdir / "search_peer.json").write_text(json.dumps(record, indent=1) + "\n")
    print()
    print(table(record))
    return 0 if "swcli_error" not in record else 1


def self_check() -> int:
    """The parsers on output written as CUDASW4's main.cu and swcli's TsvWriter write it."""
    log = ("Selected options:\nverbose: 1\ngop: -4\ngex: -4\nWill use GPU 0\nReading Database: \n"
           "TIMING: 12.5 ms (Read DB)\n3 sequences, 1234 characters\nMin length 100, max length 700, avg length 411\n"
           "Processing query file q.fa\nProcessing query 0 ... Done. Scan time: 0.00125 s, 98.72 GCUPS\n"
           "Processing query 1 ... Done. Scan time: 2.5e-04 s, 493.6 GCUPS\nTotal time: 0.0021 s, 646.1 GCUPS\n")
    parsed = parse_peer_log(log)
    scan_gcups = (0.00125 * 98.72 + 2.5e-4 * 493.6) / 0.0015
    assert abs(parsed.pop("scan_gcups") - scan_gcups) < 1e-9 and abs(parsed.pop("scan_seconds") - 0.0015) < 1e-12
    assert parsed == {"total_seconds": 0.0021, "total_gcups": 646.1, "scans": 2, "sequences": 3, "residues": 1234,
                      "gaps": {"gop": -4.0, "gex": -4.0}}, parsed
    tsv = ("Query number\tQuery length\tQuery header\tResult number\tResult score\tReference length\t"
           "Reference header\tReference ID in DB\n"
           "0\t100\tsp|P1|A desc\t0\t55\t120\tdb1_x\t2\n0\t100\tsp|P1|A desc\t1\t40\t90\tdb0_y\t0\n"
           "1\t100\tq2\t1\t7\t80\tdb2_z\t1\n1\t100\tq2\t0\t9\t80\tdb0_y\t0\n1\tbad line\n")
    peer, bad = parse_peer_tsv(tsv)
    assert bad == 1 and peer == {0: {"qlen": 100, "id": "sp|P1|A", "scores": [55, 40]},
                                 1: {"qlen": 100, "id": "q2", "scores": [9, 7]}}, peer
    ours = parse_swcli_tsv("query\ttarget\tqlen\ttlen\tscore\nsp|P1|A\tdb1_x\t100\t120\t55\n"
                           "sp|P1|A\tdb0_y\t100\t90\t40\nq2\tdb0_y\t100\t80\t9\nq2\tdb2_z\t100\t80\t8\n", 2)
    assert [o["scores"] for o in ours] == [[55.0, 40.0], [9.0, 8.0]]
    mismatches = compare_top(ours, peer)
    assert [m["query"] for m in mismatches] == [1] and mismatches[0]["cudasw4"] == [9, 7], mismatches
    record = {"swcli": [], "cudasw4": {"total_gcups": None}}
    assert "failed" in table(record)
    print("search_peer.py: parsers ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
