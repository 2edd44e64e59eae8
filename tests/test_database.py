"""The search database (swcli/database.py): flat codes in length order, the prepared folder, its errors."""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from swcli import database
from swcli.errors import AlphabetError, DatabaseError
from swcli.fasta import FastaRecord
from swcli.scoring import load_matrix
from swcli.testing import random_protein, subprocess_env

BLOSUM62 = load_matrix("BLOSUM62")


def records(count: int, seed: int, max_length: int = 60):
    rng = random.Random(seed)
    return [FastaRecord("db.fa", k + 1, f"s{k}", random_protein(rng, rng.randint(1, max_length)))
            for k in range(count)]


def test_build_orders_longest_first_and_keeps_every_sequence():
    recs = records(200, seed=1)
    db = database.build(recs, BLOSUM62, "db.fa")
    assert len(db) == 200 and db.ids == [r.id for r in recs]
    lengths = db.lengths
    assert np.all(lengths[:-1] >= lengths[1:])
    for k in range(len(db)):
        record = recs[db.index[k]]
        assert bytes(db.codes[db.offsets[k]:db.offsets[k + 1]]) == BLOSUM62.encode(record.sequence, record.where)
    # equal lengths keep database order
    for k in range(len(db) - 1):
        if lengths[k] == lengths[k + 1]:
            assert db.index[k] < db.index[k + 1]


def test_padded_blocks_hold_the_codes_and_zeros():
    recs = records(50, seed=2)
    db = database.build(recs, BLOSUM62, "db.fa")
    block, lengths = db.padded(10, 27)
    assert block.dtype == np.uint8 and block.shape == (17, lengths.max())
    for row, k in enumerate(range(10, 27)):
        assert bytes(block[row, :lengths[row]]) == bytes(db.codes[db.offsets[k]:db.offsets[k + 1]])
        assert not block[row, lengths[row]:].any()
    empty, none = db.padded(5, 5)
    assert empty.shape == (0, 0) and none.shape == (0,)


def test_bad_letter_names_the_record():
    bad = [FastaRecord("db.fa", 1, "a", "ACD"), FastaRecord("db.fa", 2, "b", "AC1D")]
    with pytest.raises(AlphabetError, match=r"db.fa: record 2 \(b\): invalid letter '1' at position 3"):
        database.build(bad, BLOSUM62, "db.fa")


def test_save_and_load_round_trip(tmp_path):
    db = database.build(records(120, seed=3), BLOSUM62, "db.fa")
    folder = tmp_path / "db"
    database.save(db, folder)
    assert database.is_prepared(folder) and not database.is_prepared(tmp_path)
    assert not [p for p in tmp_path.iterdir() if p.name != "db"]  # no staging folder left
    again = database.load(folder)
    assert isinstance(again.codes, np.memmap)
    assert np.array_equal(again.codes, db.codes) and np.array_equal(again.offsets, db.offsets)
    assert np.array_equal(again.index, db.index) and again.ids == db.ids and again.alphabet == db.alphabet


def test_empty_database_round_trips(tmp_path):
    db = database.build([], BLOSUM62, "empty.fa")
    database.save(db, tmp_path / "db")
    again = database.load(tmp_path / "db")
    assert len(again) == 0 and again.residues == 0


def test_save_refuses_an_existing_path(tmp_path):
    db = database.build(records(3, seed=4), BLOSUM62, "db.fa")
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "keep").write_text("mine")
    with pytest.raises(DatabaseError, match="already exists"):
        database.save(db, tmp_path / "db")
    assert (tmp_path / "db" / "keep").read_text() == "mine"


def test_save_into_a_missing_folder_is_an_error(tmp_path, monkeypatch):
    db = database.build(records(3, seed=4), BLOSUM62, "db.fa")
    with pytest.raises(DatabaseError, match="does not exist"):
        database.save(db, tmp_path / "no" / "db")
    monkeypatch.chdir(tmp_path)  # `no/..` is no folder while `no` is missing, whatever resolve() says
    with pytest.raises(DatabaseError, match=r"^no/\.\./db: no/\.\. does not exist$"):
        database.check_new_folder("no/../db")


def test_a_folder_made_while_makedb_writes_is_kept(tmp_path, monkeypatch):
    """rename() would replace an empty folder made meanwhile at the path: it is refused instead."""
    write_array = database._write_array

    def and_make_the_folder(path, array, dtype):
        (tmp_path / "db").mkdir(exist_ok=True)
        return write_array(path, array, dtype)

    monkeypatch.setattr(database, "_write_array", and_make_the_folder)
    with pytest.raises(DatabaseError, match=r"db: made while makedb ran; makedb writes a new folder and replaces"):
        database.save(database.build(records(3, seed=4), BLOSUM62, "db.fa"), tmp_path / "db")
    assert [p.name for p in tmp_path.iterdir()] == ["db"] and not list((tmp_path / "db").iterdir())


def test_the_folder_being_written_is_removed_on_a_signal(tmp_path, monkeypatch):
    """interrupt.exit_now (Ctrl-C, SIGTERM) removes what it was told of: here the folder makedb writes."""
    from swcli import interrupt

    seen = []

    def write_array(path, array, dtype):
        seen.append((path.parent, str(path.parent) in interrupt._temporaries))
        raise KeyboardInterrupt  # stands for the signal, which would end the process here

    monkeypatch.setattr(database, "_write_array", write_array)
    with pytest.raises(KeyboardInterrupt):
        database.save(database.build(records(3, seed=4), BLOSUM62, "db.fa"), tmp_path / "db")
    staging, registered = seen[0]
    assert registered and staging.name.startswith(".db.swcli-") and staging.name.endswith(f"-{os.getpid()}.part")
    assert list(tmp_path.iterdir()) == [] and str(staging) not in interrupt._temporaries
    # exit_now itself, in a child: a registered folder with files in it is gone, the status 130
    (tmp_path / "part").mkdir()
    (tmp_path / "part" / "codes.u8").write_bytes(b"x")
    child = subprocess.run([sys.executable, "-c", "import sys; from swcli import interrupt; "
                            "interrupt.register_temporary(sys.argv[1]); interrupt.exit_now()", str(tmp_path / "part")],
                           capture_output=True, text=True, timeout=60, env=subprocess_env())
    assert child.returncode == 130 and not (tmp_path / "part").exists()


def test_a_folder_left_by_a_dead_process_of_this_pid_is_replaced(tmp_path):
    """The same pid again (a container restarted with the same host name): its folder is a dead one's."""
    from swcli.output import temporary_name

    left = tmp_path / temporary_name("db")
    left.mkdir()
    (left / "codes.u8").write_bytes(b"x")
    database.save(database.build(records(3, seed=4), BLOSUM62, "db.fa"), tmp_path / "db")
    assert [p.name for p in tmp_path.iterdir()] == ["db"] and len(database.load(tmp_path / "db")) == 3


def test_a_folder_this_process_is_writing_is_refused_a_second_time(tmp_path, monkeypatch):
    write_array, said = database._write_array, []

    def and_save_again(path, array, dtype):
        if not said:
            with pytest.raises(DatabaseError) as refused:
                database.save(database.build(records(2, seed=5), BLOSUM62, "other.fa"), tmp_path / "db")
            said.append(str(refused.value))
        return write_array(path, array, dtype)

    monkeypatch.setattr(database, "_write_array", and_save_again)
    database.save(database.build(records(3, seed=4), BLOSUM62, "db.fa"), tmp_path / "db")
    assert said == [f"{tmp_path / 'db'}: this process is writing it already"]
    assert [p.name for p in tmp_path.iterdir()] == ["db"] and len(database.load(tmp_path / "db")) == 3


def test_a_long_name_in_several_bytes_a_letter_fits_its_temporary_name(tmp_path):
    name = "é" * 127  # 254 bytes: a name the file system takes, and its temporary one must fit 255 too
    database.save(database.build(records(3, seed=4), BLOSUM62, "db.fa"), tmp_path / name)
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_the_folders_of_a_dead_makedb_are_removed_by_the_next(tmp_path):
    from swcli.output import temporary_name

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()  # a pid no process has now
    left = tmp_path / temporary_name("db", int(dead))
    alive = tmp_path / temporary_name("db", os.getppid())  # a makedb of the same name still writing
    for folder in (left, alive):
        folder.mkdir()
        (folder / "codes.u8").write_bytes(b"x")
    database.save(database.build(records(3, seed=4), BLOSUM62, "db.fa"), tmp_path / "db")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["db", alive.name])


def _edit_bytes(path, at: int, value: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] = value
    path.write_bytes(bytes(data))


def _edit_meta(folder, **changes) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    for key, value in changes.items():
        if value is None:
            del meta[key]
        else:
            meta[key] = value
    (folder / "meta.json").write_text(json.dumps(meta))


def _edit_offsets(folder, k: int, take_from: int) -> None:
    """offsets[k] set to offsets[take_from]."""
    offsets = np.fromfile(folder / "offsets.i64", dtype="<i8")
    offsets[k] = offsets[take_from]
    offsets.tofile(folder / "offsets.i64")


def _edit_index(folder, k: int, take_from: int) -> None:
    index = np.fromfile(folder / "index.i64", dtype="<i8")
    index[k] = index[take_from]
    index.tofile(folder / "index.i64")


@pytest.mark.parametrize("damage, message", [
    (lambda f: (f / "codes.u8").unlink(), r"missing codes\.u8"),
    (lambda f: (f / "codes.u8").write_bytes(b"\x00"), r"codes\.u8: 1 bytes, expected"),
    (lambda f: (f / "meta.json").write_text("{"), r"meta\.json: unreadable"),
    (lambda f: (f / "meta.json").write_text('{"format": "other"}'), r"format 'other'"),
    (lambda f: (f / "ids.txt").write_text("a\n"), r"ids\.txt: 1 lines, but meta\.json counts 5 sequences"),
    (lambda f: (f / "meta.json").write_text('{"a": ' + "[" * 100000 + "]" * 100000 + "}"), r"meta\.json: unreadable"),
    (lambda f: _edit_bytes(f / "codes.u8", 3, 255), r"codes\.u8: byte 3 is code 255, past the 24 letters"),
    (lambda f: _edit_meta(f, sequences=None), r"meta\.json: sequences None, residues \d+"),
    (lambda f: _edit_meta(f, sequences="abc"), r"meta\.json: sequences 'abc'"),
    (lambda f: _edit_meta(f, sequences=-1), r"meta\.json: sequences -1"),
    (lambda f: _edit_meta(f, alphabet=""), r"meta\.json: .* alphabet ''"),
    (lambda f: (f / "ids.txt").write_bytes((f / "ids.txt").read_bytes() + b"\xff"),
     r"ids\.txt: line 6 \(the id of record 6\) is not UTF-8 \(byte 0xff at offset 15\)"),
    (lambda f: (f / "ids.txt").write_text("s0\n\ns2\ns3\ns4\n"), r"ids\.txt: line 2 is empty"),
    (lambda f: _edit_offsets(f, 1, 0), r"offsets\.i64: not the bounds of 5 sequences"),  # the first one emptied
    (lambda f: _edit_offsets(f, 3, 1), r"offsets\.i64: not the bounds of 5 sequences"),  # out of the length order
    (lambda f: _edit_index(f, 0, 1), r"index\.i64: not an order of the 5 sequences"),
])
def test_damaged_folders_are_refused(tmp_path, damage, message):
    database.save(database.build(records(5, seed=5), BLOSUM62, "db.fa"), tmp_path / "db")
    damage(tmp_path / "db")
    with pytest.raises(DatabaseError, match=message):
        database.load(tmp_path / "db")


def _swap_index(folder) -> None:
    """Two sequences' database order swapped: still an order of the sequences."""
    index = np.fromfile(folder / "index.i64", dtype="<i8")
    index[[0, 1]] = index[[1, 0]]
    index.tofile(folder / "index.i64")


@pytest.mark.parametrize("damage, message", [
    # each change keeps every file well-formed: only the CRC-32 that makedb kept sees it
    (lambda f: _edit_bytes(f / "codes.u8", 3, (f / "codes.u8").read_bytes()[3] ^ 1), r"codes\.u8: changed since makedb"),
    (lambda f: (f / "ids.txt").write_text("s0\ns1\nsX\ns3\ns4\n"), r"ids\.txt: changed since makedb"),
    (_swap_index, r"index\.i64: changed since makedb wrote it \(CRC-32 [0-9a-f]{8}, meta\.json keeps [0-9a-f]{8}\)"),
    (lambda f: _edit_meta(f, crc32={"codes.u8": 1}), r"meta\.json: its crc32 is not a CRC-32 for each of codes\.u8, "
                                                     r"offsets\.i64, index\.i64, ids\.txt; prepare it again"),
    (lambda f: _edit_meta(f, crc32="abc"), r"meta\.json: its crc32 is not a CRC-32"),
    (lambda f: _edit_meta(f, crc32={"codes.u8": True, "offsets.i64": 0, "index.i64": 0, "ids.txt": 0}),
     r"meta\.json: its crc32 is not a CRC-32"),
])
def test_a_change_inside_the_alphabet_is_refused_by_the_kept_crc32(tmp_path, damage, message):
    database.save(database.build(records(5, seed=5), BLOSUM62, "db.fa"), tmp_path / "db")
    database.load(tmp_path / "db")  # as made
    damage(tmp_path / "db")
    with pytest.raises(DatabaseError, match=message):
        database.load(tmp_path / "db")


def test_a_folder_without_its_crc32_is_refused(tmp_path):
    """One damaged key must not turn the checksums off: a changed code then goes unseen."""
    database.save(database.build(records(4, seed=9), BLOSUM62, "db.fa"), tmp_path / "db")
    _edit_meta(tmp_path / "db", crc32=None)
    with pytest.raises(DatabaseError, match=r"meta\.json: its crc32 is not a CRC-32 for each of"):
        database.load(tmp_path / "db")


def test_a_folder_of_the_first_format_is_made_again(tmp_path):
    database.save(database.build(records(4, seed=9), BLOSUM62, "db.fa"), tmp_path / "db")
    _edit_meta(tmp_path / "db", format="swcli-database-1", unknown_as=None)
    with pytest.raises(DatabaseError, match=r"format 'swcli-database-1', expected 'swcli-database-2'; prepare it "
                                            r"again with swcli makedb$"):
        database.load(tmp_path / "db")


def test_alphabet_of_another_matrix_is_refused():
    db = database.build(records(3, seed=6), BLOSUM62, "db.fa")
    db.check_alphabet(load_matrix("BLOSUM45"))  # the same alphabet
    with pytest.raises(DatabaseError, match=r"\(the matrix BLOSUM62\), but the matrix NUC\.4\.4 has .*; search it "
                                            r"with --matrix BLOSUM62, or prepare it again"):
        db.check_alphabet(load_matrix("NUC.4.4"))


def test_the_matrix_and_unknown_as_are_kept_with_the_folder(tmp_path):
    database.save(database.build(records(3, seed=7), BLOSUM62, "db.fa"), tmp_path / "db")
    database.save(database.build(records(3, seed=7), BLOSUM62.with_unknown_as("X"), "db.fa"), tmp_path / "x")
    plain, with_x = database.load(tmp_path / "db"), database.load(tmp_path / "x")
    assert (plain.matrix, plain.unknown_as, with_x.matrix, with_x.unknown_as) == ("BLOSUM62", None, "BLOSUM62", "X")


@pytest.mark.parametrize("changes, message", [
    ({"matrix": None}, r"meta\.json: matrix None, unknown_as None: not a matrix's name and a letter or null"),
    ({"matrix": ""}, r"meta\.json: matrix '', unknown_as None"),
    ({"unknown_as": None}, r"meta\.json: matrix 'BLOSUM62', unknown_as '': not"),
    ({"unknown_as": "XX"}, r"meta\.json: matrix 'BLOSUM62', unknown_as 'XX': not"),
])
def test_a_folder_without_its_matrix_or_unknown_as_is_refused(tmp_path, changes, message):
    database.save(database.build(records(3, seed=7), BLOSUM62, "db.fa"), tmp_path / "db")
    _edit_meta(tmp_path / "db", **changes)
    with pytest.raises(DatabaseError, match=message):
        database.load(tmp_path / "db")


def test_a_search_with_another_unknown_as_is_refused():
    """The folder's codes for letters the matrix lacks are its --unknown-as: another one would score the
    queries and the sequences by different rules."""
    plain = database.build(records(3, seed=7), BLOSUM62, "db")
    with_x = database.build(records(3, seed=7), BLOSUM62.with_unknown_as("X"), "xdb")
    plain.check_unknown_as(BLOSUM62)
    plain.check_unknown_as(BLOSUM62.with_unknown_as("X"))  # it holds no letter the matrix lacks
    with_x.check_unknown_as(BLOSUM62.with_unknown_as("X"))
    with_x.check_unknown_as(BLOSUM62.with_unknown_as("x"))  # the same code
    with pytest.raises(DatabaseError, match=r"^xdb: prepared with --unknown-as X, but this search has "
                                            r"--unknown-as '\*'; search it with --unknown-as X, or prepare it again "
                                            r"as this search encodes$"):
        with_x.check_unknown_as(BLOSUM62.with_unknown_as("*"))
    with pytest.raises(DatabaseError, match=r"^xdb: prepared with --unknown-as X, but this search has no "
                                            r"--unknown-as; search it with --unknown-as X"):
        with_x.check_unknown_as(BLOSUM62)


def test_ids_in_another_encoding_are_refused_with_the_line_byte_and_the_fix(tmp_path):
    """Folders made under a latin-1 locale hold latin-1 ids: refused (never decoded by a guess), and the
    message names the line and the byte and says that makedb, which writes UTF-8, rebuilds it."""
    recs = [FastaRecord("db.fa", 1, "s0", "ACD"), FastaRecord("db.fa", 2, "café", "KLM"),
            FastaRecord("db.fa", 3, "s2", "W")]
    database.save(database.build(recs, BLOSUM62, "db.fa"), tmp_path / "db")
    (tmp_path / "db" / "ids.txt").write_bytes("s0\ncafé\ns2\n".encode("latin-1"))
    with pytest.raises(DatabaseError) as refused:
        database.load(tmp_path / "db")
    message = str(refused.value)
    assert message == (f"{tmp_path / 'db'}/ids.txt: line 2 (the id of record 2) is not UTF-8 (byte 0xe9 at offset 6): "
                       "a damaged file, or ids in a locale's encoding from an older swcli; rebuild the folder with "
                       "swcli makedb, which writes UTF-8")


def _matrix_file(path) -> str:
    """BLOSUM62 written as a matrix file (the same alphabet and scores)."""
    from Bio.Align import substitution_matrices

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(substitution_matrices.load("BLOSUM62")))
    return str(path)


def test_a_matrix_file_is_named_by_its_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _matrix_file(tmp_path / "m" / "b62.mat")
    assert database.matrix_reference("m/b62.mat", load_matrix("m/b62.mat")) == str(tmp_path / "m" / "b62.mat")
    assert database.matrix_reference("blosum62", BLOSUM62) == "BLOSUM62"


def test_the_hint_for_a_matrix_file_is_a_path_that_loads_or_none(tmp_path, monkeypatch):
    path = _matrix_file(tmp_path / "my matrices" / "b62.mat")
    db = replace(database.build(records(3, seed=8), load_matrix(path), "db.fa"), matrix=path)  # as makedb names it
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatabaseError, match=f"search it with --matrix '{tmp_path}/my matrices/b62.mat', or "):
        db.check_alphabet(load_matrix("NUC.4.4"))
    (tmp_path / "my matrices" / "b62.mat").unlink()
    with pytest.raises(DatabaseError) as refused:
        db.check_alphabet(load_matrix("NUC.4.4"))
    assert f"(the matrix {path}, not found here with that alphabet)" in str(refused.value)
    assert "search it with" not in str(refused.value)


def test_a_matrix_file_named_alone_gets_a_hint_only_beside_it(tmp_path, monkeypatch):
    """A matrix file known by its name without its folder: --matrix NAME loads it only from there."""
    _matrix_file(tmp_path / "m" / "b62.mat")
    db = replace(database.build(records(3, seed=9), BLOSUM62, "db.fa"), matrix="b62.mat")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatabaseError) as refused:
        db.check_alphabet(load_matrix("NUC.4.4"))
    assert "(the matrix b62.mat, not found here with that alphabet)" in str(refused.value)
    assert "--matrix b62.mat" not in str(refused.value)
    monkeypatch.chdir(tmp_path / "m")
    with pytest.raises(DatabaseError, match=r"search it with --matrix b62\.mat, or "):
        db.check_alphabet(load_matrix("NUC.4.4"))


def test_the_makedb_hint_names_the_search_matrix_only_where_it_loads(tmp_path, monkeypatch):
    """The search's matrix file is known by its name alone: a makedb hint with it is given only beside it."""
    from Bio.Align import substitution_matrices

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "nuc.mat").write_text(str(substitution_matrices.load("NUC.4.4")))
    db = database.build(records(3, seed=10), BLOSUM62, "db.fa")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatabaseError, match=r"again with this matrix \(swcli makedb with the same --matrix\)"):
        db.check_alphabet(load_matrix("m/nuc.mat"))
    monkeypatch.chdir(tmp_path / "m")
    with pytest.raises(DatabaseError, match=r"\(swcli makedb --matrix nuc\.mat\)"):
        db.check_alphabet(load_matrix("nuc.mat"))


def test_unreadable_files_and_folders_are_one_line_errors(tmp_path, monkeypatch):
    """Permission denied (simulated: the tests may run as root) on a file of the folder or on the folder."""
    database.save(database.build(records(3, seed=9), BLOSUM62, "db.fa"), tmp_path / "db")
    read_bytes, is_file = Path.read_bytes, Path.is_file

    def denied_ids(self):
        if self.name == "ids.txt":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", denied_ids)
    with pytest.raises(DatabaseError, match=rf"^{tmp_path}/db/ids\.txt: cannot read \(Permission denied\)$"):
        database.load(tmp_path / "db")

    def denied_folder(self):
        if self.parent.name == "db":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return is_file(self)

    monkeypatch.setattr(Path, "is_file", denied_folder)
    with pytest.raises(DatabaseError, match=rf"^{tmp_path}/db: cannot read \(Permission denied\)$"):
        database.is_prepared(tmp_path / "db")


def test_a_full_disk_is_named_and_leaves_nothing(tmp_path, monkeypatch):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    with pytest.raises(OSError) as full:
        database._write_array(Path("/dev/full"), np.arange(1000), "<i8")
    assert full.value.errno == errno.ENOSPC

    def write_array(path, array, dtype):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(database, "_write_array", write_array)
    with pytest.raises(DatabaseError, match=r"db: cannot write the database \(No space left on device\)$"):
        database.save(database.build(records(3, seed=10), BLOSUM62, "db.fa"), tmp_path / "db")
    assert list(tmp_path.iterdir()) == []


def test_an_unreadable_fasta_or_a_folder_given_as_fasta_is_one_line(tmp_path, monkeypatch):
    from swcli import fasta
    from swcli.errors import FastaError

    with pytest.raises(FastaError, match=rf"^{tmp_path}: is a directory, not a FASTA file$"):
        fasta.open_binary(str(tmp_path))

    def denied(path, mode):
        raise PermissionError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(fasta, "open", denied, raising=False)
    with pytest.raises(FastaError, match=r"^locked/q\.fa: cannot open \(Permission denied\)$"):
        fasta.open_binary("locked/q.fa")
