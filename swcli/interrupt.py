"""Ctrl-C and SIGTERM on the command line: never lost, never a traceback, never a half-written file.

`cli.main` installs the handler first thing, before typer, torch and Biopython are imported: an
exception raised from a signal handler (Python's default KeyboardInterrupt) can land inside an import
and be swallowed by an `except` there, or print a traceback; this handler raises nothing. It records
the signal and ends the process at once, with status 130 and the line `swcli: interrupted`, after
removing the temporary output files registered here, unless the main thread is inside a `protected()`
section (rows being written to a stream, the output file being put in place): then the process ends
when the section does. A second signal does not wait. The exit is `os._exit`: it does not wait for an
engine call running in the scoring thread (a compiled call cannot be stopped; the process's end stops
it), so a signal is honoured within milliseconds whatever the size of the pair being scored.

Nothing here imports more than the interpreter has loaded at startup. Without `install()` (the
library, in-process callers) `check()` and `protected()` do nothing.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys

STATUS = 130  # 128 + SIGINT, as a shell reports Ctrl-C; SIGTERM gets the same (the documented code)
SIGNALS = (signal.SIGINT, signal.SIGTERM)

_received: int | None = None  # the first signal, once one arrived
_depth = 0  # how many protected() sections the main thread is in
_temporaries: list[str] = []  # removed before the process ends on a signal
_bar_shown = False  # a progress bar may hold the terminal's line: start the message on a new one
_message_shown = True  # off on the ranks of a distributed run but rank 0, which speaks for the run


def install() -> dict | None:
    """Route SIGINT and SIGTERM to this module; returns what restore() needs (None off the main thread).

    A signal the process ignores (SIGINT of a job started with `&` by a script, `nohup`) stays ignored.
    """
    global _received
    previous = {}
    try:
        for number in SIGNALS:
            current = signal.getsignal(number)
            if current == signal.SIG_IGN:
                continue
            previous[number] = current
            signal.signal(number, _handler)
    except ValueError:  # not the main thread: signals cannot be handled here
        restore(previous)
        return None
    _received = None
    return previous


def restore(previous: dict | None) -> None:
    """Put back the handlers install() replaced (for in-process callers such as the tests)."""
    for number, handler in (previous or {}).items():
        signal.signal(number, handler if handler is not None else signal.SIG_DFL)


def received() -> int | None:
    """The signal that arrived, if one did."""
    return _received


def _handler(signum, frame) -> None:
    global _received
    first = _received is None
    _received = signum
    if _depth == 0 or not first:
        exit_now()


def exit_now() -> None:
    """End the process as interrupted: temporary outputs removed, one line on stderr, status 130."""
    for path in list(_temporaries):
        try:
            remove(path)
        except OSError:
            pass
    try:  # complete lines of verify's or bench's report; align's rows are flushed as they are written
        sys.stdout.flush()
    except BaseException:  # a closed pipe, or the handler interrupted a write to stdout
        pass
    message = b"swcli: interrupted\n"
    try:
        if _message_shown:
            os.write(2, (b"\n" if _bar_shown else b"") + message)
    except OSError:
        pass
    os._exit(STATUS)


def check() -> None:
    """A point where a recorded signal ends the run (inside a protected section, where it waited)."""
    if _received is not None:
        exit_now()


def remove(path: str) -> None:
    """Remove a temporary: a file (or a link, never followed), or a folder with what it holds."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def register_temporary(path: str) -> None:
    """Remove `path` (a file, or a folder with what it holds) if the process ends on a signal (register
    before creating it)."""
    _temporaries.append(path)


def is_registered(path: str) -> bool:
    """Whether `path` is a temporary of this process still being written."""
    return path in _temporaries


def unregister_temporary(path: str) -> None:
    try:
        _temporaries.remove(path)
    except ValueError:
        pass


def set_bar_shown(shown: bool) -> None:
    global _bar_shown
    _bar_shown = shown


def set_message_shown(shown: bool) -> None:
    global _message_shown
    _message_shown = shown


class protected:
    """`with protected():` a signal arriving inside waits until the section ends (then the process
    ends): for writing whole rows to a stream and for putting the output file in place."""

    def __enter__(self) -> protected:
        global _depth
        _depth += 1
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        global _depth
        _depth -= 1
        if _depth == 0:
            check()
