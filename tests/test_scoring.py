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


def test_unreadable_matrix_file(tmp_path):
    path = tmp_path / "junk.mat"
    path.write_text("this is not a matrix\n1 2 3\n")
    with pytest.raises(MatrixError, match="junk.mat: cannot read a substitution matrix"):
        load_matrix(str(path))


def test_encoding_is_case_insensitive():
    matrix = load_matrix("BLOSUM62")
    upper = matrix.encode("MKVWY*", str)
    assert matrix.encode("mkvwy*", str) == upper
    assert list(upper) == [matrix.alphabet.index(a) for a in "MKVWY*"]


@pytest.mark.parametrize("sequence, letter, position", [("MKJV", "J", 3), ("Jabc", "J", 1), ("MK-V", "-", 3),
                                                        ("MKé", "é", 3)])
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
