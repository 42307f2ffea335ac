"""The inference thread's hand-off (engine/runtime/threads.py): a greenlet's call runs on one
real thread, its result or exception comes back to that greenlet, and the loop keeps
serving other greenlets meanwhile."""

import os
import threading
import time

import gevent
import pytest

from smserve.engine.runtime.threads import ModelThread


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
    gate = threading.Event()
    job = gevent.spawn(thread.call, lambda: (gate.wait(5), seen.append(thread._signal.ref))[1])
    assert _poll(lambda: thread._signal.ref is True)  # while the call runs
    gate.set()
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


# ---------------------------------------------------------------- a caller that goes away
# A request's greenlet may be killed (its connection cut at the graceful timeout) or
# time out while its call still runs on the thread. The thread cannot be stopped, so
# its result still comes back: it must be dropped harmlessly, never handed to another
# call, never raised in the hub, and the watcher must go back to idle once it is in.


@pytest.fixture
def hub_errors(monkeypatch):
    """What the hub was asked to report (an error raised in a callback or a switch)."""
    hub = gevent.get_hub()
    seen = []
    original = hub.handle_error

    def record(context, kind, value, tb):
        seen.append((context, kind, value))
        return original(context, kind, value, tb)

    monkeypatch.setattr(hub, "handle_error", record, raising=False)
    return seen


def _poll(probe, timeout=5.0):
    """probe() once true, yielding to the loop between looks (so results are delivered)."""
    deadline = time.monotonic() + timeout
    while not probe() and time.monotonic() < deadline:
        gevent.sleep(0.005)
    return probe()


def _held(result):
    """A fn for the thread that runs until released, then returns result; and its gates."""
    running, release = threading.Event(), threading.Event()

    def fn():
        running.set()
        assert release.wait(10), "never released"
        return result

    return fn, running, release


def _wait_running(event):
    assert _poll(event.is_set), "the thread never started the call"


@pytest.mark.parametrize("how", ["kill", "kill-nowait", "timeout-exception", "timeout-false"])
def test_a_caller_killed_while_its_call_runs_gets_nothing_and_breaks_nothing(hub_errors, how):
    thread = ModelThread()
    fn, running, release = _held("the killed call's result")
    outcome = []

    def caller():
        if how == "timeout-exception":
            try:
                with gevent.Timeout(0.05):
                    outcome.append(thread.call(fn))
            except gevent.Timeout:
                outcome.append("timed out")
        elif how == "timeout-false":
            with gevent.Timeout(0.05, False):  # (the block is left quietly)
                outcome.append(thread.call(fn))
                return
            outcome.append("timed out")
        else:
            outcome.append(thread.call(fn))

    job = gevent.spawn(caller)
    _wait_running(running)
    if how == "kill":
        job.kill(block=True, timeout=5)
    elif how == "kill-nowait":
        gevent.kill(job)  # (returns at once: the exit lands from the loop)
        assert _poll(lambda: job.dead)
    else:
        job.join(5)
    assert job.dead
    if how.startswith("timeout"):
        assert job.successful() and outcome == ["timed out"]
    else:
        assert isinstance(job.value, gevent.GreenletExit)
    assert outcome in ([], ["timed out"])
    # The call is still out: the loop must still be kept alive for its result.
    assert thread._out == 1 and thread._signal.ref is True
    # Another call, queued behind the running one, gets its own result, not that one.
    later = gevent.spawn(thread.call, lambda: "the later call's result")
    gevent.sleep(0.01)
    release.set()
    later.join(5)
    assert later.value == (True, "the later call's result")
    assert _poll(lambda: thread._out == 0)
    assert thread._signal.ref is False
    assert outcome in ([], ["timed out"])  # nothing reached the dead caller
    # And the thread goes on serving, one call at a time and many at once.
    assert thread.call(lambda: 41 + 1) == (True, 42)
    jobs = [gevent.spawn(thread.call, lambda i=i: i) for i in range(50)]
    gevent.joinall(jobs, timeout=5, raise_error=True)
    assert [j.value for j in jobs] == [(True, i) for i in range(50)]
    assert thread._out == 0 and thread._signal.ref is False
    assert hub_errors == []
    thread.stop()


def test_a_greenlet_that_times_out_and_calls_again_gets_its_new_result_not_the_old_one(hub_errors):
    """The same greenlet, after its Timeout, calls again while the first call still
    runs: the first result must not answer the second call."""
    thread = ModelThread()
    fn, running, release = _held("stale")
    got = []

    def caller():
        try:
            with gevent.Timeout(0.05):
                thread.call(fn)
        except gevent.Timeout:
            pass
        _wait_running(running)
        gevent.spawn_later(0.02, release.set)  # the old call ends while the new one waits
        got.append(thread.call(lambda: "fresh"))
        got.append(thread.call(lambda: "fresher"))

    gevent.spawn(caller).join(5)
    assert got == [(True, "fresh"), (True, "fresher")]
    assert thread._out == 0 and thread._signal.ref is False
    assert hub_errors == []
    thread.stop()


def test_killing_many_waiting_callers_leaves_the_others_their_own_results(hub_errors):
    """Half of the callers queued on the thread are killed while they wait (one while
    its call runs, the others before theirs has started, which are then never run): each
    survivor gets exactly its own result, and the count of calls out comes back to zero."""
    thread = ModelThread()
    gate = threading.Event()
    thread_ran, began = [], []

    def work(i):
        began.append(i)
        gate.wait(10)
        thread_ran.append(i)
        time.sleep(0.0005)
        return i

    jobs = [gevent.spawn(thread.call, work, i) for i in range(60)]
    # every caller is now waiting in call(), and the thread has begun the first call
    assert _poll(lambda: thread._out == 60 and began == [0])
    victims = jobs[::2]
    gevent.killall(victims, block=True, timeout=5)
    assert all(j.dead for j in victims)
    gate.set()
    survivors = jobs[1::2]
    gevent.joinall(survivors, timeout=10, raise_error=True)
    assert [j.value for j in survivors] == [(True, i) for i in range(1, 60, 2)]
    assert all(isinstance(j.value, gevent.GreenletExit) for j in victims)
    # The call that had begun ran on; those whose callers left before it began never ran.
    assert _poll(lambda: thread._out == 0)
    assert thread_ran == [0] + list(range(1, 60, 2))
    assert thread._signal.ref is False
    assert thread.call(lambda: "after") == (True, "after")
    assert hub_errors == []
    thread.stop()
