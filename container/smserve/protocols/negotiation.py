"""Content negotiation: which media type an answer takes, from the request's Accept.

Read by the protocol table (dispatch.py) and by the response streams (streams.py),
below both of them.
"""

from __future__ import annotations

import functools

from werkzeug.datastructures import MIMEAccept
from werkzeug.http import parse_accept_header

from smserve.core import media
from smserve.errors import NotAcceptable
from smserve.settings import Settings


def default_accept(settings: Settings, request_kind: str) -> str:
    """SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT if set; in batch mode a CSV or JSON Lines
    request's own type, so AssembleWith=Line gets one line per record; else JSON."""
    if settings.default_accept:
        return settings.default_accept
    if settings.batch and request_kind in (media.CSV, media.JSONLINES):
        return request_kind
    return media.JSON


def accept_values(header: str | None) -> MIMEAccept:
    # Media-type parameters (charset=utf-8, header=present) are not ours to match on.
    parsed = parse_accept_header(header or "", MIMEAccept)
    return MIMEAccept([(value.split(";")[0].strip(), q) for value, q in parsed])


def preferred(header: str | None, default: str) -> str:
    """The client's most wanted concrete media type, for a user's output_fn."""
    for value, q in sorted(accept_values(header), key=lambda item: -item[1]):
        if q > 0 and "*" not in value:
            return value
    return default


def negotiate(header: str | None, default: str, offers: tuple[str, ...] = media.MEDIA_TYPES) -> str:
    """The best media type the Accept header allows (q-values honoured); 406 if none."""
    if not header:
        return default
    best = _best_match(header, default, offers)
    if best is None:
        raise NotAcceptable(f"cannot produce any of Accept: {header}; supported: {', '.join(offers)}")
    return best


@functools.lru_cache(maxsize=512)
def _best_match(header: str, default: str, offers: tuple[str, ...]) -> str | None:
    # Clients send the same few Accept headers again and again; parsing one with
    # werkzeug costs about 0.2 ms, a fifth of a small request's whole budget.
    # On a tie (e.g. */*) werkzeug prefers the earlier offer: the default comes first.
    aliases = media.ALIASES if offers == media.MEDIA_TYPES else {}
    candidates = [default] + [m for m in offers if m != default] + list(aliases)
    best = accept_values(header).best_match(candidates)
    return None if best is None else aliases.get(best, best)
