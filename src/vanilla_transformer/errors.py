"""The errors the package raises about what it was given, and the means of raising them from other exceptions.

A mistake in what a command is given (a missing folder, a bad value, a file with a bad line) is a `UserError`;
`user_errors()` turns the exceptions a call raises about its inputs into one, worded by `describe()`. The command line
(`cli/`) prints each as one line, `vanilla-transformer COMMAND: error: ...`, and exits with status 2. Below the
command line, errors are typed and carry their data; where a message names a function's argument
(`force=True`), the command line words it with its own flag (`cli/errors.py`).
"""

import argparse
import contextlib
import difflib
import os
import sys
from pathlib import Path


class UserError(Exception):
    """A mistake in what the user gave a command, which the message names; printed as one line, exit status 2."""


class Preempted(Exception):
    """Not a mistake but a stop: a command ended by a signal it handles (SIGTERM during training saves a checkpoint
    first); printed as one line that says where it stopped and what to do, exit status 128 + the signal's number, as
    Ctrl-C's 130."""

    def __init__(self, message: str, signal_number: int):
        super().__init__(message)
        self.signal_number = signal_number


class TrainingDiverged(Exception):
    """Not a mistake in what was given but a run gone wrong: its training loss, or its weights, stopped being finite,
    and training stopped there; printed as one line that names the step and the newest checkpoint with finite
    weights, exit status 3."""


class InputTooLongError(RuntimeError):
    """A source or output longer than the position table an exported CTranslate2 or ONNX folder stores (the
    `max_positions` it was exported with); raised by the `ct2` and `onnx` backends. `problem` says which and how
    long."""

    def __init__(self, problem: str):
        super().__init__(f"{problem}: export it again with a larger max_positions, or shorten the input or "
                         "max_new_tokens")
        self.problem = problem


class NotExportedError(UserError, ValueError):
    """A folder given to the `backend` backend ("ct2", "onnx") that holds no such model (`holds_no` says what is
    missing); `model_folder`: the folder holds a transformers model instead, which the export makes one of."""

    def __init__(self, model_dir: Path, backend: str, holds_no: str, model_folder: bool):
        if model_folder:
            message = f"{model_dir} is a transformers model folder; the {backend} backend needs it exported first"
        else:
            message = f"{model_dir} holds no {holds_no}"
        super().__init__(message)
        self.model_dir, self.backend, self.model_folder = model_dir, backend, model_folder


class FolderExistsError(FileExistsError):
    """An output folder that is there already (`holds`: what it holds), replaced only when asked (`force=True`)."""

    def __init__(self, folder: Path, holds: str):
        super().__init__(f"{folder} {holds}; pass force=True to replace it.")
        self.folder, self.holds = folder, holds


class OneLineErrors:
    """For an `argparse.ArgumentParser` subclass: a bad flag or value is a `UserError`, one line like every other
    mistake, instead of argparse's usage lines before the error.

    A flag is taken only as spelled in full: argparse's abbreviations are off (`--num-beam` is no `--num-beams`: a flag
    added later could make an old command line mean something else), and an unknown flag is named, with the flags it
    is close to, before anything else is said of the command line (argparse would first report a required flag as
    missing when the unknown one was that flag misspelt)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UserError(message)

    def parse_args(self, args=None, namespace=None):
        self.refuse_unknown_flags(sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def refuse_unknown_flags(self, argv: list[str]) -> None:
        """A `UserError` naming the first `--flag` of `argv` that this parser does not know. Arguments after `--`, and
        values with a space (which argparse takes as values, never as flags), are not flags."""
        known = [option for action in self._actions for option in action.option_strings]
        for argument in argv:
            if argument == "--":
                return
            flag = argument.split("=", 1)[0]
            if flag.startswith("--") and " " not in flag and flag not in known:
                close = difflib.get_close_matches(flag, [option for option in known if option.startswith("--")], n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                self.error(f"unrecognized argument {flag}{hint}")


class CommandParser(OneLineErrors, argparse.ArgumentParser):
    """The parser of a command's flags."""


@contextlib.contextmanager
def user_errors(*types: type[BaseException], path: str | os.PathLike | None = None, words=None):
    """Report the exceptions of `types` raised inside as `UserError`s (with `path` named when the message lacks it),
    worded by `words(error, path)` ([`describe`] by default): for calls that raise them about their inputs, so that
    nothing else is mistaken for the user's mistake."""
    words = words or describe
    try:
        yield
    except UserError:  # worded already
        raise
    except types as error:
        raise UserError(words(error, path)) from error


def describe(error: BaseException, path: str | os.PathLike | None = None) -> str:
    """An exception as one line: an `OSError` by its file and the problem, without errno; other messages joined."""
    filename = getattr(error, "filename", None)
    if isinstance(error, FileNotFoundError) and filename:
        return f"no such file or folder: {filename}"
    if isinstance(error, IsADirectoryError) and filename:
        return f"{filename} is a folder, not a file"
    if isinstance(error, OSError) and filename and error.strerror:
        return f"{filename}: {error.strerror[0].lower()}{error.strerror[1:]}"
    message = " ".join(str(error).split()) or type(error).__name__
    return f"{path}: {message}" if path is not None and str(path) not in message else message


__all__ = [
    "CommandParser",
    "FolderExistsError",
    "InputTooLongError",
    "NotExportedError",
    "OneLineErrors",
    "Preempted",
    "TrainingDiverged",
    "UserError",
    "describe",
    "user_errors",
]
