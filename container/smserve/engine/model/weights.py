"""A torch.export archive's weights read without holding the GIL.

torch.export.load reads each weight with one call into C++ (PyTorchFileReader's
get_storage_from_record) that holds the GIL while it copies the record out of the
file, for as long as the weight is big, during which the worker's event loop cannot
answer anything, /ping included (a multi-model endpoint loads while it
serves; a GB-sized weight would hold it past SageMaker's 2 s). Here each weight's
record is read instead with os.preadv into the tensor's own memory, in 4 MB pieces:
the copy and the page faults happen in the kernel, GIL released, and the loop runs
between pieces. Same bytes, same tensors, same time.

A weight is read this way only when its record is stored as the archive writer stores
it (uncompressed, where the zip's local header says); any other record, or an archive
given as a buffer rather than a path, goes through torch's own reader. TorchScript
(torch.jit.load) reads its weights in one C++ call with no such hook: its loads hold
the GIL for as long (docs/multi-model.md says so).
"""

from __future__ import annotations

import contextlib
import os
import struct

from gevent import monkey

PIECE = 4 << 20
_LOCAL_HEADER = struct.Struct("<I4xH16xHH")  # signature, compression method, name and extra lengths
_LOCAL_SIGNATURE = 0x04034B50
_STORED = 0

_swap = monkey.get_original("_thread", "allocate_lock")()  # real: loads on several threads take it
_users = 0
_original = None


class _Records:
    """A PyTorchFileReader whose tensor records are read with the GIL released."""

    def __init__(self, reader, path: str):
        self._reader, self._path = reader, path

    def __getattr__(self, name):
        return getattr(self._reader, name)

    def get_storage_from_record(self, name: str, numel: int, dtype):
        import torch

        size = self._reader.get_record_size(name)
        if size != numel * dtype.itemsize:
            return self._reader.get_storage_from_record(name, numel, dtype)
        with open(self._path, "rb", buffering=0) as f:
            start = _data_offset(f.fileno(), self._reader.get_record_header_offset(name))
            if start is None or start != self._reader.get_record_offset(name):
                return self._reader.get_storage_from_record(name, numel, dtype)
            raw = torch.empty(size, dtype=torch.uint8)
            read_into(f.fileno(), memoryview(raw.numpy()), start, name)
        return raw.view(dtype)


def _data_offset(fd: int, header_offset: int) -> int | None:
    """Where a stored (uncompressed) record's bytes begin, from its local header; None
    for a record that is not stored plainly."""
    head = os.pread(fd, _LOCAL_HEADER.size, header_offset)
    if len(head) != _LOCAL_HEADER.size:
        return None
    signature, method, name_len, extra_len = _LOCAL_HEADER.unpack(head)
    if signature != _LOCAL_SIGNATURE or method != _STORED:
        return None
    return header_offset + _LOCAL_HEADER.size + name_len + extra_len


def read_into(fd: int, view: memoryview, offset: int, what: str) -> None:
    """Fills view from fd at offset, PIECE bytes a call (os.preadv releases the GIL)."""
    done, size = 0, len(view)
    while done < size:
        n = os.preadv(fd, [view[done:done + PIECE]], offset + done)
        if n <= 0:
            raise EOFError(f"{what}: the file ends {size - done} bytes short of the record")
        done += n


@contextlib.contextmanager
def gil_free_reads():
    """While inside, torch.export.load(path) reads weights with the GIL released. The
    swap is process-wide (torch looks its reader class up at each load); concurrent
    users share it, and the last one out puts torch's own back. A torch without the
    pieces this relies on loads as it always did."""
    global _users, _original
    try:
        from torch.export.pt2_archive import _package
    except ImportError:
        yield
        return
    with _swap:
        if _users == 0:
            _original = _package.PT2ArchiveReader
            _package.PT2ArchiveReader = _reader_class(_original)
        _users += 1
    try:
        yield
    finally:
        with _swap:
            _users -= 1
            if _users == 0:
                _package.PT2ArchiveReader = _original


def _reader_class(original):
    class Reader(original):
        def __init__(self, archive, *args, **kwargs):
            super().__init__(archive, *args, **kwargs)
            file = getattr(self, "archive_file", None)
            if isinstance(archive, (str, os.PathLike)) and all(
                    hasattr(file, m) for m in ("get_record_header_offset", "get_record_offset", "get_record_size")):
                self.archive_file = _Records(file, os.fspath(archive))

    return Reader
