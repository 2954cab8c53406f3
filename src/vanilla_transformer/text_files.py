"""Reading text files one sentence a line, as corpora, inputs and references come: UTF-8, plain or gzip, or standard
input. The one reader of the package (data loading, tokenizer training, the translate and evaluate commands), and the
one writer of the commands' outputs (`output_file`).
"""

import codecs
import contextlib
import gzip
import os
import secrets
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

PathLike = str | os.PathLike


class InvalidUTF8Error(ValueError):
    """A line of an input that is not UTF-8; the message names the file, the line, the byte and its column."""


def iter_lines(path: PathLike | None = None) -> Iterator[str]:
    """The lines of a UTF-8 text file (read as gzip when its name ends in `.gz`), or of standard input when `path` is
    None or "-", one at a time and without their line endings.

    Lines are split on "\\n" only, never on the Unicode separators `str.splitlines` knows, so line N of the file is
    the N-th item and parallel files stay aligned; a "\\r" before the "\\n" and a leading byte-order mark are dropped.
    A byte that is not UTF-8 raises `InvalidUTF8Error`, naming the file, the line and the column.
    """
    if path is None or str(path) == "-":
        yield from _decode_lines(sys.stdin.buffer, "<stdin>")
        return
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as file:
        yield from _decode_lines(file, str(path))


def read_lines(path: PathLike | None = None) -> list[str]:
    """All the lines of `path` (standard input when None or "-") as `iter_lines` reads them."""
    return list(iter_lines(path))


def _decode_lines(file, name: str) -> Iterator[str]:
    for number, raw in enumerate(file, 1):
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            column = len(raw[: error.start].decode("utf-8")) + 1  # in characters, as editors count
            raise InvalidUTF8Error(
                f"{name}: line {number} is not valid UTF-8 (byte 0x{raw[error.start]:02x} at column {column})"
            ) from None
        yield line.rstrip("\r\n")


@contextlib.contextmanager
def output_file(path: PathLike | None = None) -> Iterator[TextIO]:
    """A UTF-8 text file to write to ("\\n" line endings): standard output when `path` is None or "-"; otherwise a new
    file next to `path`, renamed to `path` when the block ends and deleted when it raises (`KeyboardInterrupt`
    included), so an interrupted command leaves the old `path`, or none, never half of the new one. A replaced file
    keeps its permissions."""
    if path is None or str(path) == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")  # same folder: the rename is atomic
    try:
        with open(temporary, "x", encoding="utf-8", newline="\n") as file:
            yield file
        if path.exists():
            shutil.copymode(path, temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


__all__ = ["InvalidUTF8Error", "iter_lines", "output_file", "read_lines"]
