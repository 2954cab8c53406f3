"""User errors: a mistake in what a command is given (a missing folder, a bad value, a file with a bad line) is a
`UserError`, which the command line prints as one line and exits with status 2; and the checks of paths that commands
run before any work."""

import contextlib
import os
import re
from pathlib import Path


class UserError(Exception):
    """A mistake in what the user gave a command, which the message names; printed as one line, exit status 2."""


@contextlib.contextmanager
def user_errors(*types: type[BaseException], path: str | os.PathLike | None = None):
    """Report the exceptions of `types` raised inside as `UserError`s (with `path` named when the message lacks it):
    for calls that raise them about their inputs, so that nothing else is mistaken for the user's mistake."""
    try:
        yield
    except types as error:
        raise UserError(describe(error, path)) from error


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


# A model on the Hub: USER/NAME (huggingface_hub checks the details when it is fetched).
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
CT2_WEIGHTS = "model.bin"  # what CTranslate2's converters write
ONNX_ENCODER = "encoder_model.onnx"  # what export-onnx writes, among others


def check_model(
    value: str, *, config: bool = True, weights: bool = True, tokenizer: bool = True, hub: bool = True
) -> str:
    """`value` if it is a folder with the files asked for (`config.json`, weights, tokenizer files) or, with `hub`, a
    Hub id USER/NAME whose first part is no local folder; otherwise a `UserError` naming what is wrong. Checked before
    loading, so that a mistyped path is never sent to the Hub as a repository name, nor a folder without tokenizer
    files blamed on a missing sentencepiece."""
    folder = Path(value)
    if folder.is_dir():
        if config and not (folder / "config.json").is_file():
            raise UserError(f"{value} has no config.json: it is not a saved model folder")
        if weights and not any((folder / name).is_file() for name in WEIGHT_FILES):
            if (folder / CT2_WEIGHTS).is_file():
                raise UserError(
                    f"{value} is a CTranslate2 folder (from export-ct2): translate or evaluate it with --backend ct2"
                )
            if (folder / ONNX_ENCODER).is_file():
                raise UserError(
                    f"{value} is an ONNX folder (from export-onnx): translate or evaluate it with --backend onnx"
                )
            raise UserError(f"{value} has no model weights ({WEIGHT_FILES[0]})")
        if tokenizer and not any((folder / name).is_file() for name in TOKENIZER_FILES):
            raise UserError(f"{value} has no tokenizer files ({' or '.join(TOKENIZER_FILES)})")
        return value
    if folder.exists():
        raise UserError(f"{value} is a file, not a folder")
    if hub and HUB_ID.fullmatch(value) and not Path(value.split("/")[0]).exists():
        return value
    hint = " (a Hub model is named USER/NAME)" if hub and "/" not in value else ""
    raise UserError(f"no such folder: {value}{hint}")


def check_input_file(path: str | None) -> int | None:
    """The number of lines of `path`, a UTF-8 text file read through once so that a bad line stops the command before
    any work; None for standard input (None or "-"), which can be read only once."""
    if path is None or path == "-":
        return None
    from .text_files import InvalidUTF8Error, iter_lines

    with user_errors(OSError, EOFError, InvalidUTF8Error, path=path):
        return sum(1 for _ in iter_lines(path))


def check_output_file(path: str | None) -> None:
    """`path` (standard output when None or "-") can be written: its folder exists and is writable, and an existing
    `path` is a file that may be replaced."""
    if path is None or path == "-":
        return
    target = Path(path)
    if target.is_dir():
        raise UserError(f"{path} is a folder; give the name of a file to write")
    if not target.parent.is_dir():
        raise UserError(f"no such folder: {target.parent} (to write {path} in)")
    if not os.access(target.parent, os.W_OK | os.X_OK):
        raise UserError(f"cannot write in the folder {target.parent} (permission denied)")
    if target.exists() and not os.access(target, os.W_OK):
        raise UserError(f"{path} is read-only")


def check_output_folder(path: str) -> None:
    """`path` can become a folder: it is one already, or nothing is there."""
    if Path(path).exists() and not Path(path).is_dir():
        raise UserError(f"{path} is a file, not a folder")
