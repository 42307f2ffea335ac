"""The multi-model registry's state changes are compare-and-set: a change applies only to
the generation it names, in a state it allows. An unload racing another unload, or a
load's last step racing an unload, must neither revive a removed generation nor write
over a newer one (one full run saw an unload answer 409 for this)."""

import multiprocessing

from smserve.engine.multimodel.registry import LOADING, READY, UNLOADING, SharedRegistry


def test_a_second_withdrawal_of_one_generation_is_refused(tmp_path):
    shared = SharedRegistry(str(tmp_path))
    entry = shared.claim("m", "/opt/ml/models/m")
    assert shared.set_state(entry, READY, only_from=(LOADING,)).state == READY
    first = shared.set_state(entry, UNLOADING, only_from=(LOADING, READY))
    assert first is not None and first.state == UNLOADING
    assert shared.set_state(entry, UNLOADING, only_from=(LOADING, READY)) is None
    assert shared.get("m").state == UNLOADING


def test_a_stale_change_leaves_a_newer_generation_alone(tmp_path):
    shared = SharedRegistry(str(tmp_path))
    old = shared.claim("m", "/a")
    shared.remove(old)
    new = shared.claim("m", "/b")
    assert shared.set_state(old, UNLOADING, only_from=(LOADING, READY)) is None
    assert shared.set_state(old, READY, only_from=(LOADING,)) is None
    assert shared.get("m") == new
    shared.remove(old)  # the old generation's removal leaves the new one
    assert shared.get("m") == new


def test_a_load_cannot_finish_once_its_unload_began(tmp_path):
    shared = SharedRegistry(str(tmp_path))
    entry = shared.claim("m", "/a")
    assert shared.set_state(entry, UNLOADING, only_from=(LOADING, READY)) is not None
    assert shared.set_state(entry, READY, only_from=(LOADING,)) is None
    assert shared.get("m").state == UNLOADING


def _withdraw_many(root, generation, tries, wins):
    shared = SharedRegistry(root)
    entry = shared.get("m")
    won = 0
    for _ in range(tries):
        if entry.generation == generation and shared.set_state(entry, UNLOADING, only_from=(READY,)) is not None:
            won += 1
    wins.put(won)


def test_exactly_one_process_wins_a_change(tmp_path):
    """The lock holds across processes (the workers are processes)."""
    shared = SharedRegistry(str(tmp_path))
    entry = shared.claim("m", "/a")
    shared.set_state(entry, READY, only_from=(LOADING,))
    wins = multiprocessing.get_context("fork").Queue()
    procs = [multiprocessing.get_context("fork").Process(target=_withdraw_many,
                                                         args=(str(tmp_path), entry.generation, 50, wins))
             for _ in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(30)
    assert sum(wins.get(timeout=5) for _ in procs) == 1
