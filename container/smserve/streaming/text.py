"""Text messages whose bytes come in pieces: a streamed answer's chunks, a stream_fn's
items. RFC 6455 lets a text message's fragments split a character; wsproto does not
(each frame it sends is a str), so each frame carries the characters complete so far
and holds back the first bytes of one that a piece ends inside."""

from __future__ import annotations

import codecs

from smserve.protocols.streams import to_json


class TextPieces:
    """The text of one text message, piece by piece. Bytes that are not text in the
    answer's charset (UTF-8 unless its Content-Type names another) come out as U+FFFD:
    the message stays text, as its type says."""

    def __init__(self, media: str = ""):
        self.charset = charset(media)
        self.decoder = codecs.getincrementaldecoder(self.charset)("strict")
        self.invalid = False

    def piece(self, data, final: bool = False) -> str:
        try:
            return self.decoder.decode(data, final)
        except UnicodeDecodeError:
            # From here on with replacement, starting over at the bytes held back.
            pending = self.decoder.getstate()[0]
            self.decoder = codecs.getincrementaldecoder(self.charset)("replace")
            self.invalid = True
            return self.decoder.decode(pending + bytes(data), final)

    def end(self) -> str:
        """The message's last characters: an incomplete one left at the end is U+FFFD."""
        return self.piece(b"", final=True)

    @property
    def pending(self) -> bool:
        """Bytes of an incomplete character are held back."""
        return bool(self.decoder.getstate()[0])


def charset(media: str) -> str:
    """The charset a Content-Type names, if Python knows it as a text encoding; else UTF-8."""
    for param in media.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            try:
                info = codecs.lookup(value.strip().strip('"'))
            except LookupError:
                break
            if getattr(info, "_is_text_encoding", True):  # (not base64, rot13, ...)
                return info.name
            break
    return "utf-8"


def item_payload(item, text: TextPieces | None, line: bool = False):
    """One item a stream_fn yielded, as a frame's payload of the message's type (text
    when `text` holds the message's decoder); other values than str and bytes as JSON
    (a line each, in a fragmented message)."""
    if isinstance(item, str):
        if text is None:
            return item.encode("utf-8")
        # (Behind the bytes of a character that the items before left incomplete.)
        return text.piece(item.encode("utf-8")) if text.pending else item
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item) if text is None else text.piece(item)
    encoded = to_json(item) + (b"\n" if line else b"")
    return encoded if text is None else text.piece(encoded)
