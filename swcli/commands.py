"""The Typer app behind `swcli`: align, search, makedb, verify, bench (the entry point, with signals, is cli.py).

Imported by cli.main once its signal handler is in place. Startup stays fast (`swcli --help` imports
neither torch nor the kernels): torch and the pipeline are imported inside the commands.
"""

from __future__ import annotations

import math
import os
import stat
import sys
from contextlib import contextmanager
from itertools import chain
from enum import Enum
from typing import Annotated, Optional

import typer

from swcli import __version__, interrupt
from swcli.errors import SwcliError
from swcli.output import check_output_path, refuse_output_over_inputs

app = typer.Typer(
    name="swcli",
    help="Soft Smith-Waterman local alignment of protein (or any) sequence pairs, scored on CPU or GPU.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"swcli {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_show_version, help="Print the version and exit.")] = False,
):
    """Soft Smith-Waterman local alignment of protein (or any) sequence pairs, scored on CPU or GPU."""


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
# The gaps: --gap's None means "not given" (its default is -4, scoring.resolve_gaps), so that giving it
# with an affine option can be refused.
GapOpt = Annotated[Optional[float], typer.Option(
    "--gap", show_default=False,  # its range: check_gap_options, which names NaN too
    help="Linear gap SCORE added per gap position (so negative; e.g. --gap -4). Equals Biopython's "
         "open_gap_score = extend_gap_score = GAP. Default -4, unless --gap-open/--gap-extend are given.")]
GapOpenOpt = Annotated[Optional[float], typer.Option(
    "--gap-open", show_default=False,
    help="Affine gaps: the SCORE of a gap's first position (GAP_OPEN <= GAP_EXTEND <= 0), so a gap of length k "
         "scores GAP_OPEN + (k - 1) GAP_EXTEND: Biopython's open_gap_score. BLAST's gap costs G/E are "
         "--gap-open -(G+E) --gap-extend -E (its 11/1: --gap-open -12 --gap-extend -1); MMseqs2's --gap-open O "
         "--gap-extend E are --gap-open -O --gap-extend -E. Alone, --gap-extend is BLAST's default extension "
         "for the matrix (BLOSUM62: -1).")]
GapExtendOpt = Annotated[Optional[float], typer.Option(
    "--gap-extend", show_default=False,
    help="Affine gaps: the SCORE of each further gap position: Biopython's extend_gap_score. Alone, --gap-open "
         "adds BLAST's default existence cost for the matrix to it (BLOSUM62: 11, so --gap-extend -2 is "
         "--gap-open -13 --gap-extend -2, BLAST's -gapextend 2).")]
TemperatureOpt = Annotated[float, typer.Option(  # its range: check_temperature, which names NaN too
    "--temperature", "-t", help="Softness of the max; 0 is exact (hard) Smith-Waterman.")]
BackendOpt = Annotated[Backend, typer.Option(
    "--backend", help="auto: the GPU when torch sees one, else the CPU. "
                      "reference: the Python loop (slow; for validation).")]
UnknownOpt = Annotated[Optional[str], typer.Option(
    "--unknown-as", help="Score letters the matrix lacks as this letter (e.g. X) instead of failing.",
    show_default=False)]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
StatsOpt = Annotated[bool, typer.Option(
    "--stats", help="Once the output is in place, say on stderr what the run did: its cells (query x target "
                    "residues), its time from reading the inputs to the output written (start-up excluded), "
                    "the GCUPS, and the scoring calls' time.")]
OutputOpt = Annotated[Optional[str], typer.Option(
    "--output", "-o", help="Write the TSV here: a file is replaced atomically once the output is complete (its "
                           "mode kept; nothing changes on failure or Ctrl-C); a symlink is written through, a "
                           "device or FIFO directly. Default stdout.", show_default=False)]
HeaderOpt = Annotated[bool, typer.Option("--header/--no-header", help="Print the header line.")]
FormatOpt = Annotated[str, typer.Option(
    "--format-output", help="Columns, comma-separated, MMseqs2 names: query,target,qlen,tlen,score,qstart,qend,"
                            "tstart,tend,alnlen,nident,fident,pident,mismatch,gapopen,gaps,cigar,qaln,taln,evalue,"
                            "bits. The alignment columns describe one optimal alignment at t = 0 (same matrix and "
                            "gaps); only the columns asked for are computed.")]
LambdaOpt = Annotated[Optional[float], typer.Option(
    "--lambda", show_default=False,
    help="Karlin-Altschul lambda for evalue and bits, with --k (default: estimated once per matrix, gaps and "
         "temperature from random sequences, and cached).")]
KOpt = Annotated[Optional[float], typer.Option(
    "--k", show_default=False, help="Karlin-Altschul K, with --lambda.")]
AlphaOpt = Annotated[Optional[float], typer.Option(
    "--alpha", show_default=False,
    help="With --lambda and --k: the length correction's alpha, with --beta, in BLAST's units (its table for "
         "BLOSUM62 11/1: --alpha 1.9 --beta -30): effective lengths m - l, n - l with l the fixed point of "
         "l = (alpha / lambda) ln(K (m - l)(n - l)) + beta. Without them, given --lambda and --k get no length "
         "correction; estimated parameters always have one.")]
BetaOpt = Annotated[Optional[float], typer.Option(
    "--beta", show_default=False, help="The length correction's beta, with --alpha.")]


class Distributed(str, Enum):
    auto = "auto"
    on = "on"
    off = "off"


DistributedOpt = Annotated[Distributed, typer.Option(
    "--distributed", help="Under torchrun (torchrun --nproc-per-node N -m swcli ...): share the run among its "
                          "processes. auto: where torchrun's RANK, WORLD_SIZE and LOCAL_RANK were set for this "
                          "process, not inherited from its parent (a command that a torchrun worker starts runs "
                          "as one process, and says so), and WORLD_SIZE is over 1 (one rank runs as one process); "
                          "on: wherever they are set (a launcher that wraps the command in a script; a group of "
                          "one too); off: always one process.")]


class Rank(str, Enum):
    score = "score"
    evalue = "evalue"


def _resolve_backend(backend: Backend) -> str:
    """The CLI's auto: CUDA when torch sees a GPU, else the CPU engine."""
    import torch

    if backend is Backend.auto:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if backend is Backend.cuda and not torch.cuda.is_available():
        raise SwcliError("--backend cuda: no CUDA device is available (torch.cuda.is_available() is False)")
    return backend.value


def _check_stdin_once(queries: str, targets: Optional[str], all_vs_all: bool) -> None:
    if targets is not None and queries == targets == "-" and not all_vs_all:
        raise SwcliError("stdin ('-') can be read only once: give at most one of QUERIES and TARGETS as -")


def _pairs(queries: str, targets: Optional[str], all_vs_all: bool, matrix):
    """The pairs as records, one by one (verify samples them), every record's letters checked against the
    matrix as align checks them, sampled or not: a file align refuses is refused here too."""
    from swcli import fasta

    checked = []  # the Records already checked (all-vs-all repeats its blocks from chunk to chunk)
    for chunk in _pair_chunks(queries, targets, all_vs_all, fasta.RECORD_PAIRS_CHUNK):
        for records in (chunk.queries, chunk.targets):
            if not any(records is seen for seen in checked):
                matrix.encode_records(records)
                checked = [*checked[-1:], records]
        for k in range(len(chunk)):
            yield chunk.pair(k)


def _pair_chunks(queries: str, targets: Optional[str], all_vs_all: bool, size: int):
    """The pairs in chunks of columns (align scores them)."""
    from swcli import fasta

    _check_stdin_once(queries, targets, all_vs_all)
    if all_vs_all:
        return fasta.chunks_all_against_all(queries, targets or queries, size)
    if targets is None:
        return fasta.chunks_in_one_file(queries, size)
    return fasta.chunks_in_two_files(queries, targets, size)


def _first_chunk_checked(chunks, settings):
    """The chunks, the first read and its letters checked now: a missing file or a bad record at the start
    is said at once, not after lambda and K's estimate (up to a minute where no cache has them)."""
    chunks = iter(chunks)
    first = next(chunks, None)
    if first is None:
        return chunks
    settings.matrix.encode_records(first.queries)
    settings.matrix.encode_records(first.targets)
    return chain([first], chunks)


def _settings(matrix: str, unknown_as: Optional[str], gap: Optional[float], temperature: float, backend: Backend,
              gap_open: Optional[float] = None, gap_extend: Optional[float] = None, **extra):
    from pathlib import Path

    from swcli.ops import prepare_backend
    from swcli.pipeline import Settings
    from swcli.scoring import check_gap_options, check_temperature, load_matrix, resolve_gaps

    check_gap_options(gap, gap_open, gap_extend)
    temperature = check_temperature(temperature)
    substitution = load_matrix(matrix)
    # BLAST's defaults are those of its named matrices: a matrix file has none, whatever its name.
    gaps = resolve_gaps(gap, gap_open, gap_extend, None if Path(matrix).is_file() else substitution.name)
    if unknown_as is not None:
        substitution = _with_unknown_as(substitution, unknown_as)
    resolved = _resolve_backend(backend)
    prepare_backend(resolved)
    return Settings(substitution, gaps.gap, temperature, resolved, gap_open=gaps.gap_open,
                    gap_extend=gaps.gap_extend, **extra)


def _with_unknown_as(substitution, letter: str):
    """--unknown-as applied; a letter the matrix lacks is a bad option value: a usage error (exit 2)."""
    from swcli.errors import MatrixError
    from swcli.scoring import _usage_error

    try:
        return substitution.with_unknown_as(letter)
    except MatrixError as exc:
        raise _usage_error(str(exc)) from None


def _columns(format_output: str, lambda_: Optional[float], k: Optional[float], alpha: Optional[float] = None,
             beta: Optional[float] = None, rank: Rank = Rank.score, cutoff: bool = False) -> tuple[str, ...]:
    """--format-output's columns, and --lambda/--k/--alpha/--beta checked against them, --rank and
    --max-evalue (cutoff) (usage errors, exit 2)."""
    from swcli.details import parse_columns
    from swcli.scoring import _usage_error

    columns = parse_columns(format_output)
    if (lambda_ is None) != (k is None):
        raise _usage_error("--lambda and --k go together: give both, or neither to have them estimated")
    if (alpha is None) != (beta is None):
        raise _usage_error("--alpha and --beta go together: give both, or neither for no length correction")
    if alpha is not None and lambda_ is None:
        raise _usage_error("--alpha and --beta go with --lambda and --k (estimated parameters have their own)")
    for option, value in (("--lambda", lambda_), ("--k", k), ("--alpha", alpha)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise typer.BadParameter(f"{value} is not a finite number > 0", param_hint=f"'{option}'")
    if beta is not None and not math.isfinite(beta):
        raise typer.BadParameter(f"{beta} is not a finite number", param_hint="'--beta'")
    if lambda_ is not None and not statistics_needed(columns, rank, cutoff):
        raise _usage_error("--lambda and --k are used only by the evalue and bits columns of --format-output, "
                           "by --rank evalue and by --max-evalue")
    return columns


def statistics_needed(columns: tuple[str, ...], rank, cutoff: bool = False) -> bool:
    """Whether the columns, --rank evalue or --max-evalue (cutoff) need lambda and K."""
    from swcli.details import STATISTICS_COLUMNS

    return bool(STATISTICS_COLUMNS & set(columns)) or rank is Rank.evalue or cutoff


def _statistics(columns: tuple[str, ...], settings, lambda_: Optional[float], k: Optional[float],
                alpha: Optional[float], beta: Optional[float], quiet: bool, rank: Rank = Rank.score, group=None,
                cutoff: bool = False, database_sequences: Optional[int] = None):
    """lambda, K and the length correction (given, cached or estimated now, by rank 0 of a distributed
    group and shared) where the evalue or bits columns, --rank evalue or --max-evalue (cutoff) need them,
    else None; their values go to stderr unless --quiet."""
    from swcli import distributed

    if not statistics_needed(columns, rank, cutoff):
        return None
    from swcli.statistics import parameters, setting_name

    found = distributed.shared(group, lambda: parameters(settings, lambda_, k, alpha=alpha, beta=beta))
    if database_sequences is not None:
        from dataclasses import replace

        found = replace(found, database_sequences=database_sequences)
    if not quiet:
        typer.echo(f"swcli: Karlin-Altschul {found.describe()} for {setting_name(settings)}", err=True)
    return found


def _formatter(columns: tuple[str, ...], settings, statistics):
    """The details' formatter of the columns (None for the default columns: the plain rows are written)."""
    from swcli.details import DEFAULT_COLUMNS, Formatter

    if columns == DEFAULT_COLUMNS:
        return None
    import torch

    return Formatter(columns, settings, statistics, torch.get_num_threads())


def _progress_shown(quiet: bool) -> bool:
    return not quiet and sys.stderr.isatty()


def _progress_bar(quiet: bool, unit: str, total=None, **options):
    from tqdm import tqdm

    disable = not _progress_shown(quiet)
    interrupt.set_bar_shown(not disable)
    return tqdm(total=total, unit=unit, file=sys.stderr, disable=disable, dynamic_ncols=True, **options)


class InputBytes:
    """How far the input files have been read, for a progress bar with a total and an ETA.

    The files are opened by fasta.py; the position of each open file on one of them (found through
    /dev/fd, on Linux and macOS) is the bytes read so far: compressed bytes for gzip, so the total is
    the files' sizes either way. None where some input is stdin or not a regular file, or /dev/fd is
    missing: the bar then counts pairs, without a total.
    """

    def __init__(self, paths: list[str]):
        self.files = set()
        self.total = 0
        for path in paths:
            info = os.stat(path)
            self.files.add((info.st_dev, info.st_ino))
            self.total += info.st_size
        self.best = 0

    @classmethod
    def of(cls, paths: list[str]) -> InputBytes | None:
        try:
            if not os.path.isdir("/dev/fd") or any(
                    p == "-" or not stat.S_ISREG(os.stat(p).st_mode) for p in paths):
                return None
            return cls(paths)
        except OSError:  # a missing file: fasta.py says so, in its words
            return None

    def done(self) -> int:
        """Bytes read so far (never less than before: a file read to its end is closed)."""
        position = 0
        try:
            names = os.listdir("/dev/fd")
        except OSError:
            return self.best
        for name in names:
            try:
                fd = int(name)
                info = os.fstat(fd)
                if (info.st_dev, info.st_ino) in self.files and stat.S_ISREG(info.st_mode):
                    position += os.lseek(fd, 0, os.SEEK_CUR)
            except (ValueError, OSError):  # the listing's own descriptor, closed since
                continue
        self.best = max(self.best, min(position, self.total))
        return self.best


def _progress_inputs(queries: str, targets: Optional[str], all_vs_all: bool) -> list[str]:
    """The files whose reading measures the progress: with --all-vs-all the queries (the targets are
    read first, into memory; one file is then all in memory: none), else every input."""
    if all_vs_all:
        return [] if targets is None or targets == queries else [queries]
    return [queries] if targets is None else [queries, targets]


@app.command()
def align(
    queries: QueriesArg,
    targets: TargetsArg = None,
    all_vs_all: AllVsAllOpt = False,
    matrix: MatrixOpt = "BLOSUM62",
    gap: GapOpt = None,
    gap_open: GapOpenOpt = None,
    gap_extend: GapExtendOpt = None,
    temperature: TemperatureOpt = 1.0,
    backend: BackendOpt = Backend.auto,
    output: OutputOpt = None,
    header: HeaderOpt = True,
    quiet: QuietOpt = False,
    chunk_size: Annotated[int, typer.Option(
        "--chunk-size", min=1, help="Pairs read, scored and written at a time (bounds memory).")] = 16384,
    unknown_as: UnknownOpt = None,
    format_output: FormatOpt = "query,target,qlen,tlen,score",
    lambda_: LambdaOpt = None,
    k: KOpt = None,
    alpha: AlphaOpt = None,
    beta: BetaOpt = None,
    distributed_: DistributedOpt = Distributed.auto,
    stats_: StatsOpt = False,
):
    """Score sequence pairs and write TSV: query, target, qlen, tlen, score (in input order), or the
    --format-output columns."""
    from swcli import _host, distributed
    from swcli.output import chunk_rows, finite_scores
    from swcli.pipeline import Stats

    refuse_output_over_inputs(output, (("QUERIES", queries), ("TARGETS", targets), ("--matrix", matrix)))
    columns = _columns(format_output, lambda_, k, alpha, beta)
    group = distributed.start((queries, targets), distributed_.value, quiet)  # None unless started by torchrun
    quiet = quiet or not distributed.is_leader(group)
    with distributed.phase(group):
        if distributed.is_leader(group):  # (the rank that writes -o)
            check_output_path(output)
        settings = _settings(matrix, unknown_as, gap, temperature, backend, gap_open, gap_extend,
                             chunk_size=chunk_size)
        _host.load()
    distributed.check_engine(group, settings)
    interrupt.check()  # the imports and the builds are done: a signal now ends the run here
    chunks = _pair_chunks(queries, targets, all_vs_all, chunk_size)
    if statistics_needed(columns, Rank.score):
        chunks = _first_chunk_checked(chunks, settings)
    formatter = _formatter(columns, settings,
                           _statistics(columns, settings, lambda_, k, alpha, beta, quiet, group=group))
    if formatter is not None:
        from swcli.details import chunk_detail_rows

        rows_of = lambda chunk, scores: chunk_detail_rows(formatter, chunk, finite_scores(chunk, scores))  # noqa: E731
    else:
        rows_of = chunk_rows
    paths = _progress_inputs(queries, targets, all_vs_all)
    measure = InputBytes.of(paths) if paths and _progress_shown(quiet) else None  # it costs a listdir a chunk
    stats = Stats()
    if measure is not None:
        bar = _progress_bar(quiet, "B", measure.total, unit_scale=True, unit_divisor=1024)
    else:
        bar = _progress_bar(quiet, "pair")
    try:
        with bar, distributed.writer(group, output, header, columns) as writer:
            def on_chunk(s: Stats) -> None:
                bar.update((measure.done() if measure is not None else s.pairs) - bar.n)
                bar.set_postfix_str(f"{s.pairs:,} pairs, {s.cells / max(s.seconds, 1e-9) / 1e9:.2f} GCUPS",
                                    refresh=False)

            distributed.align_rows(group, chunks, settings, rows_of, writer, stats, on_chunk)
            if measure is not None:
                bar.update(measure.total - bar.n)  # the files are read to their end
        if stats_ and distributed.is_leader(group):
            typer.echo(f"swcli: {stats.pairs:,} pairs: {_work(stats.cells, stats.seconds)}; scoring calls "
                       f"{stats.kernel_seconds:.3f} s{_ranks(group)}", err=True)
    except BrokenPipeError:
        _reader_left()


def _reader_left():
    """The reader of stdout went away (swcli align ... | head): stop quietly, with the shell's SIGPIPE
    status (141)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise typer.Exit(141) from None


@contextmanager
def _stdout_reader_may_leave():
    """_reader_left where what is inside writes to stdout; a stdout closed, full or failing is one line."""
    _require_stdout()
    try:
        yield
    except BrokenPipeError:
        _reader_left()
    except OSError as exc:
        raise SwcliError(f"stdout: cannot write output ({exc.strerror or exc})") from None


def _require_stdout() -> None:
    """stdout, which a command writes its report to, is there (a process started with `>&-` has none)."""
    if sys.stdout is None:
        raise SwcliError("standard output is closed: nowhere to write the report")


def _check_tolerance(value: float) -> float:
    if not (math.isfinite(value) and value >= 0):  # click's own range check words a NaN as out of range
        raise typer.BadParameter(f"{value} is not a finite number >= 0", param_hint="'--tolerance'")
    return value


@app.command()
def verify(
    queries: QueriesArg,
    targets: TargetsArg = None,
    all_vs_all: AllVsAllOpt = False,
    matrix: MatrixOpt = "BLOSUM62",
    gap: GapOpt = None,
    gap_open: GapOpenOpt = None,
    gap_extend: GapExtendOpt = None,
    temperature: TemperatureOpt = 1.0,
    backend: BackendOpt = Backend.auto,
    sample: Annotated[int, typer.Option("--sample", min=1, help="Pairs to check (drawn at random).")] = 10,
    tolerance: Annotated[float, typer.Option(
        "--tolerance", callback=_check_tolerance,
        help="Largest allowed |backend - reference| / max(1, |reference|).")] = 1e-4,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sample.")] = 0,
    max_cells: Annotated[int, typer.Option(
        "--max-cells", min=1, help="Sample only pairs of at most this many cells (qlen x tlen): the "
                                   "reference loop takes about 40 us per cell.")] = 250_000,
    quiet: QuietOpt = False,
    unknown_as: UnknownOpt = None,
):
    """Check the backend against the reference loop (float64) on a sample of the pairs; exit 1 if off."""
    from swcli.verify import verify_pairs

    _require_stdout()  # before the work, which would be lost
    settings = _settings(matrix, unknown_as, gap, temperature, backend, gap_open, gap_extend)
    pairs = _pairs(queries, targets, all_vs_all, settings.matrix)
    report = verify_pairs(pairs, settings, sample, seed, max_cells, lambda total: _progress_bar(quiet, "step", total))
    with _stdout_reader_may_leave():
        typer.echo(report.describe(tolerance))
    if report.worst_relative > tolerance:
        raise typer.Exit(1)


@app.command()
def search(
    queries: QueriesArg,
    database: Annotated[str, typer.Argument(
        metavar="DATABASE", help="FASTA of the database (plain or gzip), or a folder prepared by swcli makedb.",
        show_default=False)],
    top: Annotated[int, typer.Option(
        "--top", "-k", min=1, help="Hits kept per query: the best scores, ties broken by database order.")] = 10,
    matrix: MatrixOpt = "BLOSUM62",
    gap: GapOpt = None,
    gap_open: GapOpenOpt = None,
    gap_extend: GapExtendOpt = None,
    temperature: TemperatureOpt = 1.0,
    backend: BackendOpt = Backend.auto,
    output: OutputOpt = None,
    header: HeaderOpt = True,
    quiet: QuietOpt = False,
    max_memory: Annotated[int, typer.Option(
        "--max-memory", min=0, help="Bytes of padded database blocks kept on the device between queries; past "
                                    "it they are padded again for each query (the same hits).")] = 1 << 32,
    unknown_as: UnknownOpt = None,
    format_output: FormatOpt = "query,target,qlen,tlen,score",
    lambda_: LambdaOpt = None,
    k: KOpt = None,
    alpha: AlphaOpt = None,
    beta: BetaOpt = None,
    rank: Annotated[Rank, typer.Option(
        "--rank", help="Which hits to keep and in what order: score (descending; ties by database order) or "
                       "evalue (ascending, exactly over the whole database; then by score, then database order). "
                       "The E-value weighs the target's length: a shorter target can have the smaller E-value "
                       "at a lower score. evalue needs lambda and K (estimated once per setting, or --lambda "
                       "and --k).")] = Rank.score,
    max_evalue: Annotated[Optional[float], typer.Option(
        "--max-evalue", min=0.0, help="Leave out the hits whose E-value is above this, as SSEARCH's -E (its "
                                      "default 10); --top still caps the hits of a query, so give a larger one "
                                      "to have every hit under it. Needs lambda and K, as evalue does.",
        show_default=False)] = None,
    db_sequences: Annotated[Optional[int], typer.Option(
        "--db-sequences", min=1, help="Count E-values for this many database sequences instead of the "
                                      "database's own, as SSEARCH's -Z: for a database searched in parts, "
                                      "give the whole's count. With evalue, --rank evalue or --max-evalue.",
        show_default=False)] = None,
    distributed_: DistributedOpt = Distributed.auto,
    stats_: StatsOpt = False,
):
    """Search every query against every database sequence; write the best --top hits of each query as TSV:
    query, target, qlen, tlen, score (queries in input order, hits by descending score, or by ascending
    E-value with --rank evalue), or the --format-output columns."""
    from functools import partial

    from swcli import _host, distributed
    from swcli.search import EvalueCutoff, check_inputs, read_queries, run_search

    check_inputs(queries, database)
    inputs = [("QUERIES", queries), ("DATABASE", database), ("--matrix", matrix)]
    if os.path.isdir(database):  # a makedb folder: -o must not name one of its files either
        from swcli.database import FILES

        inputs += [(f"DATABASE's {name}", os.path.join(database, name)) for name in FILES]
    refuse_output_over_inputs(output, inputs)
    cutoff = max_evalue is not None  # (NaN fails the option's min=0 before this)
    columns = _columns(format_output, lambda_, k, alpha, beta, rank, cutoff)
    if db_sequences is not None and not ("evalue" in columns or rank is Rank.evalue or cutoff):
        from swcli.scoring import _usage_error

        raise _usage_error("--db-sequences counts E-values: it goes with the evalue column of --format-output, "
                           "--rank evalue or --max-evalue")
    group = distributed.start((queries, database), distributed_.value, quiet)  # None unless started by torchrun
    quiet = quiet or not distributed.is_leader(group)
    with distributed.phase(group):
        if distributed.is_leader(group):  # (the rank that writes -o)
            check_output_path(output)
        settings = _settings(matrix, unknown_as, gap, temperature, backend, gap_open, gap_extend)
        _host.load()
        # read now where lambda and K are needed: a bad query is said at once, not after their estimate
        queries_read = read_queries(queries, settings) if statistics_needed(columns, rank, cutoff) else None
    distributed.check_engine(group, settings)
    statistics = _statistics(columns, settings, lambda_, k, alpha, beta, quiet, rank, group, cutoff, db_sequences)
    formatter = _formatter(columns, settings, statistics)
    interrupt.check()  # the imports and the builds are done: a signal now ends the run here
    run = run_search if group is None else partial(distributed.run_search, group)
    try:
        done = run(queries, database, settings, output, top=top, header=header, max_bytes=max_memory,
                   progress=lambda total: _progress_bar(quiet, "query", total), formatter=formatter,
                   rank=statistics if rank is Rank.evalue else None,
                   warn=lambda text: typer.echo(f"swcli: warning: {text}", err=True), queries_read=queries_read,
                   cutoff=EvalueCutoff(statistics, max_evalue) if cutoff else None)
    except BrokenPipeError:
        _reader_left()
    if stats_ and distributed.is_leader(group):
        query_residues = done.cells // max(done.residues, 1)
        typer.echo(f"swcli: {done.queries:,} queries ({query_residues:,} residues) x {done.sequences:,} sequences "
                   f"({done.residues:,} residues): {_work(done.cells, done.seconds)}; scoring calls "
                   f"{done.kernel_seconds:.3f} s ({done.kernel}){_ranks(group)}", err=True)


def _work(cells: int, seconds: float) -> str:
    """A run's cells, its time and its GCUPS, for --stats."""
    return f"{cells:,} cells in {seconds:.3f} s, {cells / max(seconds, 1e-9) / 1e9:,.2f} GCUPS"


def _ranks(group) -> str:
    """What --stats adds for a run of several ranks: the scoring calls above are rank 0's, on its share."""
    if group is None:
        return ""
    if group.size == 1:  # --distributed on with one rank
        return "; 1 rank"
    return f"; {group.size} ranks, the scoring calls rank 0's, on its share"


@app.command()
def makedb(
    fasta_path: Annotated[str, typer.Argument(
        metavar="FASTA", help="The database's sequences, plain or gzip, or - for stdin.", show_default=False)],
    folder: Annotated[str, typer.Argument(
        metavar="FOLDER", help="The new folder to write (an existing path is refused).", show_default=False)],
    matrix: MatrixOpt = "BLOSUM62",
    unknown_as: UnknownOpt = None,
    quiet: QuietOpt = False,
):
    """Prepare a database for swcli search: encoded once, ordered by length, memory-mapped on later runs."""
    from swcli import database
    from swcli import _host
    from swcli.fasta import display_name, read_blocks
    from swcli.scoring import load_matrix

    substitution = load_matrix(matrix)
    if unknown_as is not None:
        substitution = _with_unknown_as(substitution, unknown_as)
    database.check_new_folder(folder)
    _host.load()
    # The reading is most of the time: a bar over the file's bytes (records where it is stdin or a pipe).
    measure = InputBytes.of([fasta_path]) if _progress_shown(quiet) else None
    if measure is not None:
        bar = _progress_bar(quiet, "B", measure.total, unit_scale=True, unit_divisor=1024)
    else:
        bar = _progress_bar(quiet, "seq")

    def counted(blocks):
        for block in blocks:
            bar.update(measure.done() - bar.n if measure is not None else len(block))
            yield block

    # A matrix file is kept by its absolute path, so that a search elsewhere can be told which --matrix to give.
    matrix_name = database.matrix_reference(matrix, substitution)
    with bar:
        db = database.build_from_blocks(counted(read_blocks(fasta_path)), substitution, display_name(fasta_path),
                                        matrix_name)
    interrupt.check()
    from swcli.scoring import NUCLEOTIDE_SAMPLE

    for said in (database.duplicate_ids(db),
                 substitution.nucleotide_warning(db.codes[:NUCLEOTIDE_SAMPLE], db.source)):
        if said is not None:
            typer.echo(f"swcli: warning: {said}", err=True)
    database.save(db, folder)
    typer.echo(f"{folder}: {len(db):,} sequences, {db.residues:,} residues", err=True)


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

    with _stdout_reader_may_leave():
        run_benchmarks(_resolve_backend(backend), fasta, pairs, repeats, json)


