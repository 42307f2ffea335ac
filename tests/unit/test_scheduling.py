"""make test's hand-out of tests to its xdist processes (tests/helpers/scheduling.py)."""

from __future__ import annotations

import pytest

from tests.helpers.scheduling import SERIAL_IDS_DIR, ModuleScheduling, read_serial_ids, write_serial_ids


@pytest.fixture
def scheduling(pytestconfig, monkeypatch):
    monkeypatch.setattr(pytestconfig.option, "loadscopereorder", True, raising=False)
    monkeypatch.setattr(pytestconfig.option, "tx", ["3*popen"], raising=False)
    return ModuleScheduling(pytestconfig)


def test_a_module_goes_whole_classes_and_parameters_included(scheduling):
    scopes = {scheduling._split_scope(nodeid) for nodeid in (
        "tests/integration/test_x.py::test_a", "tests/integration/test_x.py::TestB::test_c[1]",
        "tests/integration/test_x.py::test_d[json-application/json]")}
    assert scopes == {"tests/integration/test_x.py"}


def test_the_image_tests_go_as_one_unit_and_others_by_module(scheduling):
    assert scheduling._split_scope("tests/container/test_image.py::test_a") == \
        scheduling._split_scope("tests/container/test_streaming_image.py::test_b")
    assert scheduling._split_scope("tests/unit/test_a.py::test_a") != scheduling._split_scope("tests/unit/test_b.py::test_a")


def test_modules_go_out_in_collection_order(scheduling, pytestconfig):
    assert pytestconfig.option.loadscopereorder is False


class Process:
    """What the scheduler sees of an xdist process: the tests it was sent, a shutdown."""

    def __init__(self, name: str):
        self.sent, self.shutting_down = [], False
        self.gateway = type("Gateway", (), {"id": name})

    def send_runtest_some(self, indices):
        self.sent.extend(indices)

    def shutdown(self):
        self.shutting_down = True


COLLECTION = ["tests/unit/test_a.py::test_1", "tests/unit/test_a.py::test_2", "tests/unit/test_t.py::test_timed",
              "tests/unit/test_b.py::test_1", "tests/unit/test_t.py::test_other", "tests/unit/test_c.py::test_1",
              "tests/unit/test_r.py::test_timed"]
SERIAL_IDS = {"tests/unit/test_t.py::test_timed", "tests/unit/test_r.py::test_timed"}


def started(scheduling, processes):
    for process in processes:
        scheduling.add_node(process)
        scheduling.add_node_collection(process, COLLECTION)
    scheduling.serial = frozenset(SERIAL_IDS)
    scheduling.schedule()


def run_everything_sent(scheduling, process):
    for index in list(process.sent):
        if not scheduling.assigned_work[process][scheduling._split_scope(COLLECTION[index])][COLLECTION[index]]:
            scheduling.mark_test_complete(process, index)


def serial_sent(process) -> set[str]:
    return {COLLECTION[i] for i in process.sent} & SERIAL_IDS


def test_the_serial_tests_go_to_one_process_once_every_other_has_ended(scheduling):
    processes = [Process("gw0"), Process("gw1"), Process("gw2")]
    started(scheduling, processes)
    # Every module goes out, the serial tests' modules too, without their serial tests.
    assert not any(serial_sent(p) for p in processes)
    for process in processes:
        run_everything_sent(scheduling, process)
    assert not any(serial_sent(p) for p in processes), "sent while other processes still run"
    keeper = scheduling.keeper
    others = [p for p in processes if p is not keeper]
    assert keeper is not None and not keeper.shutting_down and all(p.shutting_down for p in others)
    scheduling.remove_node(others[0])
    assert not serial_sent(keeper)
    scheduling.remove_node(others[1])
    assert serial_sent(keeper) == SERIAL_IDS
    run_everything_sent(scheduling, keeper)
    assert keeper.shutting_down and scheduling.tests_finished
    assert sorted(i for p in processes for i in p.sent) == list(range(len(COLLECTION)))


def test_a_keeper_that_crashes_hands_the_serial_tests_to_another(scheduling):
    processes = [Process("gw0"), Process("gw1"), Process("gw2")]
    started(scheduling, processes)
    for process in processes:
        run_everything_sent(scheduling, process)
    keeper = scheduling.keeper
    for other in processes:
        if other is not keeper:
            scheduling.remove_node(other)
    assert serial_sent(keeper) == SERIAL_IDS
    assert scheduling.remove_node(keeper) in SERIAL_IDS  # died before running them: they go back
    survivor = Process("gw3")
    scheduling.add_node(survivor)
    scheduling.registered_collections[survivor] = COLLECTION
    scheduling.schedule()
    assert serial_sent(survivor) == SERIAL_IDS


def test_with_only_serial_tests_one_process_runs_them_at_once(scheduling):
    processes = [Process("gw0"), Process("gw1"), Process("gw2")]
    for process in processes:
        scheduling.add_node(process)
        scheduling.add_node_collection(process, sorted(SERIAL_IDS))
    scheduling.serial = frozenset(SERIAL_IDS)
    scheduling.schedule()
    (runner,) = [p for p in processes if p.sent]
    assert {sorted(SERIAL_IDS)[i] for i in runner.sent} == SERIAL_IDS


def test_each_process_writes_the_ids_of_its_serial_tests_for_the_controller(tmp_path, pytestconfig, monkeypatch):
    class Item:
        def __init__(self, nodeid, serial):
            self.nodeid, self.serial = nodeid, serial

        def get_closest_marker(self, name):
            return object() if name == "serial" and self.serial else None

    monkeypatch.setattr(pytestconfig, "workerinput", {"workerid": "gw1", SERIAL_IDS_DIR: str(tmp_path)}, raising=False)
    write_serial_ids(pytestconfig, [Item(nodeid, nodeid in SERIAL_IDS) for nodeid in COLLECTION])
    assert read_serial_ids(str(tmp_path)) == SERIAL_IDS
