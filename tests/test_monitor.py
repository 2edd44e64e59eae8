"""monitor.py: the ranks' heartbeats, failure reports and end marks through a store, in this process.

Two monitors share one TCPStore of this process, as two ranks share the run's store. The waits end on
what the threads see, so each check polls with a deadline far above the few heartbeats it needs.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from swcli.monitor import BEAT_SECONDS, Monitor, StoreLost


def eventually(condition, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.fixture
def pair():
    """Ranks 0 and 1 of 2 (silence: 1 s), on a prefix of a fresh store."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    store = dist.PrefixStore("run", server)
    ranks = [Monitor(store, rank, 2, 1.0) for rank in range(2)]
    for monitor in ranks:
        monitor.begin()
    yield ranks
    for monitor in ranks:
        monitor.stop()


def test_live_ranks_are_not_silent_and_a_stopped_one_is(pair):
    first, second = pair
    time.sleep(4 * BEAT_SECONDS)  # past the silence of 1 s: both beat meanwhile
    assert first.news() is None and second.news() is None
    second.stop()
    assert eventually(lambda: first.news() == "silent") and first.silent == [1]


def test_a_report_reaches_the_other_rank_for_its_command_only(pair):
    first, second = pair
    second.report(3, "q.fa: record 2")
    assert eventually(lambda: first.news() == "report")
    assert first.reports() == {1: (3, "q.fa: record 2")}
    first.begin()  # the next command: the last one's report is not news
    second.begin()
    assert eventually(lambda: first.news() is None)
    assert first.reports() == {}


def test_the_reporter_waits_for_the_others_end_marks(pair):
    first, second = pair
    second.report(1, None)
    second.done()
    started = time.monotonic()
    second.wait_for_the_others(0.5)  # rank 0 has not ended: the wait gives up at its limit
    assert time.monotonic() - started >= 0.5
    first.done()
    started = time.monotonic()
    second.wait_for_the_others(60.0)
    assert time.monotonic() - started < 30.0  # ended on rank 0's mark, not at the limit


def test_after_a_closed_connection_the_silent_rank_is_named_unless_it_reported(pair):
    first, second = pair
    second.stop()
    assert first.stopped_during(4 * BEAT_SECONDS) == ({}, [1])
    second.report(1, "RuntimeError: CUDA error")
    assert first.stopped_during(4 * BEAT_SECONDS) == ({1: (1, "RuntimeError: CUDA error")}, [])


def test_a_rank_that_ended_its_command_is_not_named_stopped(pair):
    first, second = pair
    second.done()
    second.stop()
    assert first.stopped_during(4 * BEAT_SECONDS) == ({}, [])


def test_a_store_that_is_gone_is_said():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))
    monitor = Monitor(client, 1, 2, 2.0)
    try:
        monitor.begin()
        del server  # the process that held it ended
        assert eventually(lambda: monitor.news() == "store") and monitor.lost_store
        with pytest.raises(StoreLost):
            monitor.reports()
    finally:
        monitor.stop()
