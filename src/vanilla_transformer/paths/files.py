"""Files a command reads or writes, checked before any work: an input read through once, an output that can be
written, and a JSON or safetensors file that is whole."""

import json
import os
import struct
import sys
from pathlib import Path

from ..errors import UserError, describe, user_errors
from .folders import no_such_folder


class StandardInputClosedError(UserError):
    """Standard input was to be read, but the process was started with it closed."""

    def __init__(self):
        super().__init__("standard input is closed")


class OutputPathError(UserError):
    """An output file or folder (`path`) that cannot be written; the message says why."""

    def __init__(self, path: str | os.PathLike, message: str):
        super().__init__(message)
        self.path = path


def check_input_file(path: str | None) -> int | None:
    """The number of lines of `path`, a UTF-8 text file read through once so that a bad line stops the command before
    any work; None for standard input (None or "-"), which can be read only once, and must be open."""
    if path is None or path == "-":
        if sys.stdin is None:  # the process was started with its standard input closed
            raise StandardInputClosedError()
        return None
    from .text_files import InvalidUTF8Error, iter_lines

    with user_errors(OSError, EOFError, InvalidUTF8Error, path=path):
        return sum(1 for _ in iter_lines(path))


def check_output_file(path: str | None, *, new_folders: bool = False) -> None:
    """`path` (standard output when None or "-") can be written: its folder exists (or, with `new_folders`, can be
    created) and is writable, and an existing `path` is a file that may be replaced."""
    if path is None or path == "-":
        return
    target = Path(path)
    if target.is_dir():
        raise OutputPathError(path, f"{path} is a folder; give the name of a file to write")
    folder = target.parent
    while new_folders and not folder.exists() and folder != folder.parent:
        folder = folder.parent  # the folder the new ones will be made in
    if folder.exists() and not folder.is_dir():
        raise OutputPathError(path, f"cannot write {path}: {folder} is a file, not a folder")
    if not folder.is_dir():
        raise OutputPathError(path, no_such_folder(str(folder)) + f" (to write {path} in)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(path, f"cannot write in the folder {folder} (permission denied)")
    if target.exists() and not os.access(target, os.W_OK):
        raise OutputPathError(path, f"{path} is read-only")


def check_output_folder(path: str) -> None:
    """`path` can become a folder: it is one already, or nothing is there."""
    if Path(path).exists() and not Path(path).is_dir():
        raise OutputPathError(path, f"{path} is a file, not a folder")


def file_problem(path: str | os.PathLike) -> str | None:
    """What is wrong with the JSON or safetensors file `path`, naming it, in one line; None when it reads (a
    safetensors file: its header, and a length equal to the one the header describes; its tensors are not read)."""
    path = Path(path)
    try:
        if path.suffix == ".json":
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError):
                return f"{path} is truncated or not JSON"
        elif path.suffix == ".safetensors":
            return _safetensors_problem(path)
    except OSError as error:
        return describe(error)
    return None


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    with open(path, "rb") as file:
        try:
            (header_size,) = struct.unpack("<Q", file.read(8))
            if header_size > size - 8:
                return f"{path} is truncated ({size:,} bytes)"
            header = json.loads(file.read(header_size))
            end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, IndexError, AttributeError, struct.error):
            return f"{path} is not a safetensors file (truncated or garbled)"
    if size != 8 + header_size + end:
        return f"{path} is truncated ({size:,} bytes of {8 + header_size + end:,})"
    return None


__all__ = [
    "OutputPathError",
    "StandardInputClosedError",
    "check_input_file",
    "check_output_file",
    "check_output_folder",
    "file_problem",
]
