"""Substitution matrices from Biopython, and letters -> uint8 codes into them.

A sequence is encoded once, with one bytes.translate over a 256-entry table (case-insensitive), so that
batches are built from codes and scores are looked up on the compute device, never per pair in Python.
Scores, like the gap and the temperature (check_gap, check_temperature: the CLI's option checks), must
be finite in float32, the precision the engines compute in: an inf or NaN would make every score inf
or NaN, without an error.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swcli.errors import AlphabetError, MatrixError

INVALID = 255
AMINO_ACID_ONLY = "EFILPQ"  # letters that are no IUPAC nucleotide code: a matrix with them scores proteins
NUCLEOTIDES = "ACGTUN"
NUCLEOTIDE_SAMPLE = 1 << 22  # residues looked at for nucleotide_warning: enough to tell, and milliseconds
FLOAT32_MAX = 3.4028234663852886e38  # larger magnitudes are inf in float32


def _finite32(value: float) -> bool:
    return math.isfinite(value) and abs(value) <= FLOAT32_MAX


def _bad_option(option: str, value: float, rule: str):
    import typer  # here, not at the top: the library (and its tests) do not need the CLI

    return typer.BadParameter(f"{value} is not {rule}", param_hint=f"'{option}'")


FLOAT32_SMALLEST_NORMAL = 1.1754943508222875e-38


def check_temperature(value: float) -> float:
    """--temperature: a finite number >= 0. Raises typer.BadParameter (a usage error, exit 2); usable as
    the option's typer callback or called with the parsed value."""
    if not (_finite32(value) and value >= 0):
        raise _bad_option("--temperature", value,
                          "a finite number >= 0 within float32's range (0 is hard Smith-Waterman)")
    if 0 < value < FLOAT32_SMALLEST_NORMAL:  # S / t would pass float32's range (the reference loop overflows)
        raise _bad_option("--temperature", value,
                          "0 or at least float32's smallest normal number, 1.2e-38 (0 is hard Smith-Waterman)")
    return value


def check_gap(value: float, option: str = "--gap", example: str = "--gap -4") -> float:
    """--gap (or another gap option): a finite number <= 0 (a gap score). Raises typer.BadParameter (a usage
    error, exit 2)."""
    if not (_finite32(value) and value <= 0):
        raise _bad_option(option, value, f"a finite gap score <= 0 (e.g. {example})")
    return value


def _usage_error(message: str):
    import typer

    # click's UsageError, as typer exposes it (typer vendors click in recent versions): exit 2, no option
    # named in front of the message, since the message is about how options combine.
    usage_error = next(cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "UsageError")
    return usage_error(message)


# BLAST's default gap costs per matrix, (existence G, extension E): what blastp takes for -matrix NAME
# without -gapopen and -gapextend (NCBI BLAST+, c++/src/algo/blast/core/blast_stat.c, the entry marked
# BLAST_MATRIX_BEST in each matrix's table). A gap of length k costs G + k E there: as scores here,
# --gap-open -(G + E) --gap-extend -E.
# BLOSUM80 has none: Biopython's is the 1/3-bit matrix (blosum80_3.iij), BLAST's the 1/2-bit one, so
# BLAST's 10/1 for it does not fit these scores (their random pairs' scores then grow with the length).
BLAST_GAP_COSTS = {
    "BLOSUM45": (14, 2), "BLOSUM50": (13, 2), "BLOSUM62": (11, 1), "BLOSUM90": (10, 1),
    "PAM30": (9, 1), "PAM70": (10, 1), "PAM250": (14, 2),
}


@dataclass(frozen=True)
class Gaps:
    """The gaps of a run: a linear gap score, or affine open and extend scores (the other field(s) None)."""

    gap: float | None = -4.0
    gap_open: float | None = None
    gap_extend: float | None = None

    @property
    def affine(self) -> bool:
        return self.gap_open is not None

    def describe(self) -> str:
        if self.affine:
            return f"affine gaps: open {self.gap_open:g}, extend {self.gap_extend:g}"
        return f"linear gap {self.gap:g}"


def check_gap_options(gap: float | None, gap_open: float | None, gap_extend: float | None) -> None:
    """The gap options' values alone, before the matrix is known: each finite and <= 0, and --gap not
    with the affine pair. Raises click's usage errors (exit 2)."""
    if gap is not None:
        check_gap(gap)
        if gap_open is not None or gap_extend is not None:
            given = "--gap-open" if gap_open is not None else "--gap-extend"
            raise _usage_error(f"--gap and {given} exclude each other: --gap is a linear gap score, --gap-open "
                               "and --gap-extend make the gaps affine; give one kind")
    if gap_open is not None:
        check_gap(gap_open, "--gap-open", "--gap-open -12")
    if gap_extend is not None:
        check_gap(gap_extend, "--gap-extend", "--gap-extend -1")


def resolve_gaps(gap: float | None, gap_open: float | None, gap_extend: float | None, matrix: str | None) -> Gaps:
    """The run's gaps from the options (checked by check_gap_options), for the matrix named `matrix`
    (None: a matrix file, which has no BLAST defaults).

    No affine option: the linear gap, -4 by default. One of the pair alone: the other as blastp takes it
    for this matrix (BLAST_GAP_COSTS), the defaults being costs: --gap-open alone takes extension E
    (--gap-extend -E); --gap-extend alone keeps the existence cost G on top of the given extension
    (--gap-open -G + GAP_EXTEND), as blastp -gapextend does. Then gap_open <= gap_extend, else a usage
    error. Equal open and extend scores are the linear gap (the same recurrence, design.md section 1),
    scored as --gap: the linear engines are faster, and the output is --gap's byte for byte."""
    if gap_open is None and gap_extend is None:
        return Gaps(-4.0 if gap is None else gap)
    filled = None
    if gap_open is None or gap_extend is None:
        given, missing = ("--gap-open", "--gap-extend") if gap_extend is None else ("--gap-extend", "--gap-open")
        costs = BLAST_GAP_COSTS.get(matrix.upper()) if matrix is not None else None
        if costs is None:
            which = f"matrix {matrix}" if matrix is not None else "a matrix file"
            raise _usage_error(f"{given} without {missing}: {which} has no BLAST default gap costs to take "
                               f"{missing} from (BLOSUM45/50/62/90, PAM30/70/250 have); give both")
        existence, extension = costs
        if gap_extend is None:
            gap_extend = -float(extension)
        else:
            gap_open = gap_extend - existence
        value = gap_extend if missing == "--gap-extend" else gap_open
        filled = f"{missing} {value:g} from {matrix}'s BLAST default {existence}/{extension}"
    if gap_open > gap_extend:
        source = f" ({filled})" if filled else ""
        raise _bad_option("--gap-open", gap_open,
                          f"<= --gap-extend {gap_extend:g}{source}: a gap's first position scores at most what "
                          "each further one does")
    if gap_open == gap_extend:
        return Gaps(gap_open)
    return Gaps(None, gap_open, gap_extend)


def available_matrices() -> list[str]:
    """The names Bio.Align.substitution_matrices.load() knows."""
    from Bio.Align import substitution_matrices

    return substitution_matrices.load()


@dataclass(frozen=True)
class SubstitutionMatrix:
    """A square scoring matrix over an alphabet, and the table that encodes letters into it."""

    name: str
    alphabet: str
    scores: tuple[tuple[float, ...], ...]  # scores[a][b] for codes a, b
    table: bytes  # 256 entries: byte value -> code, INVALID where the letter is not scored
    unknown_as: str | None = None

    def tensor(self, dtype=None, device=None):
        """The scores as a (K, K) tensor, float32 unless told otherwise."""
        import torch

        return torch.tensor(self.scores, dtype=dtype or torch.float32, device=device)

    def score(self, a: str, b: str) -> float:
        return self.scores[self.alphabet.index(a)][self.alphabet.index(b)]

    def encode(self, sequence: str, where: Callable[[], str]) -> bytes:
        """Codes of `sequence`; where() names the record in the error for a letter the matrix lacks
        (a callable, so that the name is only built for an error)."""
        try:
            raw = sequence.encode("ascii")
        except UnicodeEncodeError as exc:
            self._invalid(sequence, exc.start, where)
        codes = raw.translate(self.table)
        bad = codes.find(INVALID)
        if bad >= 0:
            self._invalid(sequence, bad, where)
        return codes

    def encode_records(self, records) -> np.ndarray:
        """Codes of every letter of a fasta.Records block, back to back (its offsets apply): one table
        lookup per letter, in C; the first letter the matrix lacks is an error naming its record and
        position."""
        from swcli import _host

        codes, bad = _host.encode(records.residues, self.table, INVALID)
        if bad >= 0:
            k = int(np.searchsorted(records.offsets, bad, side="right")) - 1
            self._invalid(records.sequence(k), bad - int(records.offsets[k]), lambda: records.where(k))
        return codes

    def _invalid(self, sequence: str, position: int, where: Callable[[], str]):
        wildcard = next((w for w in "XN*" if w in self.alphabet), None)  # the matrix's any-residue letter
        if not sequence[position].isascii():  # --unknown-as maps letters, never other characters
            hint = "; only ASCII letters are taken"
        elif self.unknown_as or wildcard is None:
            hint = ""
        else:
            hint = f"; use --unknown-as {wildcard} to score unknown letters as {wildcard}"
        raise AlphabetError(
            f"{where()}: invalid letter {sequence[position]!r} at position {position + 1} "
            f"(not in the {self.name} alphabet {self.alphabet}{hint})"
        )

    def nucleotide_warning(self, codes, source: str) -> str | None:
        """A warning where a protein matrix is to score what look like nucleotides (at least 90% of 20 or
        more residues A, C, G, T, U or N), else None: SSEARCH would take them for DNA from the composition;
        here they would be scored as amino acids, and get E-values as such."""
        if sum(letter in self.alphabet for letter in AMINO_ACID_ONLY) < 3:  # a nucleotide matrix
            return None
        counts = np.bincount(np.frombuffer(codes, dtype=np.uint8), minlength=256)
        total = int(counts.sum())
        nucleotides = sum(int(counts[self.table[ord(letter)]]) for letter in NUCLEOTIDES if letter in self.alphabet)
        if total < 20 or nucleotides < 0.9 * total:
            return None
        return (f"{source}: {nucleotides / total:.0%} of its residues are A, C, G, T, U or N: nucleotides, scored "
                f"as amino acids by {self.name}? (a nucleotide matrix: --matrix NUC.4.4)")

    def with_unknown_as(self, letter: str) -> SubstitutionMatrix:
        """A copy that encodes every letter outside the alphabet as `letter`."""
        if len(letter) != 1 or letter.upper() not in self.alphabet.upper():
            raise MatrixError(
                f"--unknown-as {letter!r} must be one letter of the {self.name} alphabet {self.alphabet}"
            )
        code = self.table[ord(letter)]
        # Bytes past ASCII stay invalid: they stand for a non-ASCII character (fasta.NOT_ASCII), an error.
        table = bytes(code if c == INVALID and byte < 128 else c for byte, c in enumerate(self.table))
        return SubstitutionMatrix(self.name, self.alphabet, self.scores, table, letter)


def _matrix_lines(text: str) -> list[str]:
    """The lines as Biopython's reader has them from a file it opens: CR LF and a lone CR end a line as LF
    does (universal newlines), and nothing else does (str.splitlines also splits at a form feed, which
    str.split, the reader's, takes as whitespace inside a row)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def _line_number(before: str) -> int:
    """The line, counted as _matrix_lines does, of the character that follows `before`."""
    return before.replace("\r\n", "\n").replace("\r", "\n").count("\n") + 1


def _checked_matrix_text(path: Path, where: str) -> str:
    """The file's text, checked for the layout Biopython's reader expects, which it does not check itself
    (it takes a short row's missing scores as 0, a missing row as zeros, and ignores lines past the last
    row): '#' comment lines (any UTF-8 text), a header of one letter a column, then one row a letter, in
    the header's order, each its letter and a number a column, then only blank or '#' comment lines.
    Returned with LF line ends, so that the reader reads the lines checked here."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise MatrixError(f"{where}: cannot read ({exc.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = _line_number(data[:exc.start].decode("utf-8"))
        raise MatrixError(f"{where}: line {line}: not a text matrix file (byte {exc.start}, "
                          f"0x{data[exc.start]:02x}, is not UTF-8)") from None
    # Even in comments: a control character that str.split does not take as whitespace (\t-\r, \x1c-\x1f).
    control = re.search(r"[\x00-\x08\x0e-\x1b\x7f]", text)
    if control:
        before = text[:control.start()]
        raise MatrixError(f"{where}: line {_line_number(before)}: not a text matrix file (byte "
                          f"{len(before.encode())} is a control character, {control.group()!r})")
    lines = _matrix_lines(text)
    first = next((n for n, line in enumerate(lines) if not line.startswith("#")), len(lines))
    header = lines[first].split() if first < len(lines) else []
    hash_row = first + 1 + header.index("#") if "#" in header else None  # the row of a letter '#' is no comment

    def comment(n: int) -> bool:
        return lines[n].startswith("#") and n != hash_row

    end = len(lines)
    while end > first and (comment(end - 1) or not lines[end - 1].split()):  # blank and comment lines at the end
        end -= 1
    if end == first:
        raise MatrixError(f"{where}: no matrix in this file (a header of letters, then a row a letter)")
    for n in range(first, end):
        if not comment(n) and not lines[n].isascii():
            letter = next(c for c in lines[n] if not c.isascii())
            raise MatrixError(f"{where}: line {n + 1}: non-ASCII character {letter!r} (letters and scores are "
                              "ASCII; other text goes in '#' comment lines)")
    if not header or any(len(letter) != 1 for letter in header) or len(set(header)) != len(header):
        raise MatrixError(f"{where}: line {first + 1}: the header should be distinct letters, one a column, got "
                          f"{' '.join(header)[:60]!r}")
    for n in range(first + 1, end):
        if not lines[n].split():
            raise MatrixError(f"{where}: line {n + 1} is blank, inside the matrix")
        if comment(n):
            raise MatrixError(f"{where}: line {n + 1}: a '#' comment line inside the matrix (comments go before "
                              "the header or after the last row)")
    if end - first - 1 != len(header):
        raise MatrixError(f"{where}: {len(header)} letters in the header (line {first + 1}), but {end - first - 1} "
                          "rows")
    for n, letter in zip(range(first + 1, end), header):
        line, row = n + 1, lines[n].split()
        if row[0] != letter:
            raise MatrixError(f"{where}: line {line}: expected the row of {letter!r} (the header's order), got "
                              f"{' '.join(row)[:60]!r}")
        if len(row) != len(header) + 1:
            raise MatrixError(f"{where}: line {line}: row {letter!r} has {len(row) - 1} scores, expected "
                              f"{len(header)}")
        for column, word in zip(header, row[1:]):
            try:
                float(word)
            except ValueError:
                raise MatrixError(f"{where}: line {line}: the score of row {letter!r}, column {column!r} is "
                                  f"{word!r}, not a number") from None
    return "".join(line + "\n" for line in lines)


def _from_biopython(name: str, array, where: str | None = None) -> SubstitutionMatrix:
    """The matrix `name` from a Biopython array; errors name `where` (the file as given), else `name`."""
    where = where or name
    alphabet = array.alphabet
    if len(array.shape) != 2 or not isinstance(alphabet, str) or array.shape[0] != array.shape[1]:
        raise MatrixError(f"matrix {name} is not a square substitution matrix over one alphabet")
    if len(alphabet) >= INVALID:
        raise MatrixError(f"matrix {name} has {len(alphabet)} letters; at most {INVALID - 1} are supported")
    table = bytearray([INVALID]) * 256
    # Either case first, then the letters themselves, so a matrix that scores both cases keeps its own code
    # for each, and one in a single case (upper or lower) takes both.
    for code, letter in enumerate(alphabet):
        if ord(letter) < 128:
            table[ord(letter.lower())] = table[ord(letter.upper())] = code
    for code, letter in enumerate(alphabet):
        if ord(letter) < 128:
            table[ord(letter)] = code
    scores = tuple(tuple(float(array[a][b]) for b in range(len(alphabet))) for a in range(len(alphabet)))
    for a, row in enumerate(scores):
        for b, value in enumerate(row):
            if not _finite32(value):
                raise MatrixError(
                    f"{where}: the score of row {alphabet[a]}, column {alphabet[b]} is {value}: scores must "
                    "be finite numbers (of float32 range)"
                )
    return SubstitutionMatrix(name, alphabet, scores, bytes(table))


def load_matrix(spec: str) -> SubstitutionMatrix:
    """A matrix by Biopython name (case-insensitive, e.g. BLOSUM62) or from a matrix file."""
    from Bio.Align import substitution_matrices

    path = Path(spec)
    if path.is_file():
        text = _checked_matrix_text(path, spec)
        try:
            array = substitution_matrices.read(io.StringIO(text))  # the text checked, not the file read again
        except Exception as exc:  # Biopython raises assorted errors (even AssertionError) on bad files
            raise MatrixError(f"{spec}: cannot read a substitution matrix from this file ({exc!r})") from exc
        return _from_biopython(path.name, array, where=spec)
    names = available_matrices()
    by_upper = {n.upper(): n for n in names}
    if spec.upper() not in by_upper:
        raise MatrixError(
            f"unknown matrix {spec!r}: not a file, and not one of Biopython's: {', '.join(names)}"
        )
    name = by_upper[spec.upper()]
    return _from_biopython(name, substitution_matrices.load(name))
