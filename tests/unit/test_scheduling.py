"""make test's hand-out of tests to its xdist processes (tests/helpers/scheduling.py)."""

from __future__ import annotations

import pytest

from tests.helpers.scheduling import ModuleScheduling


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
