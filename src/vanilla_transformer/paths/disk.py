"""Writes the disk refuses: a full disk or a quota, told apart from other errors and reported with the space left."""

import contextlib
import errno
import os
import shutil
from pathlib import Path

from ..errors import UserError
from .folders import existing_folder

# What a write the disk refused says: Python's OSError by its errno; safetensors and CTranslate2 by the OS's message;
# torch.save's zip writer without the errno ("unexpected pos 64 vs 0" for a short write), taken as a full disk only
# when the disk has under `NEARLY_FULL` bytes left.
DISK_ERRNOS = {errno.ENOSPC: "no space left on its device", errno.EDQUOT: "the disk quota is exceeded"}
DISK_MESSAGES = {"No space left on device": DISK_ERRNOS[errno.ENOSPC], "StorageFull": DISK_ERRNOS[errno.ENOSPC],
                 "Disk quota exceeded": DISK_ERRNOS[errno.EDQUOT]}
TORCH_WRITER_MESSAGES = ("unexpected pos", "file write failed")
NEARLY_FULL = 64 * 2**20


class DiskFullError(UserError):
    """A write into `folder` that a full disk or a quota refused (`problem`, in words), with the bytes it `needed`
    when known and what to do next (`next_step`, words appended to the message)."""

    def __init__(self, folder: str | os.PathLike, problem: str, needed: int | None = None, next_step: str = ""):
        super().__init__(disk_message(folder, problem, needed) + next_step)
        self.folder, self.problem, self.needed = folder, problem, needed


def disk_problem(error: BaseException, folder: str | os.PathLike = ".") -> str | None:
    """What the disk refused, in words, when `error` (or an error it was raised from) is a write to `folder` that a
    full disk or a quota stopped; None for any other error."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in DISK_ERRNOS:
            return DISK_ERRNOS[error.errno]
        text = str(error)
        for message, problem in DISK_MESSAGES.items():
            if message in text:
                return problem
        if isinstance(error, RuntimeError) and any(message in text for message in TORCH_WRITER_MESSAGES):
            if free_space(folder) < NEARLY_FULL:
                return DISK_ERRNOS[errno.ENOSPC]
        error = error.__cause__ or error.__context__
    return None


def free_space(folder: str | os.PathLike) -> int:
    """The bytes free on the device of `folder` (of its nearest existing parent, if it is not made yet)."""
    return shutil.disk_usage(existing_folder(folder)).free


def folder_size(folder: str | os.PathLike, *patterns: str) -> int:
    """The bytes of the files of `folder` that `patterns` match: what a copy of them needs on the disk."""
    return sum(path.stat().st_size for pattern in patterns for path in Path(folder).glob(pattern) if path.is_file())


def disk_message(folder: str | os.PathLike, problem: str, needed: int | None = None) -> str:
    """One line for a write to `folder` that the disk refused: the folder, the problem, what is free and, when
    known, what the write needed."""
    needed = f", {_size(needed)} needed" if needed else ""
    return f"cannot write in {folder}: {problem} ({_size(free_space(folder))} free{needed})"


def _size(count: int) -> str:
    return f"{count / 2**30:,.1f} GiB" if count >= 2**30 else f"{count / 2**20:,.1f} MiB"


@contextlib.contextmanager
def write_errors(folder: str | os.PathLike, needed: int | None = None, *, then=None):
    """Report a write into `folder` that the disk refuses inside ([`disk_problem`]) as a `DiskFullError` naming the
    folder and the space ([`disk_message`]); other errors pass. What was written is the caller's to remove (written
    beside its final name: `text_files.output_file`, `text_files.output_folder`), or `then`'s: called once the disk
    refused, it cleans up and returns the space needed and what to do next, in words appended to the message."""
    try:
        yield
    except Exception as error:
        if isinstance(error, UserError) or (problem := disk_problem(error, folder)) is None:
            raise
        next_step = ""
        if then is not None:
            needed, next_step = then()
        raise DiskFullError(folder, problem, needed, next_step) from error


__all__ = ["DiskFullError", "disk_message", "disk_problem", "folder_size", "free_space", "write_errors"]
