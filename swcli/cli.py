"""The swcli command line: align, verify, bench.

Startup stays fast (`swcli --help` imports neither torch nor the kernels): torch and the pipeline are
imported inside the commands. Exit codes: 0 ok, 1 bad data or a runtime error, 2 a command line that
does not parse (unknown option, out-of-range value), 130 interrupted. Errors are one line on stderr.
"""

from __future__ import annotations

import os
import signal
import sys
from enum import Enum
from typing import Annotated, Optional

import typer

from swcli.errors import SwcliError

app = typer.Typer(
    name="swcli",
    help="Soft Smith-Waterman local alignment of protein (or any) sequence pairs, scored on CPU or GPU.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class Backend(str, Enum):
    auto = "auto"
    cuda = "cuda"
    cpu = "cpu"
    reference = "reference"


# Options shared by align and verify.
QueriesArg = Annotated[str, typer.Argument(
    metavar="QUERIES", help="FASTA of queries, plain or gzip (detected from the bytes), or - for stdin.", show_default=False)]
TargetsArg = Annotated[Optional[str], typer.Argument(
    metavar="TARGETS", help="FASTA of targets: record i pairs with query record i. Without it, consecutive records of "
         "QUERIES pair up (1 with 2, 3 with 4, ...).", show_default=False)]
AllVsAllOpt = Annotated[bool, typer.Option(
    "--all-vs-all", help="Score every query against every target (targets are held in memory; with one "
                         "file, every record against every record).")]
MatrixOpt = Annotated[str, typer.Option(
    "--matrix", "-m", help="Substitution matrix: a name Biopython knows (BLOSUM45/50/62/80/90, PAM30, "
                           "PAM250, ...; case-insensitive) or a matrix file.")]
GapOpt = Annotated[float, typer.Option(
    "--gap", max=0.0, help="Linear gap SCORE added per gap position (so negative; e.g. --gap -4). "
                           "Equals Biopython's open_gap_score = extend_gap_score = GAP.")]
TemperatureOpt = Annotated[float, typer.Option(
    "--temperature", "-t", min=0.0, help="Softness of the max; 0 is exact (hard) Smith-Waterman.")]
BackendOpt = Annotated[Backend, typer.Option(
    "--backend", help="auto: the GPU when torch sees one, else the CPU. "
                      "reference: the Python loop (slow; for validation).")]
UnknownOpt = Annotated[Optional[str], typer.Option(
    "--unknown-as", help="Score letters the matrix lacks as this letter (e.g. X) instead of failing.",
    show_default=False)]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]


def _resolve_backend(backend: Backend) -> str:
    """The CLI's auto: CUDA when torch sees a GPU, else the CPU engine."""
    import torch

    if backend is Backend.auto:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if backend is Backend.cuda and not torch.cuda.is_available():
        raise SwcliError("--backend cuda: no CUDA device is available (torch.cuda.is_available() is False)")
    return backend.value


def _pairs(queries: str, targets: Optional[str], all_vs_all: bool):
    from swcli import fasta

    if all_vs_all:
        return fasta.all_against_all(queries, targets or queries)
    if targets is None:
        return fasta.pairs_in_one_file(queries)
    if queries == targets == fasta.STDIN:
        raise SwcliError("stdin ('-') can be read only once: give at most one of QUERIES and TARGETS as -")
    return fasta.pairs_in_two_files(queries, targets)


def _settings(matrix: str, unknown_as: Optional[str], gap: float, temperature: float, backend: Backend,
              **extra):
    from swcli.ops import prepare_backend
    from swcli.pipeline import Settings
    from swcli.scoring import load_matrix

    substitution = load_matrix(matrix)
    if unknown_as is not None:
        substitution = substitution.with_unknown_as(unknown_as)
    resolved = _resolve_backend(backend)
    prepare_backend(resolved)
    return Settings(substitution, gap, temperature, resolved, **extra)


def _progress_bar(quiet: bool, unit: str, total=None):
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, file=sys.stderr, disable=quiet or not sys.stderr.isatty(),
                dynamic_ncols=True)


@app.command()
def align(
    queries: QueriesArg,
    targets: TargetsArg = None,
    all_vs_all: AllVsAllOpt = False,
    matrix: MatrixOpt = "BLOSUM62",
    gap: GapOpt = -4.0,
    temperature: TemperatureOpt = 1.0,
    backend: BackendOpt = Backend.auto,
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", help="Write the TSV here (atomically: no partial file on failure); default stdout.",
        show_default=False)] = None,
    header: Annotated[bool, typer.Option("--header/--no-header", help="Print the header line.")] = True,
    quiet: QuietOpt = False,
    chunk_size: Annotated[int, typer.Option(
        "--chunk-size", min=1, help="Pairs read, scored and written at a time (bounds memory).")] = 4096,
    unknown_as: UnknownOpt = None,
):
    """Score sequence pairs and write TSV: query, target, qlen, tlen, score (in input order)."""
    from swcli.output import TsvWriter
    from swcli.pipeline import Stats, align as align_pairs

    settings = _settings(matrix, unknown_as, gap, temperature, backend, chunk_size=chunk_size)
    pairs = _pairs(queries, targets, all_vs_all)
    stats = Stats()
    try:
        with _progress_bar(quiet, "pair") as bar, TsvWriter(output, header) as writer:
            def on_chunk(s: Stats) -> None:
                bar.update(s.pairs - bar.n)
                bar.set_postfix_str(f"{s.cells / max(s.seconds, 1e-9) / 1e9:.2f} GCUPS", refresh=False)

            for result in align_pairs(pairs, settings, stats, on_chunk):
                writer.write(*result.row())
    except BrokenPipeError:
        # The reader went away (swcli align ... | head): stop quietly, with the shell's SIGPIPE status.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(141) from None


@app.command()
def verify(
    queries: QueriesArg,
    targets: TargetsArg = None,
    all_vs_all: AllVsAllOpt = False,
    matrix: MatrixOpt = "BLOSUM62",
    gap: GapOpt = -4.0,
    temperature: TemperatureOpt = 1.0,
    backend: BackendOpt = Backend.auto,
    sample: Annotated[int, typer.Option("--sample", min=1, help="Pairs to check (drawn at random).")] = 10,
    tolerance: Annotated[float, typer.Option(
        "--tolerance", min=0.0, help="Largest allowed |backend - reference| / max(1, |reference|).")] = 1e-4,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sample.")] = 0,
    max_cells: Annotated[int, typer.Option(
        "--max-cells", min=1, help="Sample only pairs of at most this many cells (qlen x tlen): the "
                                   "reference loop takes about 40 us per cell.")] = 250_000,
    quiet: QuietOpt = False,
    unknown_as: UnknownOpt = None,
):
    """Check the backend against the reference loop (float64) on a sample of the pairs; exit 1 if off."""
    from swcli.verify import verify_pairs

    settings = _settings(matrix, unknown_as, gap, temperature, backend)
    report = verify_pairs(_pairs(queries, targets, all_vs_all), settings, sample, seed, max_cells,
                          lambda total: _progress_bar(quiet, "step", total))
    typer.echo(report.describe(tolerance))
    if report.worst_relative > tolerance:
        raise typer.Exit(1)


@app.command()
def bench(
    backend: BackendOpt = Backend.auto,
    fasta: Annotated[Optional[str], typer.Option(
        "--fasta", help="Real sequences for the real-length rows (default: the bundled example).",
        show_default=False)] = None,
    pairs: Annotated[int, typer.Option(
        "--pairs", min=0, help="Pairs for the end-to-end row (drawn from --fasta); 0 skips it.")] = 10000,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Timed runs per row (median).")] = 5,
    json: Annotated[bool, typer.Option("--json", help="Print the records as JSON.")] = False,
):
    """Time the engine: the seed workload (B=16, 32x32) beside the reference loop, and GCUPS."""
    from swcli.bench import run_benchmarks

    run_benchmarks(_resolve_backend(backend), fasta, pairs, repeats, json)


INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process stopped by Ctrl-C


def _error_types():
    """click's exception classes as typer exposes them (typer vendors click in recent versions)."""
    by_name = {cls.__name__: cls for cls in typer.BadParameter.__mro__}
    return by_name["UsageError"], by_name["ClickException"]


def _stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt  # unwinds like Ctrl-C, so no partial output file is left


def main(argv: Optional[list[str]] = None) -> int:
    """Run the CLI; returns the exit code (the console script passes it to sys.exit)."""
    from swcli._build import BuildError

    usage_error, click_error = _error_types()
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        code = app(args=argv, prog_name="swcli", standalone_mode=False)
        if code == INTERRUPTED:  # typer turns KeyboardInterrupt into a silent exit code 130
            print("swcli: interrupted", file=sys.stderr)
        return code if isinstance(code, int) else 0
    except usage_error as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        print(f"swcli: usage error: {exc.format_message()}{hint}", file=sys.stderr)
        return 2
    except click_error as exc:
        print(f"swcli: error: {exc.format_message()}", file=sys.stderr)
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        print("swcli: interrupted", file=sys.stderr)
        return INTERRUPTED
    except (SwcliError, BuildError) as exc:
        print(f"swcli: error: {exc}", file=sys.stderr)
        return 1
