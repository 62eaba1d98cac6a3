"""Text files users give (passages, hparams): UTF-8, or UTF-8/UTF-16 with a byte-order mark;
anything else is refused in one line naming the file and the encoding it looks like
(``charset_normalizer``'s guess)."""

from __future__ import annotations

import codecs
import os
from pathlib import Path

__all__ = ["TextEncodingError", "decode_text", "read_text"]

_BOMS = (
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


class TextEncodingError(ValueError):
    """A file is not text in an encoding read without guessing; the message names it and the fix."""


def decode_text(data: bytes, name: str) -> str:
    """``data`` as text: by its byte-order mark where it has one, else as UTF-8."""
    for (
        bom,
        encoding,
    ) in _BOMS:  # UTF-32 LE's mark starts with UTF-16 LE's: the longer ones are tried first
        if data.startswith(bom):
            try:
                return data.decode(encoding)
            except UnicodeDecodeError:
                break
    else:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    from charset_normalizer import from_bytes

    best = from_bytes(data).best()
    looks = f"it looks like {best.encoding}" if best is not None else "it does not look like text"
    raise TextEncodingError(
        f"{name}: not UTF-8 ({looks}); save it as UTF-8 (e.g. iconv -f "
        f"{best.encoding if best else 'ENCODING'} -t utf-8 {name} > fixed.txt)"
    )


def read_text(path: str | os.PathLike) -> str:
    """The text of a user's file (see ``decode_text``)."""
    return decode_text(Path(path).read_bytes(), os.fspath(path))
