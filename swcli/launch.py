"""Whether this process is a rank of a distributed run: torchrun's variables, and whose they are.

torchrun (or another launcher) sets RANK, WORLD_SIZE and LOCAL_RANK, with MASTER_ADDR and MASTER_PORT,
for each process it starts. A process that one of those starts (a pipeline's step, a shell) inherits
them unchanged: they are its parent's, and a group joined with them would wait for ranks that never
come. So the variables count as this process's own only where its parent process does not hold the same
values: torchrun's agent, a shell script that exported them for this command, a container's entry
point. Where the parent's environment cannot be read (no /proc, another user's process), they count as
this process's own, as they did before this check.

Light on purpose: the command line asks it (which rank prints a usage error) before torch is imported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from swcli.errors import SwcliError

VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
MEETING = ("MASTER_ADDR", "MASTER_PORT")  # compared too: a nested torchrun's ranks meet elsewhere


@dataclass(frozen=True)
class Launch:
    rank: int
    size: int
    local_rank: int
    parent: int | None  # the parent's pid where the variables are the parent's own, else None

    @property
    def inherited(self) -> bool:
        return self.parent is not None

    def describe(self) -> str:
        """Why a command run alone here does not join (for auto)."""
        return (f"{', '.join(VARIABLES[:-1])} and {VARIABLES[-1]} are those of the parent process (pid "
                f"{self.parent}), not set for this one")


def parent_environment(pid: int) -> dict[str, str] | None:
    """The environment process `pid` started with (/proc), or None where it cannot be read."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            raw = file.read()
    except OSError:
        return None
    pairs = (entry.split(b"=", 1) for entry in raw.split(b"\0") if b"=" in entry)
    return {name.decode(errors="replace"): value.decode(errors="replace") for name, value in pairs}


def find(environ=None, parent_environ=None, parent: int | None = None) -> Launch | None:
    """The launch of this process (None: torchrun's variables are not set). environ and parent_environ
    default to this process's and its parent's (None where unreadable)."""
    environ = os.environ if environ is None else environ
    if not all(name in environ for name in VARIABLES):
        return None
    try:
        rank, size, local_rank = (int(environ[name]) for name in VARIABLES)
    except ValueError:
        raise SwcliError(f"{', '.join(VARIABLES)} must be integers, got "
                         f"{', '.join(environ[name] for name in VARIABLES)}") from None
    if parent is None:
        parent = os.getppid()
        parent_environ = parent_environment(parent)
    names = VARIABLES + tuple(name for name in MEETING if name in environ)
    inherited = parent_environ is not None and all(parent_environ.get(name) == environ[name] for name in names)
    return Launch(rank, size, local_rank, parent if inherited else None)


def agent_store() -> bool:
    """Whether torchrun's agent holds the run's store (else rank 0's process does)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def silent_rank() -> bool:
    """Whether this process is a rank other than 0 of a run it would join by default: such ranks leave
    the run's messages (a usage error, which every rank meets) to rank 0."""
    try:
        found = find()
    except SwcliError:
        return False
    return found is not None and not found.inherited and found.rank != 0
