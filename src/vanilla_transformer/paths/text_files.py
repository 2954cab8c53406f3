"""Reading text files one sentence a line, as corpora, inputs and references come: UTF-8, plain or gzip, or standard
input. The one reader of the package (data loading, tokenizer training, the translate and evaluate commands), and the
one writer of the commands' outputs (`output_file`).
"""

import codecs
import contextlib
import gzip
import os
import re
import secrets
import shutil
import socket
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


def temporary_name(path: Path, kind: str = "tmp") -> Path:
    """A hidden name beside `path` for what is written before it is renamed to `path`: it names this host and process,
    so that a later command can remove what a killed one left ([`remove_stale_temporaries`])."""
    return path.with_name(f".{path.name}.{socket.gethostname()}-{os.getpid()}.{secrets.token_hex(4)}.{kind}")


def remove_stale_temporaries(path: Path) -> None:
    """Remove the temporary files and folders beside `path` ([`temporary_name`]) left by a process of this host that
    is gone: a command killed by a signal no process can handle (SIGKILL, the out-of-memory killer)."""
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(?P<host>.+)-(?P<pid>\d+)\.[0-9a-f]{{8}}\.(tmp|old)")
    try:
        siblings = list(path.parent.iterdir())
    except OSError:
        return
    for sibling in siblings:
        match = pattern.fullmatch(sibling.name)
        if match is None or match["host"] != socket.gethostname() or _alive(int(match["pid"])):
            continue
        if sibling.is_dir():
            shutil.rmtree(sibling, ignore_errors=True)
        else:
            sibling.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextlib.contextmanager
def output_file(path: PathLike | None = None) -> Iterator[TextIO]:
    """A UTF-8 text file to write to ("\\n" line endings): standard output when `path` is None or "-"; otherwise a new
    file next to `path`, renamed to `path` when the block ends and deleted when it raises (`KeyboardInterrupt`
    included), so an interrupted command leaves the old `path`, or none, never half of the new one. A replaced file
    keeps its permissions. What a killed command left beside `path` is removed first ([`remove_stale_temporaries`])."""
    if path is None or str(path) == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    path = Path(path)
    remove_stale_temporaries(path)
    temporary = temporary_name(path)  # same folder: the rename is atomic
    try:
        with open(temporary, "x", encoding="utf-8", newline="\n") as file:
            yield file
        if path.exists():
            shutil.copymode(path, temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


@contextlib.contextmanager
def output_folder(path: PathLike, *, replace_files: bool = False, last: tuple[str, ...] = ()) -> Iterator[Path]:
    """A new folder next to `path` to write into, deleted when the block raises (`KeyboardInterrupt` or a full disk
    included), so that an interrupted command leaves the old `path`, or none, never half of the new one. When the
    block ends a new `path` is the folder renamed; an existing one is replaced whole, or, with `replace_files`, has
    each of its files that the new folder holds replaced by a rename (the names in `last` last: the weights after
    the config and tokenizer they go with), its other files kept."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    temporary, old = temporary_name(path), temporary_name(path, "old")
    temporary.mkdir()
    try:
        yield temporary
        if not path.exists():
            os.replace(temporary, path)
        elif replace_files:
            for entry in sorted(temporary.iterdir(), key=lambda entry: (entry.name in last, entry.name)):
                if (path / entry.name).is_dir():
                    shutil.rmtree(path / entry.name)
                os.replace(entry, path / entry.name)
        else:
            os.replace(path, old)
            os.replace(temporary, path)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


__all__ = ["InvalidUTF8Error", "iter_lines", "output_file", "output_folder", "read_lines"]
