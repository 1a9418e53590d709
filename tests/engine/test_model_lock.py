"""The model lock is fair and re-entrant, and a cancelled wait gives up without losing order.

Fairness is what keeps many lines on one model from starving each other (issue 30 item 8):
`threading.RLock` let the releasing thread take it again before a waiter woke."""

from __future__ import annotations

import threading
import time

import pytest

from irodori_speaker.cancel import CancelToken
from irodori_speaker.engine.hardware.lock import FairRLock, hold_model_lock
from irodori_speaker.errors import Cancelled


def _queue_up(lock: FairRLock, n: int, order: list[int]) -> list[threading.Thread]:
    threads = []
    for i in range(n):

        def take(i: int = i) -> None:
            with lock:
                order.append(i)

        th = threading.Thread(target=take)
        th.start()
        threads.append(th)
        while len(lock._queue) < i + 1:  # each waits in line before the next asks
            time.sleep(0.001)
    return threads


def test_waiters_get_the_lock_in_the_order_they_asked():
    lock, order = FairRLock(), []
    lock.acquire()
    threads = _queue_up(lock, 8, order)
    lock.release()
    for th in threads:
        th.join(5)
    assert order == list(range(8))


def test_the_holder_cannot_jump_the_queue_after_releasing():
    """The thread that releases and asks again goes behind the waiters (RLock let it cut in)."""
    lock, order = FairRLock(), []
    lock.acquire()
    threads = _queue_up(lock, 3, order)
    lock.release()
    with lock:
        order.append(-1)
    for th in threads:
        th.join(5)
    assert order == [0, 1, 2, -1]


def test_it_is_reentrant_and_only_its_holder_releases_it():
    lock = FairRLock()
    with lock, lock:
        assert lock.held_by_me()
    assert not lock.held_by_me()
    lock.acquire()
    err: list[BaseException] = []
    th = threading.Thread(target=lambda: err.append(_try_release(lock)))
    th.start()
    th.join(5)
    assert isinstance(err[0], RuntimeError)
    assert not lock.acquire(blocking=False) or lock.held_by_me()
    lock.release()


def _try_release(lock: FairRLock) -> BaseException | None:
    try:
        lock.release()
    except RuntimeError as e:
        return e
    return None


def test_a_wait_times_out_and_a_cancelled_wait_raises_and_leaves_the_line():
    lock = FairRLock()
    lock.acquire()
    result: list[bool] = []
    th = threading.Thread(target=lambda: result.append(lock.acquire(timeout=0.05)))
    th.start()
    th.join(5)
    assert result == [False] and len(lock._queue) == 0
    token, raised = CancelToken(), []

    def waiter() -> None:
        try:
            lock.acquire(cancel=token)
        except Cancelled as e:
            raised.append(e)

    th = threading.Thread(target=waiter)
    th.start()
    while not lock._queue:
        time.sleep(0.001)
    token.cancel("stop")
    th.join(5)
    assert len(raised) == 1 and len(lock._queue) == 0
    lock.release()
    assert lock.acquire(blocking=False)  # free again: nobody left in line
    lock.release()


def test_hold_model_lock_gives_up_on_cancel():
    token = CancelToken()
    token.cancel("stop")
    with pytest.raises(Cancelled), hold_model_lock(token):
        pass


@pytest.mark.parametrize("n", [2, 6])
def test_no_waiter_is_served_twice_before_another_once(n):
    """n threads each take the lock 20 times: between two turns of one, every other waiting
    thread has had its turn (round robin), which RLock did not give."""
    lock, turns = FairRLock(), []
    start = threading.Barrier(n)

    def worker(i: int) -> None:
        start.wait()
        for _ in range(20):
            with lock:
                turns.append(i)
                time.sleep(0.0005)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    # after everyone has queued once, turns come in rounds of all n threads
    middle = turns[n : len(turns) - n]
    for k in range(0, len(middle) - n, n):
        assert len(set(middle[k : k + n])) == n, turns
