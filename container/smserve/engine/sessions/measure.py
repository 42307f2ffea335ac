"""How much memory a session's state holds: tensors' and arrays' data, and every other
object it reaches at its own size, each once; counted a slice of objects at a time, so
that a big state never holds the event loop for long.
"""

from __future__ import annotations

import sys
import types

import gevent

from smserve.engine.runtime import main_lane

# Counting a state's memory (on the event loop, after each of its requests) looks at this
# many objects between two turns of the loop: a slice short next to /ping's deadline.
COUNTED_PER_TURN = 2_000


def state_size(state) -> int:
    """The bytes a session's state holds, where that can be told: tensors (their
    storage, on whatever device) and numpy arrays by their data, and every other object
    it reaches (strings, bytes, the lists, tuples, dicts and sets and objects holding
    them) by its own size; each object once."""
    walk = StateWalk(state)
    while not walk.step(COUNTED_PER_TURN):
        pass
    return walk.total


def count(state, limit: int) -> int:
    """state_size on the loop's main lane (torch may raise), a slice at a time, the loop
    serving others between; it stops once past limit (the state is over its bound)."""
    walk = StateWalk(state)
    while not main_lane.call(walk.step, COUNTED_PER_TURN, limit):
        gevent.sleep(0)
    return walk.total


class StateWalk:
    """A count of what a state holds, taken a slice of objects at a time."""

    def __init__(self, state):
        self.total = 0
        self._seen: set[int] = set()
        self._pending = [state]

    def step(self, objects: int, limit: float = float("inf")) -> bool:
        """Counts up to `objects` more; whether the count is done (or past limit)."""
        seen, pending, total, size = self._seen, self._pending, self.total, sys.getsizeof
        for _ in range(objects):
            if not pending or total > limit:
                break
            value = pending.pop()
            if id(value) in seen:
                continue
            seen.add(id(value))
            kind = type(value)  # (the common kinds first, by type: most of a big state is these)
            if kind in _LEAVES:
                total += size(value)
            elif kind is dict:
                pending.extend(value.keys())
                pending.extend(value.values())
                total += size(value)
            elif kind in _SEQUENCES:
                pending.extend(value)
                total += size(value)
            else:
                try:
                    total += _own_size(value, pending)
                except Exception:  # noqa: BLE001 - an object that will not say what it holds counts as nothing
                    pass
        self.total = total
        return not pending or total > limit


_LEAVES = frozenset({str, bytes, int, float, bool, complex, type(None)})
_SEQUENCES = frozenset({list, tuple, set, frozenset})
_SHARED = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def _own_size(value, pending: list) -> int:
    """The bytes value holds by itself (a tensor's or array's data, else its size as
    Python tells it); what it refers to goes on pending."""
    try:
        nbytes = getattr(value, "nbytes", None)
    except Exception:  # noqa: BLE001 - a sparse or meta tensor has no storage to count
        nbytes = _tensor_bytes(value)
    if isinstance(nbytes, int):  # numpy arrays, and torch tensors (element size x count)
        return nbytes
    if isinstance(value, _SHARED):  # code, not state: what it reaches is the process's
        return 0
    if isinstance(value, dict):
        pending.extend(value.keys())
        pending.extend(value.values())
    elif isinstance(value, (list, tuple, set, frozenset)):
        pending.extend(value)
    elif not isinstance(value, (bytes, bytearray, memoryview, str)):
        if hasattr(value, "__dict__"):
            pending.append(vars(value))
        slots = getattr(value, "__slots__", ())
        pending.extend(getattr(value, name, None) for name in ((slots,) if isinstance(slots, str) else slots))
    return sys.getsizeof(value)


def _tensor_bytes(value) -> int | None:
    """What a tensor without one storage holds (a sparse one's values and indices, a
    nested one's buffer), or None where it holds no data (meta) or is no tensor."""
    try:
        if getattr(value, "is_sparse", False):  # COO: its values and their indices
            return sum(int(t.element_size() * t.numel()) for t in (value._values(), value._indices()))
        if value.device.type == "meta":
            return 0
        return int(value.element_size() * value.numel())
    except Exception:  # noqa: BLE001 - counted as an object instead
        return None
