"""Several processes, one run: `torchrun ... -m swcli search|align ...` shares the work among its ranks.

torchrun starts one process per rank and sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT.
Without them there is no process group and every command runs as one process, as it always did; with
WORLD_SIZE 1 as well (one rank has no one to share with: its group and exchanges would only cost time),
unless --distributed on asks for the group. With several ranks, set for this process rather than
inherited from its parent (launch.py; --distributed on|off decides instead):

- The process group has NCCL for CUDA tensors, each rank on cuda:LOCAL_RANK, and gloo for host tensors
  (gloo alone where torch has no CUDA). A search's candidates travel on its engine's device; statuses,
  messages and align's rows on the host.
- search: every rank opens the whole database (a makedb folder is memory-mapped, a FASTA file read by
  each rank) and scores every query against its shard: a contiguous range of the length order holding
  about 1/N of the residues, since a query's work is its length times the residues. The shard is scored
  in the single process's blocks cut to it (search.make_block's owned rows), so each engine call has the
  single process's shape and every score is the same, bit for bit. The best k keys of each rank are
  all-gathered and the best k of them kept: keys are distinct (the score, then the database order:
  search.score_keys), so the best k of the union are the single process's, ties included. Rank 0 writes
  the rows, and computes the details of the final hits (it holds the whole database).
- align: every rank reads the whole input in the same chunks; chunk k is scored and formatted (details
  included) by rank k mod N, and its rows sent to rank 0, which writes them in input order.
- lambda and K (--format-output's evalue and bits) are obtained once, by rank 0, and broadcast.
- Progress bars and messages come from rank 0 alone.

Failures. Every rank makes the same collectives in the same order, and each collective carries a status
per rank: a rank that raises carries on through the collectives with a failed status instead of its
data, so every rank learns of the failure at the same collective and stops there. Rank 0 then reports
the first failing rank's error (its message and exit code); the others exit with that code in silence,
once rank 0 has reached its process's end (at most SAY_SECONDS): torchrun stops every rank once one ends
with an error, which could cut rank 0 short before it says why (and a signal in rank 0's last teardown
is then not said: the error was).
Rank 0's output goes through output.TsvWriter, so no output file appears and an existing one is kept; it
is put in place in a phase after the last exchange, so that a failing rename is every rank's error.
What the collectives cannot carry goes through the run's store (monitor.py): an exception that leaves a
rank's exchanges (finish(), at each command's end) is reported there and the others raise it at their
next wait; a rank that stops beating for SWCLI_DISTRIBUTED_SILENCE seconds (default 15), or whose
connection closes, is named. Every wait has a deadline (SWCLI_DISTRIBUTED_TIMEOUT seconds, default 1800)
and is polled, so a signal (Ctrl-C, torchrun's SIGTERM) ends a rank at once.

SWCLI_FAIL_AT=RANK:POINT[:HOW][,...] makes rank RANK fail at POINT: setup, read, query:K, merge:K (the
exchange of query or round K), write:K (rank 0 writing query or round K), closing (any rank, its part
done), write (rank 0 putting the output in place), chunk:K, report (the exchange of failure reports),
broadcast (of lambda and K), say (rank 0 about to say a command's error); K counts from 0. HOW: an error
(the default), crash (an exception no stage catches), hang (the process freezes, its heartbeat too), exit
(it dies at once), device (a device-side assert breaks its CUDA context), slow (a pause of SLOW_SECONDS,
then on). It exists for the tests of these paths.
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from itertools import chain, count

import numpy as np
import torch
import torch.distributed as dist

from swcli import interrupt, launch
from swcli.errors import SwcliError
from swcli.monitor import DEFAULT_SILENCE, BEAT_SECONDS, Monitor, StoreLost

SPIN_SECONDS = 200e-6  # how long a wait polls without sleeping, then in sleeps of growing length up to 5 ms
DEFAULT_TIMEOUT = 1800.0  # seconds a rank waits for the others at one collective (the engine's first build included)
IDENTIFY_SECONDS = 4 * BEAT_SECONDS  # after a closed connection: how long to watch which ranks still beat
SLOW_SECONDS = 1.0  # SWCLI_FAIL_AT's slow: how long the rank pauses at the point
SAY_SECONDS = 10.0  # how long a failed rank's process waits at its end for rank 0, which says the error
ENGINES = ("cpu", "cuda", "reference")
ENVIRONMENT = launch.VARIABLES


class RankFailed(SwcliError):
    """A rank's failure, raised on every rank; the command line shows it on rank 0 alone."""

    def __init__(self, message: str, exit_code: int = 1, shown: bool = True):
        super().__init__(message)
        self.exit_code, self.shown = exit_code, shown


class LostContact(SwcliError):
    """Other ranks stopped answering: the rank that names them says so (rank 0, or the first live one);
    one that cannot tell which they are says so itself."""

    def __init__(self, message: str, shown: bool = True):
        super().__init__(message)
        self.shown = shown


def environment() -> tuple[int, int, int] | None:
    """(RANK, WORLD_SIZE, LOCAL_RANK) as set in the environment, or None where they are not."""
    found = launch.find()
    return None if found is None else (found.rank, found.size, found.local_rank)


def _seconds(name: str, default: float) -> float:
    text = os.environ.get(name, "")
    try:
        value = float(text) if text else default
    except ValueError:
        value = -1.0
    if not value > 0:
        raise SwcliError(f"{name}={text}: give the seconds to wait, a number > 0")
    return value


@dataclass
class Group:
    rank: int
    size: int
    local_rank: int
    timeout: float
    monitor: Monitor | None = None
    lost: bool = False  # a collective broke or was left: the process ends without waiting for the group
    active: bool = False  # a command runs in the group (start() to finish())
    settled: bool = False  # the command's failure is known to every rank (raised by a collective)
    failed: bool = False  # a command of this process ended with an error

    @property
    def leader(self) -> bool:
        return self.rank == 0

    # ---------------------------------------------------------------------------------- waiting

    def wait(self, work) -> None:
        """Wait for an asynchronous collective in short sleeps, so that a signal is handled at once, until
        the monitor says that a rank stopped or sent a failure, and at most `timeout` seconds."""
        started = time.monotonic()
        deadline, spin = started + self.timeout, started + SPIN_SECONDS
        pause = 20e-6
        while not work.is_completed():
            now = time.monotonic()
            if now < spin:  # a collective among waiting ranks ends within tens of microseconds
                time.sleep(0)
                continue
            news = self.monitor.news() if self.monitor is not None else None
            if news is not None:
                raise self._outside(news)
            if now > deadline:
                self.lost = self.settled = True
                raise LostContact(f"rank {self.rank}: the other processes did not answer within {self.timeout:g} s "
                                  "(SWCLI_DISTRIBUTED_TIMEOUT); one of them may have stopped")
            time.sleep(pause)
            pause = min(2 * pause, 0.005)
        try:
            work.wait()
        except RuntimeError as exc:  # gloo: a peer's connection closed, when its process ended
            raise self._closed(exc) from None

    def _outside(self, news: str) -> SwcliError:
        """The error that the monitor's news (monitor.Monitor.news) makes of a wait."""
        self.lost = self.settled = True
        try:
            if news == "report":
                return self._reported(self.monitor.reports())
            if news == "silent":  # the ranks news() saw: the thread may have replaced the list since
                return self._stopped(self.monitor.silent_seen, f"no sign of life from its process for "
                                     f"{self.monitor.silence:g} s, SWCLI_DISTRIBUTED_SILENCE: it may have died or hung")
            raise StoreLost(self.monitor.lost_store)
        except StoreLost as exc:
            return self._store_lost(str(exc))

    def _closed(self, exc: RuntimeError) -> SwcliError:
        """A collective that failed: a peer's process ended. The monitor tells which rank, or what it
        reported before it ended, within a few heartbeats."""
        self.lost = self.settled = True
        # gloo's first sentence, without its source location: "Connection closed by peer [ADDRESS]:PORT"
        why = re.sub(r"^\[[^\]]*\]\s*", "", str(exc).strip()).split(". ")[0] or type(exc).__name__
        if self.monitor is not None:
            try:
                reports, stopped = self.monitor.stopped_during(IDENTIFY_SECONDS, interrupt.check)
            except StoreLost as lost:
                return self._store_lost(str(lost))
            if reports:
                return self._reported(reports)
            if stopped:
                return self._stopped(stopped, "its connection closed, and its process shows no sign of life: it "
                                     "may have died or been killed")
        return LostContact(f"rank {self.rank}: lost contact with another process of the run, which may have "
                           f"stopped ({why})")

    def _reported(self, reports: dict) -> RankFailed:
        """The failure of the first rank that sent one through the store, as Group.fail raises it."""
        first = min(reports)
        code, message = reports[first]
        text = message if first == 0 else f"rank {first}: {message}"
        return RankFailed(text or "", code, shown=self.leader and message is not None)

    def _stopped(self, ranks: list[int], why: str) -> LostContact:
        """Ranks that stopped: said by the first rank that did not."""
        live = [rank for rank in range(self.size) if rank not in ranks]
        if self.monitor is not None:
            self.monitor.gone.update(ranks)
        names = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        return LostContact(f"{names} stopped answering ({why})", shown=bool(live) and self.rank == live[0])

    def _store_lost(self, why: str) -> LostContact:
        """The run's store does not answer: torchrun's agent holds it, or else rank 0's process."""
        if launch.agent_store() or self.rank == 0:
            return LostContact(f"rank {self.rank}: lost the run's store at {os.environ.get('MASTER_ADDR')}:"
                               f"{os.environ.get('MASTER_PORT')} ({why})")
        return self._stopped([0], f"the run's store, which its process holds, does not answer: it may have died or "
                                  "been killed")

    def hang(self) -> None:
        """SWCLI_FAIL_AT's hang: this process stops as a frozen one does, its heartbeat with it (a signal
        still ends it)."""
        if self.monitor is not None:
            self.monitor.stop()
        while True:
            time.sleep(1)

    def abandon(self, failure: BaseException) -> None:
        """This rank leaves the exchanges on an error that they did not carry (Group.finish): its report
        goes through the store, and it waits until the others have ended the command (they stop at their
        next wait) or stopped, so that rank 0 has said the error before this rank's end makes torchrun stop
        the others."""
        self.lost = True
        if self.monitor is None:
            return
        try:
            self.monitor.report(*_report(failure))
            self.monitor.done()
        except StoreLost:
            return  # nobody can be told: the others stop on the silence of this rank
        self.monitor.wait_for_the_others(self.timeout, interrupt.check)

    def finish(self, failure: BaseException | None) -> BaseException | None:
        """The end of a command on this rank, with the exception that ends it: one that the exchanges did
        not carry is reported to the others (abandon); else the rank marks the command done. Returns what
        to raise: on a rank other than 0, an expected error that rank 0 says is raised silent."""
        self.active = False
        self.failed = self.failed or failure is not None
        if failure is None or self.settled:
            if self.monitor is not None:
                try:
                    self.monitor.done()
                except StoreLost:
                    pass
            return failure
        self.abandon(failure)
        if self.leader or not _expected(failure):
            return failure
        return RankFailed(str(failure), _report(failure)[0], shown=False)

    # ---------------------------------------------------------------------------------- failures

    def agree(self, failure: BaseException | None) -> None:
        """A collective over every rank: raises on every rank if any rank brings a failure."""
        status = torch.tensor([0 if failure is None else 1], dtype=torch.int64)
        self.wait(dist.all_reduce(status, op=dist.ReduceOp.MAX, async_op=True))
        if status.item():
            self.fail(failure)

    def fail(self, failure: BaseException | None):
        """Every rank, once a collective showed a failure: the failing ranks' reports are gathered and the
        first one raised: on rank 0 as its error (its own exception where it is the one), elsewhere as a
        silent RankFailed of the same exit code (or as the rank's own exception where it is not one of the
        expected errors, so that its traceback is seen)."""
        inject(self, "report")
        mine = b"" if failure is None else json.dumps(_report(failure)).encode()
        reports = [json.loads(report) if report else None for report in self.all_gather_bytes(mine)]
        first = next(rank for rank, report in enumerate(reports) if report is not None)
        code, message = reports[first]
        self.settled = True
        if failure is not None and first == self.rank and (self.leader or not _expected(failure)):
            raise failure
        text = message if first == 0 else f"rank {first}: {message}"
        raise RankFailed(text or "", code, shown=self.leader and message is not None)

    def same(self, what: str, values: list[int]) -> None:
        """Refuse a run whose ranks see different `values` (another file of the same name on one host, an
        engine chosen by auto on a host without a GPU)."""
        mine = torch.tensor(values, dtype=torch.int64)
        everyone = [torch.empty_like(mine) for _ in range(self.size)]
        self.wait(dist.all_gather(everyone, mine, async_op=True))
        for rank, theirs in enumerate(everyone):
            if not torch.equal(theirs, everyone[0]):
                self.settled = True
                raise RankFailed(f"the processes disagree on {what}: rank 0 has {everyone[0].tolist()}, rank {rank} "
                                 f"{theirs.tolist()}", 1, shown=self.leader)

    def broadcast(self, value):
        """Rank 0's value (a picklable object), on every rank; a polled wait, as every exchange's."""
        inject(self, "broadcast")
        data = pickle.dumps(value) if self.leader else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        self.wait(dist.broadcast(size, src=0, async_op=True))
        box = _bytes_tensor(data, int(size))
        self.wait(dist.broadcast(box, src=0, async_op=True))
        return pickle.loads(box.numpy().tobytes())

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's `data`, in rank order: the sizes, then the bytes padded to the longest, in polled
        waits (torch's all_gather_object waits unpolled, for the process group's whole timeout)."""
        size = torch.tensor([len(data)], dtype=torch.int64)
        sizes = [torch.empty_like(size) for _ in range(self.size)]
        self.wait(dist.all_gather(sizes, size, async_op=True))
        lengths = [int(one) for one in sizes]
        mine = _bytes_tensor(data, max(max(lengths), 1))
        everyone = [torch.empty_like(mine) for _ in range(self.size)]
        self.wait(dist.all_gather(everyone, mine, async_op=True))
        return [theirs[:length].numpy().tobytes() for theirs, length in zip(everyone, lengths)]

    # ---------------------------------------------------------------------------------- search

    def connect(self, device) -> None:
        """One exchange on the search's device before its first: NCCL makes its communicator and its
        connections in a group's first exchange on a device, in a call that waits for every rank without
        polling. Made here, just after every rank said it is ready, a rank that fails later cannot leave
        the others inside that call."""
        probe = torch.zeros(1, dtype=torch.int64, device=device)
        everyone = [torch.empty_like(probe) for _ in range(self.size)]
        self.wait(dist.all_gather(everyone, probe, async_op=True))

    def send_keys(self, keys: torch.Tensor | None, ranks: torch.Tensor | None, failure: BaseException | None,
                  top: int, ranked: bool, device):
        """Start the all-gather of this rank's best keys (and R) of one query (key_payload)."""
        payload = key_payload(keys, ranks, failure is not None, top, ranked, device)
        everyone = [torch.empty_like(payload) for _ in range(self.size)]
        return dist.all_gather(everyone, payload, async_op=True), everyone

    def merged_keys(self, sent, failure: BaseException | None, top: int,
                    ranked: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The best `top` keys (and their R) of every rank's (send_keys), on the host, best first."""
        work, everyone = sent
        self.wait(work)
        gathered = torch.stack(everyone).cpu()
        if gathered[:, 0].any():
            self.fail(failure)
        return merge_payloads(gathered, top, ranked)

    # ---------------------------------------------------------------------------------- align

    def gather_rows(self, rows: bytes | None, failure: BaseException | None, pairs: int, cells: int):
        """One round of align: each rank's rows of its chunk (None: it has no more) to rank 0. Returns
        (rows of every rank in rank order on rank 0, [] elsewhere; (pairs, cells) summed over the
        ranks), or None once no rank has rows left."""
        mine = torch.tensor([failure is not None, -1 if rows is None else len(rows), pairs, cells], dtype=torch.int64)
        everyone = [torch.empty_like(mine) for _ in range(self.size)]
        self.wait(dist.all_gather(everyone, mine, async_op=True))
        table = torch.stack(everyone)
        if table[:, 0].any():
            self.fail(failure)
        sizes = table[:, 1].tolist()
        if max(sizes) < 0:
            return None
        totals = tuple(table[:, 2:].sum(dim=0).tolist())
        # A gather of equal sizes (gloo's point-to-point works cannot be polled): each rank's rows padded
        # to the longest.
        mine = _bytes_tensor(rows or b"", max(max(sizes), 1))
        everyone = [torch.empty_like(mine) for _ in range(self.size)] if self.leader else None
        self.wait(dist.gather(mine, everyone, dst=0, async_op=True))
        if not self.leader:
            return [], totals
        return [everyone[rank][:size].numpy().tobytes() for rank, size in enumerate(sizes) if size > 0], totals


def _bytes_tensor(data: bytes, width: int) -> torch.Tensor:
    """`data` in a uint8 tensor of `width` (>= its length) bytes, zero-padded."""
    box = torch.zeros(width, dtype=torch.uint8)
    if data:
        box[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return box


def _click_error() -> type:
    """click's ClickException as typer exposes it (typer vendors click in recent versions)."""
    import typer

    return {cls.__name__: cls for cls in typer.BadParameter.__mro__}["ClickException"]


def _report(failure: BaseException) -> tuple[int, str | None]:
    """(exit code, message) of a failure, as the command line would show it (None: nothing shown)."""
    import typer

    from swcli._build import BuildError

    if isinstance(failure, BrokenPipeError):
        return 141, None  # the reader of rank 0's stdout went away: stop quietly, as one process does
    if isinstance(failure, typer.Exit):
        return failure.exit_code, None
    if isinstance(failure, _click_error()):
        return failure.exit_code, failure.format_message()
    if isinstance(failure, RankFailed):
        return failure.exit_code, str(failure) if failure.shown else None
    if isinstance(failure, (SwcliError, BuildError)):
        return 1, str(failure)
    lines = str(failure).strip().splitlines()  # torch's CUDA errors add lines of advice: its traceback has them
    return 1, f"{type(failure).__name__}: {lines[0] if lines else ''}"


def _expected(failure: BaseException) -> bool:
    """An error the command line reports in one line (anything else is a bug, shown with its traceback)."""
    import typer

    from swcli._build import BuildError

    return isinstance(failure, (SwcliError, BuildError, BrokenPipeError, typer.Exit, _click_error()))


# --------------------------------------------------------------------------------------------------
# Starting, phases, the test hook

_group: Group | None = None


def start(inputs: Iterable[str | None] = (), mode: str = "auto", quiet: bool = False) -> Group | None:
    """The process group of torchrun's ranks, joined once per process and left at its exit, or None: one
    process. mode is --distributed: auto joins where torchrun's variables were set for this process
    (launch.py; inherited ones are said on stderr unless quiet) for more than one rank, on wherever they
    are set (one rank included), off never.
    inputs: the command's input paths, which may not be stdin."""
    global _group
    if mode == "off":
        return None
    found = launch.find()
    if found is None:
        if mode == "on":
            raise SwcliError(f"--distributed on: {', '.join(ENVIRONMENT)} are not set: start the command with "
                             "torchrun (torchrun --nproc-per-node N -m swcli ...)")
        return None
    if found.inherited and mode != "on":
        if not quiet:
            print(f"swcli: running as one process: {found.describe()} (--distributed on joins their process "
                  "group)", file=sys.stderr, flush=True)
        return None
    if found.size == 1 and mode != "on":
        return None  # the run's only rank: the plain command, the same output without the group's cost
    if _group is None:
        rank, size, local_rank = found.rank, found.size, found.local_rank
        timeout = _seconds("SWCLI_DISTRIBUTED_TIMEOUT", DEFAULT_TIMEOUT)
        silence = _seconds("SWCLI_DISTRIBUTED_SILENCE", DEFAULT_SILENCE)
        cuda = torch.cuda.is_available() and dist.is_nccl_available()
        if cuda and local_rank < torch.cuda.device_count():
            torch.cuda.set_device(local_rank)  # before anything touches a GPU: this rank's own
        try:
            _join("cpu:gloo,cuda:nccl" if cuda else "gloo", timeout)
        except Exception as exc:  # a rendezvous that fails or times out
            raise SwcliError(f"rank {rank}: cannot join the other processes (torch.distributed: "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        _group = Group(rank, size, local_rank, timeout)
        atexit.register(leave)
        if rank != 0:
            interrupt.set_message_shown(False)
        try:
            # The process group's own store (a private name of torch's, public since 1.x): its keys are
            # this run's, and torchrun's restarts each have a new one.
            _group.monitor = Monitor(dist.distributed_c10d._get_default_store(), rank, size, silence)
        except Exception as exc:
            _group.lost = True
            raise SwcliError(f"rank {rank}: cannot reach the run's store (torch.distributed: "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    if _group.lost:
        raise SwcliError(f"rank {_group.rank}: the process group broke in an earlier command of this process")
    _group.monitor.begin()
    _group.active, _group.settled = True, False
    with phase(_group):
        if "-" in inputs:
            raise SwcliError("with several processes (torchrun) every rank reads the inputs: give files, not stdin ('-')")
    return _group


def _join(backend: str, timeout: float) -> None:
    """dist.init_process_group, in a thread while this one polls: the rendezvous waits for the other ranks
    inside C++, where no Python signal handler runs, so Ctrl-C or SIGTERM on a rank whose peers have not
    started would wait for the timeout (30 min); handled here, they end the run at once (interrupt)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
        except BaseException as exc:
            failure.append(exc)

    joining = threading.Thread(target=run, name="swcli-join", daemon=True)
    joining.start()
    while joining.is_alive():
        joining.join(0.1)
        interrupt.check()
    if failure:
        raise failure[0]


def leave() -> None:
    """The end of the process (at exit, or before cli.py's os._exit): the heartbeat stops, rank 0 waits
    for the others' where its process holds the store, and the group is destroyed unless it broke."""
    global _group
    group, _group = _group, None
    if group is None:
        return
    if group.failed:
        interrupt.set_message_shown(False)  # the error was said: a signal during the teardown adds nothing
    if group.monitor is not None:
        group.monitor.leave(group.leader and not launch.agent_store(), IDENTIFY_SECONDS,
                            SAY_SECONDS if group.failed else 0.0)
    if not group.lost and dist.is_initialized():
        dist.destroy_process_group()


def finish(failure: BaseException | None) -> BaseException | None:
    """The end of a command (cli.py), with the exception that ends it, if any: Group.finish where the
    command ran in a group; returns what to raise instead of it."""
    if _group is None or not _group.active:
        return failure
    return _group.finish(failure)


def before_saying() -> None:
    """The point where rank 0 is about to say a command's error (the test hook's say)."""
    inject(_group, "say")


def left_broken() -> bool:
    """Whether this process's group broke (a rank stopped, or this one left the exchanges): the process
    then ends without waiting for the group's threads, which may wait for a peer that is gone."""
    return _group is not None and _group.lost


def is_leader(group: Group | None) -> bool:
    """Whether this process writes the output and shows progress and messages: rank 0, or the only one."""
    return group is None or group.leader


@contextmanager
def phase(group: Group | None):
    """A stretch of work that any rank may fail: at its end every rank learns whether one did, and all
    raise if so (Group.fail). Without a group, nothing."""
    if group is None:
        yield
        return
    failure = None
    try:
        yield
    except Exception as exc:
        failure = exc
    group.agree(failure)


def check_engine(group: Group | None, settings) -> None:
    """Every rank on the same engine, a CUDA one on a GPU of its own (cuda:LOCAL_RANK)."""
    if group is None:
        return
    with phase(group):
        inject(group, "setup")
        if settings.backend == "cuda" and group.local_rank >= torch.cuda.device_count():
            raise SwcliError(f"rank {group.rank}: LOCAL_RANK {group.local_rank}, but this host has "
                             f"{torch.cuda.device_count()} CUDA devices: start at most one process per GPU "
                             "(torchrun --nproc-per-node)")
    group.same("the engine (--backend)", [ENGINES.index(settings.backend)])


def shared(group: Group | None, compute: Callable):
    """compute() on rank 0 alone, its value broadcast to every rank (lambda and K: estimated once)."""
    if group is None:
        return compute()
    value, failure = None, None
    if group.leader:
        try:
            value = compute()
        except Exception as exc:
            failure = exc
    group.agree(failure)
    return group.broadcast(value)


@contextmanager
def writer(group: Group | None, path: str | None, header: bool, columns: tuple[str, ...]):
    """output.TsvWriter, on rank 0 alone (None elsewhere): opened in a phase, so that a path it cannot
    write stops every rank before any work."""
    from swcli.output import TsvWriter

    if group is None:
        with TsvWriter(path, header, columns) as out:
            yield out
        return
    with ExitStack() as stack:
        with phase(group):
            out = stack.enter_context(TsvWriter(path, header, columns)) if group.leader else None
        yield out
        put_in_place(group, stack)


def put_in_place(group: Group, output: ExitStack) -> None:
    """Close `output` (rank 0's TsvWriter: the output renamed or copied into place), once every rank has
    said it is done, in a phase: an error there (a full disk, a folder made read-only) is every rank's, and
    the existing file is kept. Every rank first says it has come here, so that a rank that fails after
    the last exchange (its teardown, a signal) stops the run before the rename, not after it."""
    with phase(group):
        inject(group, "closing")
    with phase(group):
        if group.leader:
            inject(group, "write")
        output.close()


class InjectedCrash(BaseException):
    """SWCLI_FAIL_AT's crash: an exception that no stage catches (not an Exception), as one raised where a
    rank cannot take part in its next exchange (a broken CUDA context makes the next NCCL exchange raise)."""


def inject(group: Group | None, point: str) -> None:
    """The test hook SWCLI_FAIL_AT=RANK:POINT[:HOW][,...] (see the module's docstring)."""
    spec = os.environ.get("SWCLI_FAIL_AT")
    if not spec or group is None:
        return
    for item in spec.split(","):
        rank, _, where = item.partition(":")
        how = "error"
        for kind in ("exit", "crash", "hang", "device", "slow"):
            if where.endswith(":" + kind):
                where, how = where[:-len(kind) - 1], kind
        if rank != str(group.rank) or where != point:
            continue
        if how == "slow":
            time.sleep(SLOW_SECONDS)
            continue
        if how == "exit":
            os._exit(3)
        if how == "hang":
            group.hang()
        if how == "crash":
            raise InjectedCrash(f"crash injected at {point} (SWCLI_FAIL_AT)")
        if how == "device":
            _break_the_device()
        raise SwcliError(f"failure injected at {point} (SWCLI_FAIL_AT)")


def _break_the_device() -> None:
    """SWCLI_FAIL_AT's device: a device-side assert on this rank's GPU, which breaks its CUDA context for
    good (every later CUDA call raises, the NCCL exchanges included)."""
    if not torch.cuda.is_available():
        raise SwcliError("SWCLI_FAIL_AT's device needs a CUDA device")
    outside = torch.tensor([1], device="cuda")
    torch.zeros(1, device="cuda")[outside]  # an index out of bounds: the kernel's assert
    torch.cuda.synchronize()  # raises: CUDA error: device-side assert triggered


# --------------------------------------------------------------------------------------------------
# search


def key_payload(keys: torch.Tensor | None, ranks: torch.Tensor | None, failed: bool, top: int, ranked: bool,
                device) -> torch.Tensor:
    """One rank's best keys of a query (None: none, an empty shard) as one int64 tensor on the engine's
    device: [status, count, keys..., padding] and, ranked by E-value, their R (float64, by its bits)
    and padding after. A fixed size, for one all-gather; the count, not a sentinel key, since any int64
    may be a key."""
    payload = torch.zeros(2 + top * (2 if ranked else 1), dtype=torch.int64, device=device)
    if failed:
        payload[0].fill_(1)  # fills, not copies from the host: nothing here waits for the device
    elif keys is not None:
        count = keys.numel()
        payload[1].fill_(count)
        payload[2:2 + count].copy_(keys)
        if ranked:
            payload[2 + top:2 + top + count].copy_(ranks.view(torch.int64))
    return payload


def merge_payloads(gathered: torch.Tensor, top: int, ranked: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The best `top` keys of every rank's payload (key_payload, stacked), best first, and ranked by
    E-value their R: by key (score, then database order), or by R, then key (EvalueRanking.best). Keys
    are distinct, so either order is total and these are the best of the whole database, whatever the
    shards."""
    from swcli.search import top_keys

    counts = [int(row[1]) for row in gathered]
    keys = torch.cat([row[2:2 + count] for row, count in zip(gathered, counts)])
    if not ranked:
        return top_keys(keys, top), None
    from swcli.statistics import EvalueRanking

    ranks = torch.cat([row[2 + top:2 + top + count] for row, count in zip(gathered, counts)]).view(torch.float64)
    ranks, keys = EvalueRanking.best(ranks, keys, top)
    return keys, ranks


def shard_bounds(offsets: np.ndarray, size: int) -> list[tuple[int, int]]:
    """[first, last) of each rank's range of the length order: contiguous, cut at the sequence boundary
    nearest to each r/size of the residues (a sequence longer than a share is a shard alone, and the
    shards around it may be empty)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    total, cuts = int(offsets[-1]), [0]
    for rank in range(1, size):
        target = total * rank / size
        cut = int(np.searchsorted(offsets, target))  # the first boundary at or past the target
        if cut > 0 and target - offsets[cut - 1] < offsets[cut] - target:
            cut -= 1
        cuts.append(max(cut, cuts[-1]))
    cuts.append(len(offsets) - 1)
    return list(zip(cuts, cuts[1:]))


def run_search(group: Group, queries: str, database: str, settings, output: str | None = None, *, top: int = 10,
               header: bool = True, max_bytes: int | None = None, progress=None, formatter=None, rank=None,
               warn=None, queries_read=None, cutoff=None):
    """search.run_search shared by the ranks of `group`: the same arguments and output (warn: rank 0's)."""
    from swcli.output import COLUMNS, TsvWriter
    from swcli.search import (DEFAULT_MAX_BYTES, HitRows, Searcher, SearchStats, check_inputs, read_inputs,
                              write_hits)

    stats, finished = SearchStats(), False
    with ExitStack() as stack:
        with phase(group):
            inject(group, "read")
            check_inputs(queries, database)
            records, codes, db = read_inputs(queries, database, settings, warn if group.leader else None, queries_read)
        group.same("the queries and the database (count, residues)",
                   [len(records), sum(map(len, codes)), len(db), db.residues])
        stats.total, stats.sequences, stats.residues, stats.host_bytes = len(records), len(db), db.residues, db.nbytes
        interrupt.check()
        with phase(group):
            searcher = Searcher(db, settings.matrix.tensor(), settings.gap, settings.temperature, top, settings.backend,
                                settings.device, max_bytes=DEFAULT_MAX_BYTES if max_bytes is None else max_bytes,
                                gap_open=settings.gap_open, gap_extend=settings.gap_extend, rank=rank,
                                rows=shard_bounds(db.offsets, group.size)[group.rank])
            stats.device_bytes, stats.resident = searcher.device_bytes, searcher.resident is not None
            stats.kernel = searcher.kernel_name
            if group.leader:
                bar = stack.enter_context(progress(len(records))) if progress else None
                out = stack.enter_context(TsvWriter(output, header, formatter.columns if formatter else COLUMNS))
                rows_of = HitRows(db, formatter, cutoff)
                stack.callback(lambda: rows_of.close(finished))  # the details' worker: waited for once done
        group.connect(searcher.device)

        def write(rows: list) -> None:
            for one in rows:
                write_hits(out, one)

        def consume(k: int, found, seconds: float) -> None:
            stats.queries += 1
            stats.cells += len(records[k].sequence) * db.residues
            stats.kernel_seconds += seconds
            stats.rescored = searcher.rescored
            if group.leader:
                inject(group, f"write:{k}")
                write(rows_of.put(records[k], codes[k], found))
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix_str(f"{stats.gcups:.2f} GCUPS", refresh=False)

        search_shard(group, searcher, codes, consume, lambda: write(rows_of.drain()) if group.leader else None)
        finished = True
        put_in_place(group, stack)
    stats.seconds = stats.elapsed
    return stats


def search_shard(group: Group, searcher, query_codes: list[bytes], consume, drain=None) -> None:
    """Each query against this rank's shard, merged with the other ranks' hits: consume(k, hits, seconds
    of this rank's scoring calls) for query k, in order, on every rank; then drain() (rank 0's rows still
    being formatted), before the last collective.

    As in search.search_rows (Searcher.step), the scoring runs in a worker thread, waited for in short
    steps, and query k + 1 is queued on the device before query k is finished: its pairs past the 16-bit
    kernel scored again, its keys all-gathered (one exchange per query on every rank, failed or not) and
    merged."""
    from swcli.pipeline import counted_call, scoring_pool, wait_for
    from swcli.search import hits_of

    pool = scoring_pool(searcher.device, "swcli-search")
    failure, previous, finished = None, None, False
    try:
        for k, codes in enumerate(chain(query_codes, [None])):  # None: finish the last query
            current = None
            if codes is not None:
                pending = None
                if failure is None:
                    try:
                        inject(group, f"query:{k}")
                        pending = wait_for(pool.submit(counted_call, searcher.launch, codes))
                    except Exception as exc:
                        failure = exc
                current = pending
            if k > 0:
                keys = None
                if failure is None:
                    try:
                        wait_for(pool.submit(counted_call, searcher.rescore_flagged, previous))
                        keys = previous.keys
                    except Exception as exc:
                        failure = exc
                ranked = searcher.ranking is not None
                inject(group, f"merge:{k - 1}")
                sent = group.send_keys(keys, previous.ranks if keys is not None else None, failure, searcher.top,
                                       ranked, searcher.device)
                merged, ranks = group.merged_keys(sent, failure, searcher.top, ranked)  # raises if a rank failed
                if failure is None:
                    try:
                        consume(k - 1, hits_of(merged, ranks), previous.kernel_seconds())
                    except Exception as exc:  # rank 0's writing: said at the next collective
                        failure = exc
            previous = current
        if failure is None and drain is not None:
            try:
                drain()
            except Exception as exc:
                failure = exc
        group.agree(failure)
        finished = True
    finally:
        pool.shutdown(wait=finished, cancel_futures=True)


# --------------------------------------------------------------------------------------------------
# align


def align_rows(group: Group | None, chunks: Iterable, settings, rows_of, out, stats, on_chunk=None) -> None:
    """The rows of every chunk of pairs (rows_of(chunk, scores): bytes) written to `out` (rank 0's
    TsvWriter) in input order; on_chunk(stats) after each chunk (with a group: each round of chunks,
    stats then counting every rank's pairs and cells)."""
    from swcli.pipeline import Stats, align_chunks

    if group is None:
        for chunk, scores in align_chunks(chunks, settings, stats, on_chunk):
            out.write_bytes(rows_of(chunk, scores))
        return
    mine = (chunk for k, chunk in enumerate(chunks) if k % group.size == group.rank)
    failure = None
    own = Stats()  # this rank's share: its pairs and cells are counted from every rank's below
    with closing(align_chunks(mine, settings, own)) as scored:
        for round_ in count():
            rows, pairs, cells = None, 0, 0
            if failure is None:
                try:
                    inject(group, f"chunk:{round_}")
                    item = next(scored, None)
                    if item is not None:
                        chunk, scores = item
                        rows = rows_of(chunk, scores)
                        pairs, cells = len(chunk), int(np.dot(chunk.query_lengths, chunk.target_lengths))
                except Exception as exc:
                    failure = exc
            inject(group, f"merge:{round_}")
            gathered = group.gather_rows(rows, failure, pairs, cells)  # raises on every rank if one failed
            if gathered is None:
                return
            parts, (round_pairs, round_cells) = gathered
            if group.leader and failure is None:
                try:
                    inject(group, f"write:{round_}")
                    for part in parts:
                        out.write_bytes(part)
                    stats.pairs += round_pairs
                    stats.cells += round_cells
                    stats.kernel_seconds = own.kernel_seconds  # rank 0's scoring calls, as --stats says
                    if on_chunk is not None:
                        on_chunk(stats)
                except Exception as exc:  # said at the next round, which there always is
                    failure = exc
