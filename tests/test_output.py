"""output.py: float32 round-trip formatting, the TSV layout, and atomic file output."""

import os
import random
import struct

import pytest

from swcli.errors import SwcliError
from swcli.output import TsvWriter, format_score


def as_float32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def test_format_round_trips_float32():
    rng = random.Random(5)
    values = [as_float32(rng.uniform(-1, 1) * 10 ** rng.randint(-8, 8)) for _ in range(2000)]
    values += [0.0, 1.0, 308.0, as_float32(47.438034), as_float32(1e-7)]
    for value in values:
        text = format_score(value)
        assert as_float32(float(text)) == value, (value, text)
        assert len(text.replace("-", "").replace(".", "").split("e")[0].lstrip("0")) <= 9
    assert format_score(308.0) == "308"
    assert format_score(float("nan")) == "nan" and format_score(float("inf")) == "inf"


def test_tsv_to_file(tmp_path):
    path = tmp_path / "out.tsv"
    with TsvWriter(str(path)) as writer:
        writer.write("q1", "t1", 3, 4, 1.5)
    assert path.read_text() == "query\ttarget\tqlen\ttlen\tscore\nq1\tt1\t3\t4\t1.5\n"
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~current_umask())


def current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_no_header_and_stdout(capsys):
    with TsvWriter(None, header=False) as writer:
        writer.write("a", "b", 1, 2, 3.25)
    assert capsys.readouterr().out == "a\tb\t1\t2\t3.25\n"


def test_failure_leaves_no_file_and_keeps_an_old_one(tmp_path):
    path = tmp_path / "out.tsv"
    with pytest.raises(RuntimeError):
        with TsvWriter(str(path)) as writer:
            writer.write("a", "b", 1, 1, 1.0)
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    path.write_text("old\n")
    with pytest.raises(KeyboardInterrupt):
        with TsvWriter(str(path)) as writer:
            writer.write("a", "b", 1, 1, 1.0)
            raise KeyboardInterrupt
    assert path.read_text() == "old\n" and list(tmp_path.iterdir()) == [path]


def test_bad_output_paths(tmp_path):
    with pytest.raises(SwcliError, match="is a directory"):
        with TsvWriter(str(tmp_path)):
            pass
    with pytest.raises(SwcliError, match="does not exist"):
        with TsvWriter(str(tmp_path / "missing" / "out.tsv")):
            pass
