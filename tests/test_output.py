"""output.py: float32 round-trip formatting, the TSV layout, and atomic file output."""

import os
import random
import stat
import struct
import threading

import pytest

from swcli.errors import SwcliError
from swcli.output import TsvWriter, format_score, refuse_output_over_inputs, temporary_name


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


def test_bulk_rows_write_scores_as_format_score_does():
    # Random float32 bit patterns cover every exponent, subnormals (where %.6g and the shortest form
    # differ) and the non-finite values; the row layout around them is the writer's.
    import numpy as np

    from swcli import _host
    from swcli.fasta import PairChunk, Records
    from swcli.output import chunk_rows

    rng = np.random.default_rng(11)
    scores = np.concatenate([
        rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        (rng.standard_normal(20_000) * 10.0 ** rng.integers(-6, 9, 20_000)).astype(np.float32),
        np.arange(-300, 3000, dtype=np.float32),
        np.array([0.0, -0.0, 1e-5, 1e-4, 1e5, 1e6, 123456, 1234567, 3.4e38, 1e-45, np.nan, np.inf, -np.inf],
                 dtype=np.float32),
    ])
    ids = Records("x", 1, np.frombuffer("qé\u00fcta".encode(), np.uint8), np.array([0, 1, 3, 5, 6]),
                  np.zeros(0, np.uint8), np.array([0, 3, 7, 7000, 1]))
    n = len(scores)
    chunk = PairChunk(ids, rng.integers(0, 2, n), ids, rng.integers(2, 4, n))
    lines = _host.tsv_rows(ids.ids, ids.id_offsets, chunk.query_index, ids.ids, ids.id_offsets, chunk.target_index,
                           chunk.query_lengths, chunk.target_lengths, scores).decode().splitlines()
    assert len(lines) == n
    for line, q, t, score in zip(lines, chunk.query_index, chunk.target_index, scores.tolist()):
        lengths = {0: 3, 1: 4, 2: 6993, 3: -6999}
        assert line == f"{ids.id(q)}\t{ids.id(t)}\t{lengths[q]}\t{lengths[t]}\t{format_score(score)}"
    # the writer's rows are those, but a score that is not finite (an overflow) is an error naming its pair
    finite = np.isfinite(scores)
    kept = np.flatnonzero(finite)[:50]
    some = PairChunk(ids, chunk.query_index[kept], ids, chunk.target_index[kept])
    assert chunk_rows(some, scores[kept]).decode().splitlines() == [lines[k] for k in kept]
    first = int(np.flatnonzero(~finite)[0])
    with pytest.raises(SwcliError, match=rf"^query {ids.id(chunk.query_index[first])}, target "
                                         rf"{ids.id(chunk.target_index[first])}: the score is (not a number \(NaN\)|-?inf, past)"):
        chunk_rows(chunk, scores)


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


# ------------------------------------------------------------------ what -o does with each kind of path

def write_one(path, score=2.5):
    with TsvWriter(str(path)) as writer:
        writer.write("q", "t", 1, 1, score)


NEW = "query\ttarget\tqlen\ttlen\tscore\nq\tt\t1\t1\t2.5\n"


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o604])
def test_an_existing_file_keeps_its_mode(tmp_path, umask_022, mode):
    path = tmp_path / "out.tsv"
    path.write_text("old\n")
    path.chmod(mode)
    write_one(path)
    assert path.read_text() == NEW
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert os.listdir(tmp_path) == ["out.tsv"]


def test_a_new_file_gets_the_umask_mode_and_no_temporary_is_left(tmp_path, umask_022):
    write_one(tmp_path / "new.tsv")
    assert stat.S_IMODE((tmp_path / "new.tsv").stat().st_mode) == 0o644
    assert os.listdir(tmp_path) == ["new.tsv"]


def test_a_symlink_is_written_through_to_its_target(tmp_path):
    elsewhere = tmp_path / "data"
    elsewhere.mkdir()
    target = elsewhere / "real.tsv"
    target.write_text("old\n")
    target.chmod(0o600)
    link = tmp_path / "link.tsv"
    link.symlink_to(target)
    write_one(link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == NEW and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["data", "link.tsv"] and os.listdir(elsewhere) == ["real.tsv"]


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.tsv"
    link.symlink_to(tmp_path / "made.tsv")
    write_one(link)
    assert link.is_symlink() and (tmp_path / "made.tsv").read_text() == NEW


def test_a_fifo_is_written_directly(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []

    def reader():
        with open(fifo) as handle:
            received.append(handle.read())

    thread = threading.Thread(target=reader, daemon=True)  # daemon: a replaced FIFO would block it forever
    thread.start()
    write_one(fifo)
    thread.join(timeout=10)
    assert received == [NEW]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and os.listdir(tmp_path) == ["pipe"]


def test_hard_links_are_kept(tmp_path):
    path, other = tmp_path / "out.tsv", tmp_path / "other.tsv"
    path.write_text("old content, longer than the new one " * 10 + "\n")
    os.link(path, other)
    inode = path.stat().st_ino
    write_one(path)
    assert path.read_text() == NEW and other.read_text() == NEW  # truncated to the new length
    assert path.stat().st_ino == inode and path.stat().st_nlink == 2
    assert sorted(os.listdir(tmp_path)) == ["other.tsv", "out.tsv"]


def test_a_failed_run_leaves_hard_linked_files_untouched(tmp_path):
    path, other = tmp_path / "out.tsv", tmp_path / "other.tsv"
    path.write_text("old\n")
    os.link(path, other)
    with pytest.raises(RuntimeError):
        with TsvWriter(str(path)) as writer:
            writer.write("a", "b", 1, 1, 1.0)
            raise RuntimeError("boom")
    assert path.read_text() == "old\n" and other.read_text() == "old\n"
    assert sorted(os.listdir(tmp_path)) == ["other.tsv", "out.tsv"]


def test_a_read_only_file(tmp_path):
    """Refused for a user who may not write it (as cp and `>` refuse); root writes it and keeps 444."""
    path = tmp_path / "out.tsv"
    path.write_text("old\n")
    path.chmod(0o444)
    if os.geteuid() == 0:
        write_one(path)
        assert path.read_text() == NEW and stat.S_IMODE(path.stat().st_mode) == 0o444
    else:
        with pytest.raises(SwcliError, match="out.tsv: cannot write output .*read-only"):
            write_one(path)
        assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["out.tsv"]


def test_dev_null_stays_a_character_device():
    before = os.stat("/dev/null")
    write_one("/dev/null")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_a_full_device_is_one_error_not_a_traceback(tmp_path):
    """/dev/full fails every write as a full disk does (ENOSPC): the rows, the header alone, stdout."""
    import subprocess
    import sys

    for rows in (1, 0):
        with pytest.raises(SwcliError, match=r"^/dev/full: cannot write output \(No space left on device\)$"):
            with TsvWriter("/dev/full") as writer:
                for _ in range(rows):
                    writer.write("q", "t", 1, 1, 2.5)
    with pytest.raises(ValueError, match="^an error already on its way$"):  # it is the one raised
        with TsvWriter("/dev/full") as writer:
            raise ValueError("an error already on its way")
    fasta = tmp_path / "pairs.fa"
    fasta.write_text(">a\nMKVL\n>b\nMKIL\n")
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "swcli", "align", str(fasta), "--backend", "reference"],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr == "swcli: error: stdout: cannot write output (No space left on device)\n"


def test_the_process_descriptors_are_written_through(tmp_path):
    """-o /dev/stdout (or /dev/stderr, /dev/fd/N) writes into the open descriptor, as the shell's
    redirections do: a pipe gets the rows, and a file opened by `>>` keeps what it held (reopening it by
    its name would truncate it)."""
    import subprocess
    import sys

    fasta = tmp_path / "pairs.fa"
    fasta.write_text(">a\nMKVL\n>b\nMKIL\n")
    run = [sys.executable, "-m", "swcli", "align", str(fasta), "--backend", "reference", "-t", "0"]
    expected = "query\ttarget\tqlen\ttlen\tscore\na\tb\t4\t4\t17\n"  # BLOSUM62: M 5, K 5, V/I 3, L 4
    piped = subprocess.run([*run, "-o", "/dev/stdout"], capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stdout == expected
    log = tmp_path / "log.txt"
    for name, fd in (("/dev/stdout", 1), ("/dev/stderr", 2), ("/dev/fd/1", 1), ("/proc/self/fd/2", 2)):
        log.write_text("kept\n")
        with open(log, "a") as appended:
            streams = {"stdout": appended} if fd == 1 else {"stderr": appended, "stdout": subprocess.DEVNULL}
            done = subprocess.run([*run, "-o", name], timeout=120, **streams)
        assert done.returncode == 0 and log.read_text() == "kept\n" + expected, name
    closed = subprocess.run([*run, "-o", "/dev/fd/9"], capture_output=True, text=True, timeout=120)
    assert closed.returncode == 1 and closed.stderr == (
        "swcli: error: /dev/fd/9: cannot write output (Bad file descriptor)\n") and closed.stdout == ""


def test_a_character_device_is_written_directly(tmp_path):
    node = tmp_path / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # another /dev/null
        with open(node, "w") as handle:
            handle.write("x")
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make or open a device node here ({exc})")
    write_one(node)
    assert stat.S_ISCHR(os.stat(node).st_mode) and os.listdir(tmp_path) == ["null"]


def test_an_output_over_an_input_file_is_refused(tmp_path):
    """The same regular file, by its name, a symlink or a hard link: refused, naming the input."""
    fasta = tmp_path / "in.fa"
    fasta.write_text(">a\nMKVL\n")
    (tmp_path / "link.fa").symlink_to(fasta)
    os.link(fasta, tmp_path / "hard.fa")
    for output in (fasta, tmp_path / "link.fa", tmp_path / "hard.fa"):
        with pytest.raises(SwcliError, match=f"^{output}: -o is the same file as TARGETS; the output would"):
            refuse_output_over_inputs(str(output), (("QUERIES", "-"), ("TARGETS", str(fasta))))
    refuse_output_over_inputs(str(tmp_path / "new.tsv"), (("QUERIES", str(fasta)),))  # not there yet
    refuse_output_over_inputs(str(fasta), (("QUERIES", str(tmp_path / "missing.fa")), ("--matrix", None)))


def test_an_output_that_cannot_replace_its_input_is_allowed(tmp_path):
    """A character device (/dev/null, a terminal), a FIFO or a pipe given as both input and output:
    writing it leaves nothing of the input to destroy."""
    refuse_output_over_inputs("/dev/null", (("QUERIES", "/dev/null"),))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    refuse_output_over_inputs(str(fifo), (("QUERIES", str(fifo)),))
    read_end, write_end = os.pipe()  # `swcli align /dev/stdin -o /dev/stdout` with both on one pipe
    try:
        if not os.path.exists(f"/dev/fd/{read_end}"):
            pytest.skip("no /dev/fd here")
        refuse_output_over_inputs(f"/dev/fd/{write_end}", (("QUERIES", f"/dev/fd/{read_end}"),))
    finally:
        os.close(read_end)
        os.close(write_end)


def test_an_output_over_an_input_block_device_is_refused(tmp_path, monkeypatch):
    """A block device keeps what is written to it, as a regular file does (a disk given as both)."""
    node = tmp_path / "disk"
    node.write_text("")
    real_stat = os.stat

    def as_block_device(path, *args, **kwargs):
        found = real_stat(path, *args, **kwargs)
        return os.stat_result((stat.S_IFBLK | 0o660, *tuple(found)[1:]))

    monkeypatch.setattr(os, "stat", as_block_device)
    with pytest.raises(SwcliError, match="-o is the same file as DATABASE"):
        refuse_output_over_inputs(str(node), (("DATABASE", str(node)),))


def test_stale_temporaries_of_dead_processes_are_removed(tmp_path):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / temporary_name("out.tsv", dead_pid)
    live = tmp_path / temporary_name("out.tsv", os.getppid())  # a live process's: kept
    other = tmp_path / temporary_name("another.tsv", dead_pid)  # another output's: not ours to judge
    for path in (stale, live, other):
        path.write_text("partial\n")
    assert stale.name == f".out.tsv.swcli-{stale.name.split('swcli-')[1].rsplit('-', 1)[0]}-{dead_pid}.part"
    write_one(tmp_path / "out.tsv")
    assert sorted(os.listdir(tmp_path)) == sorted(["out.tsv", live.name, other.name])


def test_stdout_gets_nothing_when_the_first_rows_fail(capsys):
    with pytest.raises(SwcliError):
        with TsvWriter(None) as writer:
            raise SwcliError("bad input found before the first row")
    assert capsys.readouterr().out == ""
    with TsvWriter(None) as writer:  # no rows at all: the header alone
        pass
    assert capsys.readouterr().out == "query\ttarget\tqlen\ttlen\tscore\n"


def test_write_rows_to_stdout_writes_whole_rows(capsys):
    with TsvWriter(None, header=False) as writer:
        writer.write_rows([("a", "b", 1, 2, 3.25), ("c", "d", 4, 5, 6.5)])
        assert capsys.readouterr().out == "a\tb\t1\t2\t3.25\nc\td\t4\t5\t6.5\n"  # flushed at once


def test_a_trailing_slash_names_a_directory(tmp_path):
    with pytest.raises(SwcliError, match="not a directory"):
        write_one(str(tmp_path / "new") + "/")
    assert os.listdir(tmp_path) == []


def test_a_file_this_user_may_not_write_is_refused_and_kept(tmp_path, monkeypatch):
    """What a non-root user gets for a 444 file (simulated here: the suite runs as root in CI)."""
    path = tmp_path / "out.tsv"
    path.write_text("old\n")
    path.chmod(0o444)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p) == str(path) else real_access(p, mode, **kw))
    with pytest.raises(SwcliError, match=r"out.tsv: cannot write output \(the file is read-only for this user"):
        write_one(path)
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["out.tsv"]


def test_another_users_file_is_written_in_place_by_a_non_root_user(tmp_path, monkeypatch):
    path = tmp_path / "out.tsv"
    path.write_text("old\n")
    inode = path.stat().st_ino
    monkeypatch.setattr(os, "geteuid", lambda: path.stat().st_uid + 1)  # someone else, not root
    write_one(path)
    assert path.read_text() == NEW and path.stat().st_ino == inode and os.listdir(tmp_path) == ["out.tsv"]
