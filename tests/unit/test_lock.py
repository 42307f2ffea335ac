"""The lock agrees with the top-level pins people edit (else: `make lock`)."""

from __future__ import annotations

import re

import pytest

from tests.helpers.server import ROOT

PIN = re.compile(r"^([A-Za-z0-9_.-]+)(?:\[[^]]*\])?==(\S+)", re.MULTILINE)


def pins(path) -> dict[str, str]:
    text = path.read_text()
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in PIN.findall(text)}


def top_level(path) -> dict[str, str]:
    found = pins(path)
    for included in re.findall(r"^-r\s+(\S+)", path.read_text(), re.MULTILINE):
        found |= top_level((path.parent / included).resolve())
    return found


@pytest.mark.parametrize("source, lock, without_torch", [
    ("requirements-dev.txt", "lock/dev.txt", False),
    ("requirements-dev.txt", "lock/dev-no-torch.txt", True),
    ("lock/image.in", "lock/image.txt", False),
    ("lock/image.in", "lock/image-no-torch.txt", True),
])
def test_every_top_level_pin_is_locked_at_its_version(source, lock, without_torch):
    wanted = top_level(ROOT / source)
    locked = pins(ROOT / lock)
    if without_torch:
        assert "torch" not in locked
        wanted.pop("torch")
    assert {name: locked.get(name) for name in wanted} == wanted


def test_the_installer_is_locked_alone_at_its_pin():
    """make install has pip install lock/uv.txt, and uv everything else."""
    assert pins(ROOT / "lock/uv.txt") == {"uv": top_level(ROOT / "requirements-dev.txt")["uv"]}


def test_image_input_carries_the_one_torch_pin():
    assert top_level(ROOT / "lock/image.in")["torch"] == top_level(ROOT / "requirements-dev.txt")["torch"]


def test_every_locked_package_has_a_hash():
    for name in ("dev.txt", "dev-no-torch.txt", "image.txt", "image-no-torch.txt", "uv.txt"):
        text = (ROOT / "lock" / name).read_text()
        entries = re.findall(r"^\S+==\S+((?:\s*\\\n\s+--hash=sha256:[0-9a-f]{64})*)", text, re.MULTILINE)
        assert entries and all(hashes for hashes in entries), name
