"""Request heads in one pass where they are plain, in gunicorn's parser where they are not.

gunicorn's Python parser spends ~25-30 us on a usual head (split into lines, a regex
and a str decode per line, the peer's address parsed for the forwarded-headers check on
every request), a sixth of a batch-1 request's CPU here. Most heads are plain: an
origin-form target, HTTP/1.0 or 1.1, `Name: value` lines of allowed bytes. Such a head
is read by two regular expressions here (~13 us) and each field is then judged by
gunicorn's own header policy (singleton fields, Expect, scheme headers, underscores),
so the request comes out exactly as gunicorn's parser makes it. Anything else (a head not all read yet, a bare
LF, obsolete line folding, a limit reached, an odd target or method, the PROXY
protocol) goes to gunicorn's parser from its first byte, which answers as it always
did.
"""

from __future__ import annotations

import re

from gunicorn.http.message import Request
from gunicorn.http.parser import RequestParser

from smserve import memo

# The methods a model server is asked with; any other goes to gunicorn's parser.
_METHODS = rb"GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH"
# origin-form only: "/" then visible ASCII, no '#' (a fragment) and not "//" (which
# gunicorn reads specially), ending in HTTP/1.0 or HTTP/1.1.
_REQUEST_LINE = re.compile(rb"(" + _METHODS + rb") (/(?!/)[!-\"$-~]*) HTTP/1\.([01])\r\n")
# RFC 9110's token for a name; a value of field-vchar, SP and HTAB (obs-text included,
# as gunicorn takes it), its surrounding blanks dropped as gunicorn drops them. A field
# starts a line (only those cover the head): the search tries no start inside a line,
# each of which would scan that line's rest again (quadratic in a long line).
_FIELD = re.compile(rb"(?<=\n)([!#$%&'*+\-.^_`|~0-9A-Za-z]+):([\t\x20-\x7e\x80-\xff]*)\r\n")
_BLANKS = b" \t"

# Peers whose trust for forwarded headers is known (the answer depends only on the
# address and the worker's fixed configuration), at most this many.
TRUSTED_PEERS_MAX = 1024


class PlainHeadRequest(Request):
    """gunicorn's Request, read in one pass when its head is plain (module docstring)."""

    def parse(self, unreader):
        buf = bytearray()
        self.read_into(unreader, buf, stop=True)
        if self.cfg.proxy_protocol == "off":
            rest = self._parse_plain(buf)
            if rest is not None:
                return rest
        unreader.unread(bytes(buf))  # from its first byte, as if never looked at
        return super().parse(unreader)

    def _parse_plain(self, buf: bytearray) -> bytes | None:
        """The part of buf after a plain head, with this request filled in from it;
        None (and nothing filled in) when the head is not plain or not all in buf."""
        end = buf.find(b"\r\n\r\n") + 2  # (the last field's line end)
        if end < 2 or end + 2 > self.max_buffer_headers:
            return None
        line = _REQUEST_LINE.match(buf)
        if line is None or 0 < self.limit_request_line < line.end() - 2:
            return None
        fields = list(_FIELD.finditer(buf, line.end(), end))
        sizes = [f.end() - f.start() for f in fields]
        limit = self.limit_request_field_size
        # Matches found one after another cover the head only when no byte between them
        # was left out: a line no field matches makes the sum fall short.
        if (sum(sizes) != end - line.end() or len(fields) > self.limit_request_fields
                or (limit > 0 and max(sizes, default=0) > limit)):
            return None
        self.method = line.group(1).decode("ascii")
        self.uri = line.group(2).decode("ascii")
        self.path, _, self.query = self.uri.partition("?")
        self.fragment = ""
        self.version = (1, 1) if line.group(3) == b"1" else (1, 0)
        headers = []
        scheme_state = [False]
        seen = set()
        secure_scheme_headers, forwarder_headers = self._peer_trusted_for_forwarded()
        policy = self._apply_header_policy
        for field in fields:
            name, value = field.groups()
            kept = policy(name.decode("ascii").upper(), value.strip(_BLANKS).decode("latin-1"), scheme_state, seen,
                          secure_scheme_headers, forwarder_headers)
            if kept is not None:
                headers.append(kept)
        self.headers = headers
        return bytes(memoryview(buf)[end + 2:])

    def _peer_trusted_for_forwarded(self):
        """gunicorn's answer, looked up once per peer address: it parses the address
        on every request otherwise (a SettledConfig holds the answers)."""
        peers = getattr(self.cfg, "trusted_peers", None)
        if peers is None or not isinstance(self.peer_addr, tuple):
            return super()._peer_trusted_for_forwarded()
        host = self.peer_addr[0]
        trusted = peers.get(host)
        if trusted is None:
            trusted = memo.keep(peers, host, self._peer_is_trusted_proxy(), TRUSTED_PEERS_MAX)
        return (self.cfg.secure_scheme_headers, self.cfg.forwarder_headers) if trusted else ({}, [])


class PlainHeadParser(RequestParser):
    mesg_class = PlainHeadRequest
