"""User errors: a mistake in what a command is given (a missing folder, a bad value, a file with a bad line) is a
`UserError`, which the command line prints as one line and exits with status 2; and the checks of paths that commands
run before any work, the Hub's reachability among them (a machine without a network is a fact to report, not a
traceback or a minute of retries)."""

import argparse
import contextlib
import difflib
import errno
import json
import os
import re
import shutil
import struct
import threading
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


class OneLineErrors:
    """For an `argparse.ArgumentParser` subclass: a bad flag or value is a `UserError`, one line like every other
    mistake, instead of argparse's usage lines before the error."""

    def error(self, message: str):
        raise UserError(message)


class CommandParser(OneLineErrors, argparse.ArgumentParser):
    """The parser of a command's flags."""


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


# What a write the disk refused says: Python's OSError by its errno; safetensors and CTranslate2 by the OS's message;
# torch.save's zip writer without the errno ("unexpected pos 64 vs 0" for a short write), taken as a full disk only
# when the disk has under `NEARLY_FULL` bytes left.
DISK_ERRNOS = {errno.ENOSPC: "no space left on its device", errno.EDQUOT: "the disk quota is exceeded"}
DISK_MESSAGES = {"No space left on device": DISK_ERRNOS[errno.ENOSPC], "StorageFull": DISK_ERRNOS[errno.ENOSPC],
                 "Disk quota exceeded": DISK_ERRNOS[errno.EDQUOT]}
TORCH_WRITER_MESSAGES = ("unexpected pos", "file write failed")
NEARLY_FULL = 64 * 2**20


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
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def disk_message(folder: str | os.PathLike, problem: str, needed: int | None = None) -> str:
    """One line for a write to `folder` that the disk refused: the folder, the problem, what is free and, when
    known, what the write needed."""
    needed = f", {_size(needed)} needed" if needed else ""
    return f"cannot write in {folder}: {problem} ({_size(free_space(folder))} free{needed})"


def _size(count: int) -> str:
    return f"{count / 2**30:,.1f} GiB" if count >= 2**30 else f"{count / 2**20:,.1f} MiB"


@contextlib.contextmanager
def write_errors(folder: str | os.PathLike, needed: int | None = None):
    """Report a write into `folder` that the disk refuses inside ([`disk_problem`]) as a `UserError` naming the
    folder and the space ([`disk_message`]); other errors pass. What was written is the caller's to remove (written
    beside its final name: `text_files.output_file`, `text_files.output_folder`)."""
    try:
        yield
    except Exception as error:
        if isinstance(error, UserError) or (problem := disk_problem(error, folder)) is None:
            raise
        raise UserError(disk_message(folder, problem, needed)) from error


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
    Hub id USER/NAME that can be fetched; otherwise a `UserError` naming what is wrong. Checked before loading, so that
    a mistyped path is never sent to the Hub as a repository name, nor a folder without tokenizer files blamed on a
    missing sentencepiece.

    A value is a path, never a Hub id, when it has more parts than USER/NAME, or its first part is a folder here or a
    close misspelling of one (`ouputs/model`: "did you mean outputs/model?"). A Hub id is fetched only when the Hub
    answers one quick request ([`hub_unreachable`]), or, in offline mode (`HF_HUB_OFFLINE=1`), when the cache holds
    it: a machine without a network gets one line at once instead of a minute of huggingface_hub's retries."""
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
        check_model_files(folder, [*(["config.json"] if config else []), *(WEIGHT_FILES[:2] if weights else []),
                                   *(TOKENIZER_FILES if tokenizer else [])])
        return value
    if folder.exists():
        raise UserError(f"{value} is a file, not a folder")
    if hub and HUB_ID.fullmatch(value) and not _looks_local(value):
        from huggingface_hub import constants
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        try:
            validate_repo_id(value)
        except HFValidationError as error:
            raise UserError(f"no such folder: {value}, nor a valid Hub id: {describe(error)}") from None
        if constants.is_offline_mode():
            if not _in_cache(value):
                raise UserError(f"{value} is no folder here, nor a model in the Hub cache (HF_HUB_OFFLINE is set)")
        elif (reason := hub_unreachable()) is not None:
            cached = "it is in the cache, which" if _in_cache(value) else "a model already in the cache"
            raise UserError(
                f"{value} is no folder here, and the Hub ({constants.ENDPOINT}) cannot be reached to fetch it as a "
                f"model ({reason}); {cached} loads with HF_HUB_OFFLINE=1"
            )
        return value
    raise UserError(no_such_folder(value, hub_hint=hub))


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


def check_model_files(folder: str | os.PathLike, names) -> None:
    """A `UserError` naming the first of the files `names` of `folder` that is truncated or garbled."""
    for name in names:
        if (Path(folder) / name).is_file() and (problem := file_problem(Path(folder) / name)) is not None:
            raise UserError(problem)


def not_exported(model_dir: Path, backend: str, holds_no: str) -> ValueError:
    """The error for a folder given to the `backend` backend ("ct2", "onnx") that holds no such model (`holds_no`
    says what is missing): a transformers model folder is told the `export-<backend>` command that makes one."""
    if (model_dir / "config.json").is_file() and any(model_dir.glob("*.safetensors")):
        return ValueError(
            f"{model_dir} is a transformers model folder; the {backend} backend needs it exported first: "
            f"`vanilla-transformer export-{backend} --model {model_dir} --out {model_dir}-{backend}`, then --model "
            f"{model_dir}-{backend}."
        )
    return ValueError(f"{model_dir} holds no {holds_no}; make one with `vanilla-transformer export-{backend}`.")


def no_such_folder(value: str, *, hub_hint: bool = False) -> str:
    """The message for a missing folder `value`, with the existing folder it most likely misspells, if any."""
    if (near := close_folder(value)) is not None:
        return f"no such folder: {value} (did you mean {near}?)"
    first = Path(value).parts[0] if Path(value).parts else value
    if not Path(first).exists() and (near := close_folder(first)) is not None:
        return f"no such folder: {value} (did you mean a folder in {near}?)"
    hint = " (a Hub model is named USER/NAME)" if hub_hint and "/" not in value else ""
    return f"no such folder: {value}{hint}"


def _looks_local(value: str) -> bool:
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


# The Hub's answer must come quickly: beyond this, the command stops instead of waiting on the network.
HUB_PROBE_TIMEOUT = 5.0


def hub_unreachable(timeout: float = HUB_PROBE_TIMEOUT) -> str | None:
    """Why the Hub cannot be reached, or None when it answers, or when huggingface_hub is in offline mode (it then
    answers from its cache at once, or says it cannot).

    One HEAD request of the endpoint through huggingface_hub's own session (its proxies, certificates and
    `HF_ENDPOINT`), without the retries of its downloads (five, about a minute on a machine without a network). Any
    HTTP answer, an error status included, means the Hub can be reached. It runs in a thread waited on for
    `timeout` seconds, since a name lookup that hangs is not bounded by the HTTP library's own timeout."""
    from huggingface_hub import constants, get_session

    if constants.is_offline_mode():
        return None
    outcome = {}

    def probe():
        try:
            get_session().head(constants.ENDPOINT, timeout=timeout)
        # Any failure of the request means no answer. The exception classes are those of the HTTP library that
        # huggingface_hub chose (httpx2 today, which are not OSErrors; requests before): none is named here.
        except Exception as error:
            outcome["reason"] = _reason(error)

    thread = threading.Thread(target=probe, name="hub-probe", daemon=True)
    thread.start()
    thread.join(timeout + 1)
    if thread.is_alive():
        return f"no answer in {timeout:g} s"
    return outcome.get("reason")


def _reason(error: BaseException) -> str:
    """A network error's message without its errno: "Name or service not known"."""
    return re.sub(r"^\[Errno -?\d+\]\s*", "", " ".join(str(error).split())) or type(error).__name__


def _in_cache(repo_id: str) -> bool:
    """Whether huggingface_hub's cache holds files of the Hub model `repo_id` (its config or tokenizer)."""
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(repo_id, name), str) for name in ("config.json", *TOKENIZER_FILES))


def is_network_error(error: BaseException) -> bool:
    """Whether `error` is the network failing (a dropped connection, a timeout), as Python or as the HTTP library that
    huggingface_hub uses raises it; that library is found from huggingface_hub's session, not named (its exception
    classes are no OSErrors)."""
    from huggingface_hub import get_session

    library = type(get_session()).__module__.split(".")[0]
    return isinstance(error, (ConnectionError, TimeoutError)) or type(error).__module__.split(".")[0] == library


@contextlib.contextmanager
def hub_errors(action: str):
    """Report what stops an exchange with the Hub inside as one-line `UserError`s that start with `action`: its
    refusals (`HfHubHTTPError`, an `OSError`: no token, no access, no such repository), a bad value (`ValueError`)
    and the network failing on the way (see [`is_network_error`]). Anything else is a bug and keeps its traceback."""
    try:
        yield
    except UserError:
        raise
    except Exception as error:
        if not isinstance(error, (OSError, ValueError)) and not is_network_error(error):
            raise
        raise UserError(f"{action}: {describe_hub_error(error)}") from error


def describe_hub_error(error: BaseException) -> str:
    """An error of an exchange with the Hub as one line: an HTTP answer by its status, request and the server's
    message, with what to do about a token the Hub refused; a network failure as such."""
    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int):
        try:
            to = f" to {response.request.method} {response.request.url}"
        except (AttributeError, RuntimeError):  # httpx's Response without its request raises RuntimeError
            to = ""
        server = " ".join((getattr(error, "server_message", None) or "").split())
        message = f"the Hub answered {status} {getattr(response, 'reason_phrase', '')}".rstrip() + to
        message += f": {server}" if server else ""
        if status in (401, 403):
            message += " (a token with write access: `hf auth login`, HF_TOKEN or --token)"
        return message
    if is_network_error(error) and not isinstance(error, OSError):
        return f"the connection to the Hub failed ({_reason(error)})"
    return describe(error)


def check_input_file(path: str | None) -> int | None:
    """The number of lines of `path`, a UTF-8 text file read through once so that a bad line stops the command before
    any work; None for standard input (None or "-"), which can be read only once."""
    if path is None or path == "-":
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
        raise UserError(f"{path} is a folder; give the name of a file to write")
    folder = target.parent
    while new_folders and not folder.exists() and folder != folder.parent:
        folder = folder.parent  # the folder the new ones will be made in
    if folder.exists() and not folder.is_dir():
        raise UserError(f"cannot write {path}: {folder} is a file, not a folder")
    if not folder.is_dir():
        raise UserError(no_such_folder(str(folder)) + f" (to write {path} in)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"cannot write in the folder {folder} (permission denied)")
    if target.exists() and not os.access(target, os.W_OK):
        raise UserError(f"{path} is read-only")


def check_output_folder(path: str) -> None:
    """`path` can become a folder: it is one already, or nothing is there."""
    if Path(path).exists() and not Path(path).is_dir():
        raise UserError(f"{path} is a file, not a folder")


# The special tokens a tokenizer and its model must agree on: the tokenizer's attribute and the config's keys.
SPECIAL_TOKENS = (
    ("pad_token_id", ("pad_token_id",)),
    ("eos_token_id", ("eos_token_id",)),
    ("bos_token_id", ("bos_token_id", "decoder_start_token_id")),
)


def check_tokenizer_fits(model: str, tokenizer: str | None = None) -> None:
    """A `UserError` unless the tokenizer (in `tokenizer`, else in `model`) fits the model saved in `model`: each of
    its ids has a row of the embedding (section 3.4: one matrix of `vocab_size` rows), and its padding, end and start
    ids are the model's. A model and a tokenizer that were not trained together would otherwise fail deep in torch, or
    translate into nonsense. Local folders only: a Hub model is checked by the library that fetches it."""
    if not (Path(model) / "config.json").is_file() or tokenizer is not None and not Path(tokenizer).is_dir():
        return
    from transformers import AutoTokenizer, PretrainedConfig

    tokenizer = tokenizer or model
    with user_errors(OSError, ValueError):
        config = PretrainedConfig.get_config_dict(model)[0]
    keys = ["vocab_size", *(key for _, keys in SPECIAL_TOKENS for key in keys)]
    if all(config.get(key) is None for key in keys):
        return  # nothing to hold the tokenizer against
    try:
        loaded = AutoTokenizer.from_pretrained(tokenizer)
    except (OSError, ValueError, KeyError, TypeError) as error:  # transformers reading files that are not a tokenizer's
        raise UserError(f"cannot read the tokenizer in {tokenizer}: {describe(error)}") from error
    where = "its tokenizer" if tokenizer == model else f"the tokenizer {tokenizer}"
    vocab_size = config.get("vocab_size")
    if vocab_size is not None and len(loaded) > vocab_size:
        raise UserError(
            f"{where} has {len(loaded):,} tokens but the model {model} has {vocab_size:,} embedding rows (vocab_size): "
            "they were not made together"
        )
    for attribute, keys in SPECIAL_TOKENS:
        token_id = getattr(loaded, attribute)
        for key in keys:
            if token_id is not None and config.get(key) is not None and config[key] != token_id:
                raise UserError(
                    f"{where} has {attribute} {token_id} but the model {model} has {key} {config[key]}: they were "
                    "not made together"
                )
