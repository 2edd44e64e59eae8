"""The TSV writer: stdout, or a file written atomically (a temporary file renamed into place on success).

On an error or Ctrl-C the temporary file is removed, so a failed run never leaves a partial output file.
"""

from __future__ import annotations

import math
import os
import struct
import sys
import tempfile
from pathlib import Path

from swcli.errors import SwcliError

COLUMNS = ("query", "target", "qlen", "tlen", "score")


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


class TsvWriter:
    """Context manager writing `query target qlen tlen score` rows; path None or '-' is stdout."""

    def __init__(self, path: str | None, header: bool = True):
        self.path = None if path in (None, "-") else Path(path)
        self.header = header
        self._handle = None
        self._temporary: Path | None = None

    def __enter__(self) -> TsvWriter:
        if self.path is None:
            self._handle = sys.stdout
        else:
            if self.path.is_dir():
                raise SwcliError(f"{self.path}: is a directory; give -o a file name")
            if not self.path.parent.is_dir():
                raise SwcliError(f"{self.path}: cannot write output, directory {self.path.parent} does not exist")
            try:
                fd, name = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".part")
            except OSError as exc:
                raise SwcliError(f"{self.path}: cannot write output ({exc.strerror})") from None
            self._temporary = Path(name)
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
            self._handle = os.fdopen(fd, "w", newline="\n")
        if self.header:
            self._handle.write("\t".join(COLUMNS) + "\n")
        return self

    def write(self, query: str, target: str, qlen: int, tlen: int, score: float) -> None:
        self._handle.write(f"{query}\t{target}\t{qlen}\t{tlen}\t{format_score(score)}\n")

    def __exit__(self, exc_type, exc, traceback) -> None:
        if self._temporary is None:
            if exc_type is None:
                self._handle.flush()
            return
        self._handle.close()
        if exc_type is None:
            os.replace(self._temporary, self.path)
        else:
            self._temporary.unlink(missing_ok=True)
