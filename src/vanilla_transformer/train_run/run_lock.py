"""One `train` command per output folder: a lock on the folder, held for the whole run.

The lock is an advisory `flock` on `.train.lock` in the folder, which also records who holds it (process id, host,
start time, command). The kernel releases it when the process ends, however it ends (an exception, Ctrl-C, SIGKILL,
the out-of-memory killer), so a lock left by a dead process is no lock: the file stays, and the next command takes it.
Where `fcntl` is missing (Windows), folders are not locked.
"""

import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


LOCK = ".train.lock"


class FolderInUseError(RuntimeError):
    """Another live process holds the folder's lock; the message names it."""


@contextlib.contextmanager
def run_lock(folder: str | os.PathLike):
    """Hold the lock of `folder` (created if missing) inside the block; `FolderInUseError` when another process
    holds it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield
        return
    with open(folder / LOCK, "a+", encoding="utf-8") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderInUseError(_in_use(folder, file)) from None
        holder = dict(pid=os.getpid(), host=socket.gethostname(), started=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                      command=" ".join(["vanilla-transformer", *sys.argv[1:]]))
        file.truncate(0)
        file.write(json.dumps(holder) + "\n")
        file.flush()
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def check_unlocked(folder: str | os.PathLike) -> None:
    """`FolderInUseError` when a live process holds the lock of `folder`; nothing is created."""
    path = Path(folder) / LOCK
    if fcntl is None or not path.is_file():
        return
    with open(path, encoding="utf-8") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderInUseError(_in_use(folder, file)) from None
        fcntl.flock(file, fcntl.LOCK_UN)


def _in_use(folder: str | os.PathLike, file) -> str:
    """The message naming the process that holds the lock of `folder`, as its lock file records it."""
    file.seek(0)
    try:
        holder = json.loads(file.read())
        who = f"process {holder['pid']} on {holder['host']}, since {holder['started']}: {holder['command']}"
    except (ValueError, KeyError, TypeError):
        who = "another process"
    return f"{folder} is in use by another train command ({who}); wait for it to end, or choose another --output-dir"


__all__ = ["LOCK", "FolderInUseError", "check_unlocked", "run_lock"]
