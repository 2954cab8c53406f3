"""Folders named on the command line: a missing one is told with the existing folder it most likely misspells."""

import difflib
import os
from pathlib import Path


def no_such_folder(value: str, *, hub_hint: bool = False) -> str:
    """The message for a missing folder `value`, with the existing folder it most likely misspells, if any."""
    if (near := close_folder(value)) is not None:
        return f"no such folder: {value} (did you mean {near}?)"
    first = Path(value).parts[0] if Path(value).parts else value
    if not Path(first).exists() and (near := close_folder(first)) is not None:
        return f"no such folder: {value} (did you mean a folder in {near}?)"
    hint = " (a Hub model is named USER/NAME)" if hub_hint and "/" not in value else ""
    return f"no such folder: {value}{hint}"


def looks_local(value: str) -> bool:
    """Whether USER/NAME `value` names a path: its first part is a folder here, or a close misspelling of one."""
    first = value.split("/")[0]
    return Path(first).exists() or close_folder(first) is not None


def close_folder(value: str) -> str | None:
    """The existing folder that the missing path `value` most likely misspells, each missing part replaced by the
    closest name among the folders beside it (`difflib`, similarity 0.8 or more: `outputs` for `ouputs`, not
    `notebook` for `facebook`); None when a part has no folder that close."""
    folder, parts = Path(), Path(value).parts
    for part in parts:
        if (folder / part).is_dir():
            folder = folder / part
            continue
        try:
            names = [entry.name for entry in os.scandir(folder) if entry.is_dir() and not entry.name.startswith(".")]
        except OSError:
            return None
        match = difflib.get_close_matches(part, names, n=1, cutoff=0.8)
        if not match:
            return None
        folder = folder / match[0]
    return str(folder) if parts and str(folder) != os.path.normpath(value) else None


def existing_folder(path: str | os.PathLike) -> Path:
    """The nearest of `path` (absolute) and its parents that exists: where a folder not made yet would be made."""
    folder = Path(path).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


__all__ = ["close_folder", "existing_folder", "looks_local", "no_such_folder"]
