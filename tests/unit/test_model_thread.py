"""The inference thread's hand-off (engine/model_thread.py): a greenlet's call runs on one
real thread, its result or exception comes back to that greenlet, and the loop keeps
serving other greenlets meanwhile."""

import os
import threading
import time

import gevent
import pytest

from smserve.engine.model_thread import ModelThread


def test_a_call_runs_on_the_thread_and_its_result_comes_back():
    thread = ModelThread()
    ok, value = thread.call(lambda a, b: (threading.get_ident(), a + b), 2, 3)
    assert ok and value[1] == 5
    assert value[0] != threading.get_ident()
    thread.stop()


def test_an_exception_comes_back_as_a_value_and_the_thread_goes_on():
    thread = ModelThread()

    def fails():
        raise ValueError("broken")

    ok, value = thread.call(fails)
    assert not ok and isinstance(value, ValueError) and str(value) == "broken"
    assert thread.call(lambda: 7) == (True, 7)
    thread.stop()


def test_the_first_task_runs_before_any_call_on_the_same_thread():
    seen = []
    thread = ModelThread(first=lambda: seen.append(threading.get_ident()))
    ok, ident = thread.call(threading.get_ident)
    assert ok and seen == [ident]
    thread.stop()


def test_the_loop_serves_other_greenlets_while_a_call_runs():
    thread = ModelThread()
    ticks = []

    def ticker():
        while len(ticks) < 5:
            ticks.append(time.monotonic())
            gevent.sleep(0.01)

    ticking = gevent.spawn(ticker)
    ok, _ = thread.call(time.sleep, 0.2)  # a real thread's sleep: only that thread waits
    assert ok
    assert len(ticks) == 5  # every tick happened during the call
    ticking.join()
    thread.stop()


def test_many_greenlets_each_get_their_own_result():
    thread = ModelThread()
    jobs = [gevent.spawn(thread.call, lambda i=i: (time.sleep(0.001), i)[1]) for i in range(200)]
    gevent.joinall(jobs, raise_error=True)
    assert [job.value for job in jobs] == [(True, i) for i in range(200)]
    thread.stop()


def test_the_thread_does_not_keep_an_idle_loop_alive_but_a_waiting_call_does():
    """Its watcher holds a reference on the loop only while a call is out: an idle
    thread never keeps a loop from ending, and a greenlet waiting for a result never
    sees "this operation would block forever"."""
    thread = ModelThread()
    assert thread._signal.ref is False
    seen = []
    job = gevent.spawn(thread.call, lambda: (time.sleep(0.05), seen.append(thread._signal.ref))[0])
    gevent.sleep(0.01)
    assert thread._signal.ref is True
    job.join(timeout=5)
    assert job.value == (True, None) and seen == [True]
    assert thread._signal.ref is False
    thread.stop()


def test_after_stop_a_call_is_refused_and_the_thread_ends():
    thread = ModelThread()
    native = thread.call(threading.get_native_id)[1]
    task = f"/proc/self/task/{native}"
    assert os.path.exists(task)
    thread.stop()
    deadline = time.monotonic() + 5
    while os.path.exists(task) and time.monotonic() < deadline:
        gevent.sleep(0.01)
    assert not os.path.exists(task)
    ok, value = thread.call(lambda: 1)
    assert not ok and isinstance(value, RuntimeError)


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_even_a_base_exception_comes_back_to_the_caller(raised):
    thread = ModelThread()

    def fails():
        raise raised()

    ok, value = thread.call(fails)
    assert not ok and isinstance(value, raised)
    assert thread.call(lambda: 1) == (True, 1)
    thread.stop()
