"""NumPy .npz bodies (np.savez, np.savez_compressed): several named arrays in one zip,
its members taken out here.

Each member `<name>.npy` is read by simple.read_npy, so the same rules hold as for a .npy
body: numeric dtypes only and nothing unpickled (what np.load's allow_pickle=False
promises), and a header's shape checked against the bytes that follow it before any
array exists. A compressed member is inflated into at most `max_bytes` over the whole
archive, as a body sent with Content-Encoding is, so a small body cannot claim a big array.
"""

from __future__ import annotations

import io
import zipfile
from typing import Iterator

from smserve.errors import BadRequest, PayloadTooLarge

# Far more than any model's inputs; each member costs a directory entry to parse.
MAX_MEMBERS = 1024
_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)  # what np.savez and np.savez_compressed write


def members(body: bytes, max_bytes: int) -> Iterator[tuple[str, bytes]]:
    """An .npz body's members, in the archive's order: (array name, its .npy bytes),
    each taken out only once the caller has read the one before it.

    zipfile reads a malformed archive with many kinds of exception besides BadZipFile,
    each seen in fuzzed bodies: ValueError for a negative seek (a bad offset) or an
    entry flagged UTF-8 whose name is not, NotImplementedError for a "zip file version
    14.8" it does not read, RuntimeError for an encrypted member, zlib.error while
    inflating. Any of them from zipfile is the body's fault: a 400, never a 500."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(body))
        entries = archive.infolist()
    except Exception as e:  # noqa: BLE001 - zipfile raises many kinds (above)
        raise BadRequest(f"body is not a valid .npz archive: {type(e).__name__}: {e}") from None
    if len(entries) > MAX_MEMBERS:
        raise BadRequest(f"the .npz archive holds {len(entries)} members; at most {MAX_MEMBERS} are read")
    if not entries:
        raise BadRequest("the .npz archive holds no arrays")
    names: set[str] = set()
    total = 0
    for member in entries:
        name = member.filename
        if not name.endswith(".npy"):
            raise BadRequest(f"the .npz member {name[:80]!r} is not a .npy array")
        key = name[: -len(".npy")]
        if key in names:
            raise BadRequest(f"the .npz archive holds two arrays named {key[:80]!r}")
        if member.compress_type not in _METHODS:
            raise BadRequest(f"the .npz member {name[:80]!r} is compressed in a way numpy does not write")
        room = max_bytes - total
        try:
            with archive.open(member) as stream:
                data = stream.read(room + 1)  # at most one byte past the room: enough to refuse
        except Exception as e:  # noqa: BLE001 - as above
            raise BadRequest(f"the .npz member {name[:80]!r} cannot be read: {type(e).__name__}: {e}") from None
        if len(data) > room:
            raise PayloadTooLarge(f"the .npz body's arrays exceed the maximum allowed size of {max_bytes} bytes")
        total += len(data)
        names.add(key)
        yield key, data
