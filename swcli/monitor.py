"""What the ranks of a distributed run learn of each other outside the collectives: signs of life, and
the failures a rank could not carry through them.

A collective cannot say that a rank stopped: a rank killed on another host, a frozen one, or one that
cannot take part any more (a broken CUDA context makes its next NCCL exchange raise) leaves the others
waiting in it. So the ranks also talk through the run's store, the key-value server of the rendezvous
(torchrun's agent holds it, or rank 0's process where no agent does), each over TCP connections of its
own:

- A daemon thread adds 1 to this rank's counter every BEAT_SECONDS and reads the others' counters. A rank
  whose counter has not moved here for `silence` seconds has stopped: died with no closed connection to
  show it, or frozen. The thread runs whatever the main thread does (engine calls, file reads and the
  collectives release the GIL), so a busy rank is not a silent one.
- A rank that leaves the exchanges on an error writes its report (exit code, message) under the
  command's keys; the thread counts the reports, and a rank waiting in a collective reads them.
- Every rank marks the end of each command; a rank that sent a report waits for the others' marks, so
  that rank 0 has said the error before this rank's end makes torchrun stop the others.

The main thread's waits ask news(): attributes, nothing on the network.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import torch

BEAT_SECONDS = 0.5  # how often a rank says it is alive and reads the others
DEFAULT_SILENCE = 15.0  # seconds without a sign of life after which a rank has stopped
POLL_SECONDS = 0.05  # the main thread's reads of the store while it waits for the others' marks
PREFIX = "swcli/"


class StoreLost(Exception):
    """The run's store stopped answering (its host's process ended, or the network between)."""


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class Monitor:
    """This rank's heartbeat and its view of the others' (see the module's docstring)."""

    def __init__(self, store, rank: int, size: int, silence: float):
        self.rank, self.size, self.silence = rank, size, silence
        self.others = [r for r in range(size) if r != rank]
        self.command = 0  # the command of this process that the keys are about (all ranks count alike)
        self._store = self._client(store)  # the thread's
        self._main = self._client(store)  # the main thread's, so that neither waits for the other's reads
        now = time.monotonic()
        self._seen = {r: (None, now) for r in self.others}  # a counter's value, and when it last changed here
        self._beaten = now  # when this thread last read the counters
        self.silent: list[int] = []  # the ranks that have stopped, as the thread last saw them
        self.silent_seen: list[int] = []  # the silent ranks that news() last reported
        self.gone: set[int] = set()  # the ranks that the main thread found stopped (a closed connection)
        self._reports = (0, 0)  # (command, failure reports of it), as the thread last saw them
        self.lost_store: str | None = None  # why the thread could not reach the store
        self._stop = threading.Event()
        for r in self.others:  # the counters exist from now on: the thread reads them in one request
            self._store.add(self._key(f"beat/{r}"), 0)
        self._thread = threading.Thread(target=self._run, name="swcli-heartbeat", daemon=True)
        self._thread.start()

    def _client(self, store):
        if not hasattr(store, "clone"):  # Store.clone came with torch 2.8
            raise RuntimeError(f"runs under torchrun need torch >= 2.8 (Store.clone), this is torch "
                               f"{torch.__version__}")
        client = store.clone()
        client.set_timeout(timedelta(seconds=self.silence))  # a store that cannot answer within it is lost
        return client

    @staticmethod
    def _key(name: str) -> str:
        return PREFIX + name

    def _command_key(self, name: str) -> str:
        return f"{PREFIX}{self.command}/{name}"

    # ------------------------------------------------------------------------------------ the thread

    def _run(self) -> None:
        answered = time.monotonic()  # when the store last answered a beat
        while True:
            try:
                self._beat()
                answered = time.monotonic()
            except Exception as exc:  # the store's host ended, or its connection broke, or one request failed
                if time.monotonic() - answered > self.silence:
                    self.lost_store = first_line(exc)
                    return
            if self._stop.wait(BEAT_SECONDS):
                return

    def _beat(self) -> None:
        store, command = self._store, self.command
        store.add(self._key(f"beat/{self.rank}"), 1)
        values = store.multi_get([self._key(f"beat/{r}") for r in self.others]) if self.others else []
        reports = int(store.add(f"{PREFIX}{command}/failures", 0))
        now = time.monotonic()
        # This process was paused (the whole job suspended, a frozen cgroup): the others were too, likely,
        # and their beats since have not come yet. Silence counts from now.
        paused = now - self._beaten > 4 * BEAT_SECONDS + self.silence / 2
        self._beaten = now
        silent = []
        for rank, value in zip(self.others, values):
            last, since = self._seen[rank]
            if value != last or paused:
                self._seen[rank] = (value, now)
            elif now - since > self.silence:
                silent.append(rank)
        self.silent, self._reports = silent, (command, reports)

    def stop(self) -> None:
        """No more heartbeats (the process ends, or SWCLI_FAIL_AT's hang makes it look frozen)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * BEAT_SECONDS)

    def leave(self, host: bool, timeout: float, after_rank_0: float = 0.0) -> None:
        """The process ends: the heartbeat stops, and the process that holds the store (`host`: rank 0,
        where no torchrun agent holds it) waits, at most `timeout` seconds, for every live rank to have
        stopped its own, whose next request would otherwise meet a closed connection (and torch print
        its trace). after_rank_0: how long a rank other than 0 first waits for rank 0 to reach its end,
        its output and messages done (a failed run: torchrun stops every rank once one ends with an
        error, and rank 0 may still be saying what failed); the heartbeat runs meanwhile, so a rank 0
        that stopped is seen."""
        try:
            if self.rank == 0:
                self._main.set(self._key("left/0"), b"1")
            deadline = time.monotonic() + after_rank_0  # before this rank counts as left: rank 0 may hold the store
            while (self.rank != 0 and 0 not in self.gone.union(self.silent) and time.monotonic() < deadline
                   and not self._main.check([self._key("left/0")])):
                time.sleep(POLL_SECONDS)
        except Exception:
            pass  # the store is gone: nobody is left to wait for
        self.stop()
        try:
            left = int(self._main.add(self._key("left"), 1))
            deadline = time.monotonic() + timeout
            while host and left < self.size - len(self.gone.union(self.silent)) and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)
                left = int(self._main.add(self._key("left"), 0))
        except Exception:
            pass  # the store is gone: nobody is left to wait for

    # -------------------------------------------------------------------------------- main thread

    def begin(self) -> None:
        """A new command: its reports and marks are new keys."""
        self.command += 1

    def news(self) -> str | None:
        """What the thread learnt that ends a wait: "store" (lost_store says why), "report" (a rank sent
        one: reports()), "silent" (the ranks in silent_seen stopped), or None."""
        if self.lost_store is not None:
            return "store"
        command, reports = self._reports
        if command == self.command and reports:
            return "report"
        silent = self.silent  # the thread replaces the list, never changes it: this one stays as read
        if silent:
            self.silent_seen = silent
            return "silent"
        return None

    def reports(self) -> dict[int, tuple[int, str | None]]:
        """{rank: (exit code, message)} of the reports sent for this command."""
        keys = [self._command_key(f"failure/{rank}") for rank in range(self.size)]
        try:
            return {rank: tuple(json.loads(self._main.get(key))) for rank, key in enumerate(keys)
                    if self._main.check([key])}
        except Exception as exc:
            raise StoreLost(first_line(exc)) from None

    def report(self, code: int, message: str | None) -> None:
        """Send this rank's failure to the others (before its end mark)."""
        try:
            self._main.set(self._command_key(f"failure/{self.rank}"), json.dumps([code, message]))
            self._main.add(self._command_key("failures"), 1)
        except Exception as exc:
            raise StoreLost(first_line(exc)) from None

    def done(self) -> None:
        """Mark the end of this rank's command: counted, and by rank (a rank that ended so did not stop)."""
        try:
            self._main.set(self._command_key(f"done/{self.rank}"), b"1")
            self._main.add(self._command_key("done"), 1)
        except Exception as exc:
            raise StoreLost(first_line(exc)) from None

    def wait_for_the_others(self, timeout: float, check=None) -> None:
        """Until every other rank has marked the end of the command or stopped (at most `timeout`
        seconds); check() is called between the reads (a signal's chance)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.lost_store is None:
            try:
                done = int(self._main.add(self._command_key("done"), 0))
            except Exception:
                return
            if done >= self.size - len(self.gone.union(self.silent)):  # this rank's mark included
                return
            if check is not None:
                check()
            time.sleep(POLL_SECONDS)

    def beats(self) -> list[bytes]:
        """The others' counters, read now (the main thread's own request)."""
        try:
            return self._main.multi_get([self._key(f"beat/{r}") for r in self.others]) if self.others else []
        except Exception as exc:
            raise StoreLost(first_line(exc)) from None

    def stopped_during(self, seconds: float, check=None) -> tuple[dict[int, tuple[int, str | None]], list[int]]:
        """After a connection closed: (the reports sent for this command, as soon as there are some: the
        rank that ended said why; else the ranks whose counter did not move in `seconds`, 2 beats or more,
        while the live ones beat whatever their main thread does, and that did not end the command)."""
        before = self.beats()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.news() == "report":
                return self.reports(), []
            if check is not None:
                check()
            time.sleep(POLL_SECONDS)
        reports = self.reports()
        if reports:
            return reports, []
        try:
            return {}, [rank for rank, was, now in zip(self.others, before, self.beats())
                        if was == now and not self._main.check([self._command_key(f"done/{rank}")])]
        except Exception as exc:
            raise StoreLost(first_line(exc)) from None
