"""Which codec reads a text file: UTF-8, or the UTF-16 / UTF-32 a byte-order mark announces. Anything else is a
DataError whose hint gives the conversion command. One check for every reader of text files: the training
data's (`readers`, whole files) and batch prediction's (`records`, streamed)."""

from __future__ import annotations

import codecs
from pathlib import Path

from ttt_pipeline.errors import DataError

# Byte-order marks, longest first (UTF-32 LE starts with UTF-16 LE's mark). Spreadsheet programs and Windows
# editors write them: "Unicode text" from Excel is UTF-16 with a mark, "CSV UTF-8" is UTF-8 with one.
BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
PIECE = 1 << 20  # bytes decoded at a time by the streamed check


def convert_hint(path: Path, source: str) -> str:
    out = path.with_name(f"{path.stem}-utf8{path.suffix}")
    return f"convert it to UTF-8: `iconv -f {source} -t UTF-8 {path} > {out}`, then read {out.name}"


def _announced(head: bytes, path: Path) -> str:
    """The codec a file's first bytes announce (a byte-order mark; none: UTF-8). ASCII stored two bytes per
    character (valid UTF-8, full of NULs) is UTF-16 whose mark was stripped: a DataError naming it."""
    encoding = next((enc for bom, enc in BOMS if head.startswith(bom)), "utf-8-sig")
    first = head[:4096]
    if encoding == "utf-8-sig" and len(first) >= 4 and first.count(0) * 3 >= len(first):
        source = "UTF-16LE" if first[1::2].count(0) > first[0::2].count(0) else "UTF-16BE"
        raise DataError(f"{path}: UTF-16 text without a byte-order mark ({source}, by its zero bytes)",
                        convert_hint(path, source))
    return encoding


def text_encoding(path: Path, raw: bytes | None = None) -> str:
    """The codec that reads a text file (or `raw`, its decompressed bytes): UTF-8, or UTF-8 / UTF-16 / UTF-32
    announced by a byte-order mark (the codec drops the mark). Anything else is a DataError whose hint gives the
    conversion command; UTF-16 without a mark (NUL bytes between ASCII letters) is recognised and named."""
    raw = path.read_bytes() if raw is None else raw
    encoding = _announced(raw, path)
    try:
        raw.decode(encoding)
        return encoding
    except UnicodeDecodeError as exc:
        if encoding != "utf-8-sig":
            name = encoding.upper()
            raise DataError(f"{path}: starts with a {name} byte-order mark but is not valid {name} (byte offset "
                            f"{exc.start})", "re-export the file; " + convert_hint(path, name)) from None
        raise DataError(f"{path}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
                        "re-save the file as UTF-8; from Latin-1 / Windows-1252: " + convert_hint(path, "CP1252")
                        ) from None


def stream_encoding(path: Path) -> str:
    """What `text_encoding` answers, without holding the file: the mark and the check for UTF-16 without one
    read its head, the decoding check streams in pieces. A file that fails the decoding is handed to
    `text_encoding` itself, whose error names the byte (that path reads the whole file, once, to fail)."""
    with open(path, "rb") as f:
        head = f.read(PIECE)
        encoding = _announced(head, path)
        decoder = codecs.getincrementaldecoder(encoding)()
        try:
            piece = head
            while piece:
                decoder.decode(piece)
                piece = f.read(PIECE)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return text_encoding(path)  # raises, naming the byte
    return encoding
