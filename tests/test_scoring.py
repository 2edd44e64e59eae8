"""scoring.py: matrices by name or file, encoding (case, unknown letters), and the errors."""

import pytest
import torch
from Bio.Align import substitution_matrices

from swcli.errors import AlphabetError, MatrixError
from swcli.scoring import available_matrices, load_matrix


def test_names_are_case_insensitive_and_scores_match_biopython():
    matrix = load_matrix("blosum62")
    bio = substitution_matrices.load("BLOSUM62")
    assert matrix.name == "BLOSUM62" and matrix.alphabet == bio.alphabet
    table = matrix.tensor()
    assert table.dtype == torch.float32 and table.shape == (24, 24)
    for a in "ARNDW*":
        for b in "CQXY":
            assert matrix.score(a, b) == bio[a][b]
            assert table[matrix.alphabet.index(a), matrix.alphabet.index(b)] == bio[a][b]


@pytest.mark.parametrize("name", ["BLOSUM45", "BLOSUM80", "PAM250", "NUC.4.4"])
def test_other_matrices_load(name):
    assert load_matrix(name).tensor().shape[0] == len(substitution_matrices.load(name).alphabet)


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(MatrixError, match="unknown matrix 'BLOSUM99'.*BLOSUM62") as info:
        load_matrix("BLOSUM99")
    assert all(name in str(info.value) for name in available_matrices())


def test_matrix_file(tmp_path):
    path = tmp_path / "tiny.mat"
    path.write_text("   A  C\nA  2 -1\nC -1  3\n")
    matrix = load_matrix(str(path))
    assert matrix.alphabet == "AC" and matrix.score("C", "C") == 3 and matrix.score("A", "C") == -1


@pytest.mark.parametrize("text, message", [
    ("this is not a matrix\n1 2 3\n", "line 1: the header should be distinct letters, one a column, got 'this is"),
    ("# only a comment\n\n", "no matrix in this file"),
    ("", "no matrix in this file"),
    ("   A  C  G\nA  1 -1 -1 0\nC -1  1 -1 0\n", "3 letters in the header (line 1), but 2 rows"),
    ("   A  C\nA  2 -1\nC -1\n", "line 3: row 'C' has 1 scores, expected 2"),
    ("   A  C\nC -1 3\nA  2 -1\n", "line 2: expected the row of 'A' (the header's order), got 'C -1 3'"),
    ("   A  A\nA  2 -1\nA -1  3\n", "line 1: the header should be distinct letters"),
    ("   A  C\nA  2 x\nC -1  3\n", "line 2: the score of row 'A', column 'C' is 'x', not a number"),
    ("   A  C\n\nA  2 -1\nC -1  3\n", "line 2 is blank, inside the matrix"),
    ("\x00\x01\x02", "line 1: not a text matrix file (byte 0 is a control character, '\\x00')"),
    ("# é\n   A  C\nA  2\x1b-1\nC -1  3\n", "line 3: not a text matrix file (byte 17 is a control character, "
                                         "'\\x1b')"),
    ("   A  C\nA  2 -1\n# a comment\nC -1  3\n", "line 3: a '#' comment line inside the matrix"),
    ("   A  C  G\nA 2 -1 0\nC -1 3 0\n# the end\n", "3 letters in the header (line 1), but 2 rows"),
    ("   A  C\nA  2 -1\nC -1  3\nG  1  1\n# the end\n", "2 letters in the header (line 1), but 3 rows"),
    ("   A  C\nA  2 -1\nC -1  \u0663\n", "line 3: non-ASCII character '\u0663' (letters and scores are ASCII"),
    ("   A  C\nA  2\u00a0-1\nC -1  3\n", "line 2: non-ASCII character '\\xa0'"),
])
def test_malformed_matrix_files_are_refused_saying_where(tmp_path, text, message):
    path = tmp_path / "bad.mat"
    path.write_bytes(text.encode())
    with pytest.raises(MatrixError) as info:
        load_matrix(str(path))
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value), info.value
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text", [
    "# by Zoë Müller, © 2024: UTF-8 in comments\n   A  C\nA  2 -1\nC -1  3\n",
    "   A  C\nA  2 -1\nC -1  3\n# a comment after the rows\n\n# and another, ©\n",
    "   A  C\nA  2\f-1\nC -1\v  3\n",  # a form feed or vertical tab is whitespace inside a row, no line end
    "   A  C\rA  2 -1\rC -1  3\r",  # lone CRs end lines, as in a file Biopython opens
    "   A  #\nA  2 -1\n# -1  3\n",  # the row of the letter '#', in its place, is no comment
])
def test_matrix_files_biopython_reads_load_with_its_scores(tmp_path, text):
    path = tmp_path / "ok.mat"
    path.write_bytes(text.encode())
    bio = substitution_matrices.read(str(path))
    matrix = load_matrix(str(path))
    assert matrix.alphabet == bio.alphabet
    assert matrix.scores == tuple(tuple(float(bio[a][b]) for b in bio.alphabet) for a in bio.alphabet)


def test_a_matrix_file_not_in_utf8_is_refused_naming_the_byte_and_line(tmp_path):
    path = tmp_path / "latin1.mat"
    path.write_bytes("# by Zoë\n   A  C\nA  2 -1\nC -1  3\n".encode("latin-1"))
    with pytest.raises(MatrixError) as info:
        load_matrix(str(path))
    assert str(info.value) == f"{path}: line 1: not a text matrix file (byte 7, 0xeb, is not UTF-8)"


def test_matrix_files_in_lower_case_take_both_cases(tmp_path):
    path = tmp_path / "lower.mat"
    path.write_text("# a DNA matrix in lower case\n   a  c\na  2 -1\nc -1  3\n")
    matrix = load_matrix(str(path))
    assert matrix.encode("ACac", lambda: "x") == matrix.encode("acac", lambda: "x") == bytes([0, 1, 0, 1])


def test_biopythons_own_matrix_files_load_as_their_names():
    import os

    folder = os.path.join(os.path.dirname(substitution_matrices.__file__), "data")
    for name in available_matrices():
        try:
            by_name = load_matrix(name)
        except MatrixError:  # SCHNEIDER, a codon matrix, is refused for its shape
            continue
        by_file = load_matrix(os.path.join(folder, name))
        assert by_file.alphabet == by_name.alphabet and by_file.scores == by_name.scores, name


def test_encoding_is_case_insensitive():
    matrix = load_matrix("BLOSUM62")
    upper = matrix.encode("MKVWY*", str)
    assert matrix.encode("mkvwy*", str) == upper
    assert list(upper) == [matrix.alphabet.index(a) for a in "MKVWY*"]


@pytest.mark.parametrize("sequence, letter, position", [("MKJV", "J", 3), ("Jabc", "J", 1), ("MK-V", "-", 3)])
def test_invalid_letter_names_record_position_and_letter(sequence, letter, position):
    matrix = load_matrix("BLOSUM62")
    with pytest.raises(AlphabetError, match=rf"q.fa: record 7 \(p\): invalid letter '{letter}' at position "
                                            rf"{position} .*BLOSUM62.*--unknown-as"):
        matrix.encode(sequence, lambda: "q.fa: record 7 (p)")


def test_unknown_as_maps_every_unknown_letter():
    matrix = load_matrix("BLOSUM62").with_unknown_as("X")
    x = matrix.alphabet.index("X")
    assert list(matrix.encode("AJ-O", str)) == [matrix.alphabet.index("A"), x, x, x]
    lower = load_matrix("BLOSUM62").with_unknown_as("x")
    assert list(lower.encode("J", str)) == [x]


def test_unknown_as_must_be_in_the_alphabet():
    with pytest.raises(MatrixError, match="--unknown-as 'J' must be one letter"):
        load_matrix("BLOSUM62").with_unknown_as("J")
    with pytest.raises(MatrixError, match="must be one letter"):
        load_matrix("BLOSUM62").with_unknown_as("XX")


@pytest.mark.parametrize("entry, row, column", [("nan", "A", "C"), ("inf", "C", "A"), ("-inf", "C", "C"),
                                               ("1e39", "A", "A")])
def test_non_finite_matrix_file_entries_are_refused(tmp_path, entry, row, column):
    cells = {("A", "A"): "2", ("A", "C"): "-1", ("C", "A"): "-1", ("C", "C"): "3", (row, column): entry}
    path = tmp_path / "bad.mat"
    path.write_text("   A  C\n" + "".join(f"{a} {cells[a, 'A']} {cells[a, 'C']}\n" for a in "AC"))
    with pytest.raises(MatrixError) as info:
        load_matrix(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}: the score of row {row}, column {column} is ")
    assert "finite" in message and "\n" not in message


def test_every_named_matrix_passes_the_finite_check():
    for name in available_matrices():
        try:
            load_matrix(name)
        except MatrixError as exc:  # SCHNEIDER, a codon matrix, is refused for its shape
            assert "finite" not in str(exc), exc


@pytest.mark.parametrize("check, good, bad", [
    ("check_temperature", [0.0, 1.0, 1e30], [float("inf"), float("nan"), -1.0, 1e39]),
    ("check_gap", [0.0, -4.0, -1e30], [float("-inf"), float("nan"), 4.0, -1e39]),
])
def test_option_checks_refuse_non_finite_values_as_usage_errors(check, good, bad):
    import typer

    from swcli import scoring

    function = getattr(scoring, check)
    option = "--temperature" if check == "check_temperature" else "--gap"
    for value in good:
        assert function(value) == value
    for value in bad:
        with pytest.raises(typer.BadParameter) as info:
            function(value)
        assert info.value.format_message().startswith(f"Invalid value for '{option}': {value} is not a finite")


def test_gaps_from_the_options():
    from swcli.scoring import BLAST_GAP_COSTS, Gaps, resolve_gaps

    assert resolve_gaps(None, None, None, "BLOSUM62") == Gaps(-4.0)
    assert resolve_gaps(-2.0, None, None, None) == Gaps(-2.0)
    assert resolve_gaps(None, -12.0, -1.0, None) == Gaps(None, -12.0, -1.0)
    assert resolve_gaps(None, -5.0, -5.0, None) == Gaps(-5.0)  # equal scores: the linear gap
    # one of the pair alone: blastp's default costs G/E for the matrix, G kept on top of a given extension
    for name, (existence, extension) in BLAST_GAP_COSTS.items():
        assert resolve_gaps(None, -30.0, None, name) == Gaps(None, -30.0, -float(extension))
        assert resolve_gaps(None, None, -3.0, name.lower()) == Gaps(None, -3.0 - existence, -3.0)
    assert resolve_gaps(None, None, -1.0, "BLOSUM62") == Gaps(None, -12.0, -1.0)  # BLAST's 11/1
    assert Gaps(None, -12.0, -1.0).describe() == "affine gaps: open -12, extend -1"
    assert Gaps(-4.0).describe() == "linear gap -4"


def test_blast_defaults_only_for_blast_s_own_matrices():
    """The default gap costs are BLAST's for its matrices: Biopython's matrix of each name must be BLAST's
    (NCBI's A/A and W/W scores; its BLOSUM80 is 1/2-bit, 5 and 11, where Biopython's is 1/3-bit)."""
    from swcli.scoring import BLAST_GAP_COSTS

    ncbi = {"BLOSUM45": (5, 15), "BLOSUM50": (5, 15), "BLOSUM62": (4, 11), "BLOSUM90": (5, 11), "PAM30": (6, 13),
            "PAM70": (5, 13), "PAM250": (2, 17)}
    assert set(BLAST_GAP_COSTS) == set(ncbi)
    for name, (aa, ww) in ncbi.items():
        matrix = load_matrix(name)
        assert (matrix.score("A", "A"), matrix.score("W", "W")) == (aa, ww), name
    biopython_80 = load_matrix("BLOSUM80")
    assert (biopython_80.score("A", "A"), biopython_80.score("W", "W")) == (7, 16)


@pytest.mark.parametrize("gap, gap_open, gap_extend, matrix, message", [
    (-4.0, -12.0, None, "BLOSUM62", "--gap and --gap-open exclude each other"),
    (None, 0.5, -1.0, "BLOSUM62", "Invalid value for '--gap-open': 0.5 is not a finite gap score <= 0"),
    (None, -12.0, float("inf"), "BLOSUM62", "Invalid value for '--gap-extend': inf is not a finite gap score"),
    (None, -1.0, -2.0, "BLOSUM62", "-1.0 is not <= --gap-extend -2"),
    (None, -12.0, None, "NUC.4.4", "matrix NUC.4.4 has no BLAST default gap costs"),
    (None, None, -1.0, None, "a matrix file has no BLAST default gap costs"),
    (None, -11.0, None, "BLOSUM80", "matrix BLOSUM80 has no BLAST default gap costs"),  # not BLAST's scale
])
def test_bad_gap_options_are_usage_errors(gap, gap_open, gap_extend, matrix, message):
    import typer

    from swcli.scoring import check_gap_options, resolve_gaps

    usage_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
    with pytest.raises(usage_error) as info:
        check_gap_options(gap, gap_open, gap_extend)
        resolve_gaps(gap, gap_open, gap_extend, matrix)
    assert message in info.value.format_message()


def test_a_non_ascii_character_gets_no_unknown_as_hint():
    # --unknown-as maps letters the matrix lacks; a non-ASCII character is refused whatever it is given
    matrix = load_matrix("BLOSUM62")
    with pytest.raises(AlphabetError, match=r"invalid letter 'Ä' at position 3 \(not in the BLOSUM62 alphabet "
                                            r"ARNDCQEGHILKMFPSTWYVBZX\*; only ASCII letters are taken\)$"):
        matrix.encode("ACÄD", lambda: "x.fa: record 1 (a)")
    with pytest.raises(AlphabetError, match=r"'é' at position 3 .*only ASCII letters are taken"):
        matrix.encode("MKé", lambda: "x.fa: record 1 (a)")
    with pytest.raises(AlphabetError, match=r"only ASCII letters are taken"):
        matrix.with_unknown_as("X").encode("ACÄD", lambda: "x.fa: record 1 (a)")
    with pytest.raises(AlphabetError, match=r"use --unknown-as X to score unknown letters as X\)$"):
        matrix.encode("ACJD", lambda: "x.fa: record 1 (a)")


@pytest.mark.parametrize("matrix, sequence, warned", [
    ("BLOSUM62", "ACGT" * 10, "100%"),
    ("BLOSUM62", "acgtn" * 9 + "MKW" + "acgtn", "94%"),  # lower case counts
    ("BLOSUM62", "ACGT" * 8 + "MKVLW", None),  # 86%: below the 90% rule
    ("BLOSUM62", "ACGTACGTACGTACGTACG", None),  # 19 residues: too few to tell
    ("PAM250", "GATTACA" * 5, "100%"),
    ("NUC.4.4", "ACGT" * 10, None),  # a nucleotide matrix
    ("BLOSUM62", "MKVLAWYPGHECDNQRSTIF" * 3, None),
])
def test_nucleotides_under_a_protein_matrix_are_warned_of(matrix, sequence, warned):
    scoring = load_matrix(matrix)
    said = scoring.nucleotide_warning(scoring.encode(sequence, lambda: "q"), "q.fa")
    if warned is None:
        assert said is None
    else:
        assert said == (f"q.fa: {warned} of its residues are A, C, G, T, U or N: nucleotides, scored as amino "
                        f"acids by {scoring.name}? (a nucleotide matrix: --matrix NUC.4.4)")
