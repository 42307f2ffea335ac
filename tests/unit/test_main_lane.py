"""The main lane: torch work from the loop's greenlets runs on the main greenlet, where a
torch error unwinds the thread's own stack and is raised as an exception to the caller."""

import threading

import gevent
import pytest
import torch
from greenlet import getcurrent

from smserve.engine.runtime import main_lane


def where() -> tuple[bool, int]:
    return getcurrent().parent is None, threading.get_ident()


def test_a_greenlets_call_runs_on_the_main_greenlet_and_its_torch_error_is_raised_to_it():
    def body():
        def one(i):
            on_main, thread = main_lane.call(where)
            with pytest.raises(TypeError, match="BFloat16"):
                main_lane.call(lambda: torch.zeros(2, dtype=torch.bfloat16).numpy())
            return i, on_main, thread

        return [g.value for g in gevent.joinall([gevent.spawn(one, i) for i in range(20)], raise_error=True)]

    results = main_lane.run(body)
    assert [r[0] for r in results] == list(range(20))
    assert all(on_main and thread == threading.get_ident() for _, on_main, thread in results)


def test_a_call_made_while_the_main_greenlet_is_busy_waits_its_turn():
    order = []

    def blocks():  # a call that waits on the hub: others queue meanwhile
        order.append("first starts")
        gevent.sleep(0.01)
        order.append("first ends")
        return 1

    def body():
        first = gevent.spawn(main_lane.call, blocks)
        gevent.sleep(0)
        second = gevent.spawn(main_lane.call, lambda: order.append("second") or 2)
        return first.get(), second.get()

    assert main_lane.run(body) == (1, 2)
    assert order == ["first starts", "first ends", "second"]


def test_the_bodys_exception_is_raised_by_run_and_the_lane_can_serve_again():
    with pytest.raises(ValueError, match="body failed"):
        main_lane.run(lambda: (_ for _ in ()).throw(ValueError("body failed")))
    assert main_lane.run(lambda: gevent.spawn(main_lane.call, where).get())[0]


def test_without_a_served_lane_a_greenlets_call_runs_on_a_real_thread():
    _, thread = gevent.spawn(main_lane.call, where).get()
    assert thread != threading.get_ident()
    assert main_lane.call(where) == (True, threading.get_ident())  # the main greenlet itself: here


def test_a_call_from_another_thread_runs_there():
    from gevent.threadpool import ThreadPool

    def body():
        pool = ThreadPool(1)
        try:
            return pool.apply(main_lane.call, (lambda: threading.get_ident(),))
        finally:
            pool.kill()

    assert main_lane.run(body) != threading.get_ident()


class Held:
    """A value whose life a weak reference shows (a request's inputs, its answer)."""


def test_the_main_greenlet_keeps_nothing_of_a_call_while_it_waits_for_the_next():
    import weakref

    def body():
        def one():
            value = Held()
            answer = main_lane.call(lambda v: (v, Held()), value)  # the argument and the outcome
            refs = [weakref.ref(value), weakref.ref(answer[1])]
            del value, answer
            return refs

        lone = gevent.spawn(one).get()  # switched to the parked main greenlet
        busy = gevent.spawn(main_lane.call, gevent.sleep, 0.01)
        gevent.sleep(0)
        queued = gevent.spawn(one)  # made while the main greenlet is busy: queued
        busy.get()
        refs = lone + queued.get()
        gevent.sleep(0.01)  # the main greenlet parked again, in the hub
        return [ref() is None for ref in refs]

    assert main_lane.run(body) == [True] * 4
