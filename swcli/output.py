"""The TSV writer, and what `-o PATH` does with each kind of path.

- none or `-`: stdout, written as the rows come, a chunk of whole rows at a time.
- a new path, or an existing regular file: the rows go to a temporary file beside the target,
  `.NAME.swcli-HOST-PID.part`, renamed over it once the output is complete (atomic: a run that fails or
  is interrupted leaves the old file as it was). An existing file keeps its mode (and its owner and
  group where the process may set them: as root, or the user's own file).
- an existing regular file that a rename would change in another way is written in place instead, once
  the whole output is ready in the temporary file: one with other hard links (a rename would cut them),
  one owned by another user (a non-root rename would take it over), one in a folder where no temporary
  file can be created (the temporary file then goes to $TMPDIR). That copy is short but not atomic:
  signals wait for it, a crash or a power loss during it can leave a mix.
- an existing file this user may not write (mode 444 for a non-root user) is refused with an error,
  as cp and the shell's `>` refuse it; root may write it, as with cp and `>`, and its mode is kept.
- a symlink: followed to its final target, which is then written as above (the link stays a link).
- a character or block device (/dev/null), a FIFO: opened and written directly, like stdout.
- one of this process's open descriptors (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N): written
  through that descriptor, as the shell's redirections write it: a pipe stays a pipe, and a file that
  `>>` opened keeps its content and gets the rows at its end (reopening it by name would truncate it).
- a folder, or a missing parent folder: an error.

A temporary file left by a process that died without cleaning up (SIGKILL, a power loss) is removed by
the next run that writes the same PATH from the same host (the pid in the name is not alive any more).
"""

from __future__ import annotations

import math
import os
import stat
import struct
import sys
import tempfile
from pathlib import Path

from swcli import interrupt
from swcli.errors import SwcliError

COLUMNS = ("query", "target", "qlen", "tlen", "score")
_COPY_BLOCK = 1 << 20


def _float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def format_score(value: float) -> str:
    """The shortest decimal that reads back as the same float32 (at most 9 significant digits)."""
    if not math.isfinite(value):
        return str(value)
    value = _float32(value)
    for digits in range(6, 10):
        text = f"{value:.{digits}g}"
        if _float32(float(text)) == value:
            return text
    return repr(value)  # unreachable: 9 digits always round-trip a float32


def overflow_error(query: str, target: str, score: float) -> SwcliError:
    """A score past float32's range (or NaN): only a temperature or substitution scores near that range
    make one (every option is checked to lie within it), and a row of inf would say nothing true."""
    what = "not a number (NaN)" if math.isnan(score) else f"{score}, past float32's range"
    return SwcliError(f"query {query}, target {target}: the score is {what}; use a smaller temperature or "
                      "smaller substitution scores")


def finite_scores(chunk, scores):
    """The scores of a fasta.PairChunk, each checked to be finite (overflow_error)."""
    import numpy as np

    finite = np.isfinite(np.asarray(scores))
    if not finite.all():
        k = int(np.flatnonzero(~finite)[0])
        query, target = chunk.pair(k)
        raise overflow_error(query.id, target.id, float(scores[k]))
    return scores


def chunk_rows(chunk, scores) -> bytes:
    """The TSV rows of a fasta.PairChunk and its scores, formatted in bulk (scores as format_score
    writes them); a score that is not finite is an error (finite_scores)."""
    from swcli import _host

    scores = finite_scores(chunk, scores)
    q, t = chunk.queries, chunk.targets
    return _host.tsv_rows(q.ids, q.id_offsets, chunk.query_index, t.ids, t.id_offsets, chunk.target_index,
                          chunk.query_lengths, chunk.target_lengths, scores)


def _hostname() -> str:
    name = os.uname().nodename or "host"
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:64]


def temporary_name(target_name: str, pid: int | None = None) -> str:
    """The temporary file's name for a target file name: `.NAME.swcli-HOST-PID.part`."""
    name = os.fsencode(target_name)[:128].decode(errors="ignore")  # 128 bytes: the name's limit is 255 bytes
    return f".{name}.swcli-{_hostname()}-{os.getpid() if pid is None else pid}.part"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_temporaries(folder: str, target_name: str) -> list[str]:
    """Remove the temporary files (or makedb's folders) of `target_name` in `folder` left by dead processes
    of this host."""
    prefix, removed = temporary_name(target_name, 0)[: -len("0.part")], []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if not (entry.name.startswith(prefix) and entry.name.endswith(".part")):
            continue
        pid = entry.name[len(prefix): -len(".part")]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            try:
                interrupt.remove(entry.path)
                removed.append(entry.path)
            except OSError:
                pass
    return removed


def create_temporary(folder: str, target_name: str, create):
    """(path, create(path)) for the temporary of `target_name` in `folder`, registered with the signal
    handler before it exists: those of dead processes removed first, and one of this pid (a dead process's
    of the same pid) replaced. create makes it exclusively (FileExistsError where it exists); its OSError
    is raised, the path unregistered."""
    remove_stale_temporaries(folder, target_name)
    path = os.path.join(folder, temporary_name(target_name))
    interrupt.register_temporary(path)  # before it exists: a signal in between removes it
    try:
        try:
            return path, create(path)
        except FileExistsError:
            interrupt.remove(path)
            return path, create(path)
    except OSError:
        interrupt.unregister_temporary(path)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class _TextSink:
    """Bytes written to a text stream that has no binary layer (decoded as UTF-8)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, data: bytes) -> None:
        self.stream.write(data.decode())

    def flush(self) -> None:
        self.stream.flush()


def refuse_output_over_inputs(output: str | None, inputs) -> None:
    """An output that is one of the run's inputs ((option, path) pairs), the same file through any link,
    would replace it once written: refused before anything is read.

    Only a regular file or a block device keeps what is written over its content; a terminal, /dev/null,
    a FIFO or a socket does not, so `-o /dev/stdout` with input from /dev/stdin on one terminal (one
    character device) or one pipe destroys nothing and is allowed."""
    if output in (None, "-"):
        return
    try:
        written = os.stat(output)
    except OSError:  # does not exist (yet): no input can be it
        return
    if not (stat.S_ISREG(written.st_mode) or stat.S_ISBLK(written.st_mode)):
        return
    for name, path in inputs:
        if path in (None, "-"):
            continue
        try:
            same = os.path.samestat(written, os.stat(path))
        except OSError:  # a missing input is reported when it is read
            continue
        if same:
            raise SwcliError(f"{output}: -o is the same file as {name}; the output would replace it")


_DESCRIPTOR_FOLDERS = ("/dev/fd/", "/proc/self/fd/")


def own_descriptor(path: str) -> int | None:
    """The number of this process's descriptor that `path` names (/dev/stdout is a link to
    /proc/self/fd/1), or None. The links are followed one at a time: their last one names a pipe or a
    deleted file that no path reaches."""
    current = os.path.abspath(path)
    folders = (*_DESCRIPTOR_FOLDERS, f"/proc/{os.getpid()}/fd/")
    for _ in range(40):  # as the kernel's limit on nested links
        for folder in folders:
            number = current[len(folder):] if current.startswith(folder) else ""
            if number.isdigit():
                return int(number)
        try:
            link = os.readlink(current)
        except OSError:  # not a link (or missing): a plain path
            return None
        current = os.path.normpath(os.path.join(os.path.dirname(current), link))
    return None


def _error(path, why: str) -> SwcliError:
    return SwcliError(f"{path}: cannot write output ({why})")


def check_output_path(path: str | None) -> None:
    """The errors -o would meet when opened (an empty path, a folder, a missing folder, a read-only file),
    said before any input is read: a run must not read a whole database to learn that."""
    if path not in (None, "-") and own_descriptor(str(path)) is None:
        _output_target(str(path))


def _output_target(given: str) -> tuple[str, os.stat_result | None]:
    """The file that -o `given` writes (a symlink resolved) and its stat (None: not there yet), or the
    error that writing it would meet."""
    if given == "":
        raise SwcliError("-o is an empty path: give it a file name, or - for stdout")
    if given.endswith(("/", os.sep)) and not os.path.isdir(given):
        raise SwcliError(f"{given}: not a directory; give -o a file name")
    name = Path(given)  # as the errors name it
    target = os.path.realpath(given)  # a symlink is written through, to its final target
    try:
        info = os.stat(target)
    except FileNotFoundError:
        info = None
    except OSError as exc:  # a symlink loop, a component that is not a folder, ...
        raise _error(name, exc.strerror) from None
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise SwcliError(f"{name}: is a directory; give -o a file name")
    if info is not None and not stat.S_ISREG(info.st_mode):
        return target, info
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise SwcliError(f"{name}: cannot write output, directory {folder} does not exist")
    if info is not None and not os.access(target, os.W_OK):
        raise _error(name, "the file is read-only for this user: make it writable or remove it first")
    return target, info


class TsvWriter:
    """Context manager writing TSV rows, `query target qlen tlen score` unless told other `columns` (the
    header's names); path None or '-' is stdout.

    The header goes out with the first rows (or at the end, when there are none), so an error found in
    the first chunk of input leaves no output at all, not even on stdout.
    """

    def __init__(self, path: str | None, header: bool = True, columns: tuple[str, ...] = COLUMNS):
        self.descriptor = None if path in (None, "-", "") else own_descriptor(str(path))
        if self.descriptor == 1:  # /dev/stdout: stdout itself, after what was printed before
            path = "-"
        self.path = None if path in (None, "-") else Path(path)
        self.columns = columns
        self._given = "" if path is None else str(path)
        self.header = header
        self.mode: str | None = None  # stdout, direct, replace or in-place, once entered
        self._handle = None  # what the rows are written to, in bytes
        self._temporary: str | None = None
        self._target: str | None = None  # the file that gets the output (a symlink resolved)
        self._target_fd: int | None = None  # in-place: the target, open for writing since the start
        self._started = False

    # ------------------------------------------------------------------------------------------ open

    def __enter__(self) -> TsvWriter:
        if self.path is None:
            if sys.stdout is None:
                raise SwcliError("standard output is closed: give -o a file to write to")
            sys.stdout.flush()  # anything printed before goes first
            # The bytes below the text layer, where there is one (a test's capture may have none).
            self.mode, self._handle = "stdout", getattr(sys.stdout, "buffer", None) or _TextSink(sys.stdout)
            return self
        given = self.path
        if self.descriptor is not None:
            sys.stderr.flush()
            try:
                fd = os.dup(self.descriptor)
            except OSError as exc:
                raise _error(given, exc.strerror) from None
            self.mode, self._handle = "direct", os.fdopen(fd, "wb")
            return self
        target, info = _output_target(self._given)
        self._target = target
        if info is not None and not stat.S_ISREG(info.st_mode):
            self._open_direct(given, target)  # a device, a FIFO: as the shell's `>` writes them
            return self
        folder = os.path.dirname(target)
        if info is None:
            self._open_temporary(given, folder, os.path.basename(target), 0o666 & ~_umask())
            self.mode = "replace"
            return self
        in_place = info.st_nlink > 1 or (os.geteuid() != 0 and info.st_uid != os.geteuid())
        if not in_place:
            try:
                self._open_temporary(given, folder, os.path.basename(target), stat.S_IMODE(info.st_mode),
                                     info, quiet=True)
            except PermissionError:  # the folder takes no new file; the file itself is writable
                in_place = True
        if in_place:
            try:
                self._target_fd = os.open(target, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError as exc:
                raise _error(given, exc.strerror) from None
            try:
                self._open_temporary(given, folder, os.path.basename(target), 0o600, fallback=True)
            except BaseException:
                os.close(self._target_fd)
                raise
        self.mode = "in-place" if in_place else "replace"
        return self

    def _open_direct(self, given, target: str) -> None:
        try:
            fd = os.open(target, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))  # a FIFO waits for a reader
        except OSError as exc:
            raise _error(given, exc.strerror) from None
        self.mode, self._handle = "direct", os.fdopen(fd, "wb")

    def _open_temporary(self, given, folder: str, name: str, mode: int, like=None, quiet=False,
                        fallback=False) -> None:
        """Create the temporary file in `folder` (or $TMPDIR if fallback and the folder refuses it)."""
        folders = [folder, tempfile.gettempdir()] if fallback else [folder]
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        for k, where in enumerate(folders):
            try:
                path, fd = create_temporary(where, name, lambda path: os.open(path, flags, 0o600))
            except OSError as exc:
                if k + 1 < len(folders) and isinstance(exc, PermissionError):
                    continue
                if quiet and isinstance(exc, PermissionError):
                    raise
                raise _error(given, exc.strerror) from None
            break
        if like is not None:
            try:
                os.fchown(fd, like.st_uid, like.st_gid)
            except OSError:
                try:
                    os.fchown(fd, -1, like.st_gid)  # a group of this user's
                except OSError:
                    pass
        os.fchmod(fd, mode)  # after fchown, which may clear set-id bits
        self._temporary = path
        self._handle = os.fdopen(fd, "wb")

    # ----------------------------------------------------------------------------------------- write

    def _streaming(self) -> bool:
        return self.mode in ("stdout", "direct")

    def _start(self) -> None:
        self._started = True
        if self.header:
            self._handle.write(("\t".join(self.columns) + "\n").encode())

    def write(self, query: str, target: str, qlen: int, tlen: int, score: float) -> None:
        self.write_rows(((query, target, qlen, tlen, score),), flush=False)

    def write_rows(self, rows, flush: bool = True) -> None:
        """Write rows of (query, target, qlen, tlen, score); a stream gets them as whole rows."""
        text = "".join(f"{q}\t{t}\t{ql}\t{tl}\t{format_score(s)}\n" for q, t, ql, tl, s in rows)
        self.write_bytes(text.encode(), flush)

    def write_bytes(self, text: bytes, flush: bool = True) -> None:
        """Write whole rows already formatted (UTF-8 bytes, each ending in a newline). A write that fails
        (a full disk) is this writer's one-line error; a closed pipe stays BrokenPipeError (exit 141)."""
        try:
            if not self._streaming():
                if not self._started:
                    self._start()
                self._handle.write(text)
                return
            with interrupt.protected():  # a signal waits for the rows and the flush
                if not self._started:
                    self._start()
                self._handle.write(text)
                if flush:
                    self._handle.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise self._failed(exc) from None

    def _failed(self, exc: OSError) -> SwcliError:
        return _error("stdout" if self.path is None else self.path, exc.strerror or str(exc))

    # ---------------------------------------------------------------------------------------- finish

    def __exit__(self, exc_type, exc, traceback) -> None:
        if self._streaming():
            with interrupt.protected():
                try:
                    if exc_type is None and not self._started:
                        self._start()
                    try:
                        self._handle.flush()
                    finally:
                        if self.mode == "direct":
                            self._handle.close()
                except OSError as error:  # on an error already on its way: that one is the run's
                    if exc_type is None:
                        raise error if isinstance(error, BrokenPipeError) else self._failed(error) from None
            return
        try:
            if exc_type is None:
                if not self._started:
                    self._start()
                self._handle.flush()
                os.fsync(self._handle.fileno())
            self._handle.close()
            if exc_type is None:
                with interrupt.protected():
                    interrupt.check()  # a signal that arrived during the last rows: keep the old file
                    if self.mode == "replace":
                        os.replace(self._temporary, self._target)
                    else:
                        self._copy_in_place()
        except OSError as exc:
            if exc_type is None:
                raise _error(self.path, exc.strerror) from None
        finally:
            if self._target_fd is not None:
                os.close(self._target_fd)
            if self._temporary is not None:
                try:
                    os.unlink(self._temporary)
                except FileNotFoundError:
                    pass
                interrupt.unregister_temporary(self._temporary)

    def _copy_in_place(self) -> None:
        """The complete output, from the temporary file into the target itself (its links kept)."""
        fd = self._target_fd
        size = 0
        with open(self._temporary, "rb") as source:
            os.lseek(fd, 0, os.SEEK_SET)
            while block := source.read(_COPY_BLOCK):
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view):]
                size += len(block)
        os.ftruncate(fd, size)
        os.fsync(fd)
