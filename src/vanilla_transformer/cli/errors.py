"""How the command line words what stops a command: a `UserError` or a missing extra as one line,
`vanilla-transformer COMMAND: error: ...`, exit status 2; a training run that diverged as one such line, exit status 3;
Ctrl-C and a handled signal as one line with the signal's exit status; a push that the Hub refuses or the network
drops as a `UserError`. Any other exception is a bug and keeps its traceback.

The layers below raise typed errors with their data; where their message names an argument of a Python function
(`force=True`, `max_new_tokens`) or leaves out what a command does next, `command_line_message` words it with the
command's flags."""

import contextlib
import os
import sys

from .. import errors
from ..errors import FolderExistsError, InputTooLongError, NotExportedError, Preempted, TrainingDiverged, UserError
from ..errors import describe
from ..extras import MissingExtraError
from ..inference.hypotheses import AlignmentLayerError, AlignmentUnavailableError
from ..hub.reachability import is_network_error, network_reason
from ..paths.files import StandardInputClosedError
from ..paths.model_folders import ExportFolderError


def command_line_message(error: BaseException, path: str | os.PathLike | None = None) -> str:
    """`error` as the command line says it, in one line (with `path` named when the message lacks it): the typed
    errors whose message is worded for Python callers get the command's flags, any other is [`describe`]d."""
    if isinstance(error, FolderExistsError):
        message = f"{error.folder} {error.holds}; pass --force to replace it."
    elif isinstance(error, InputTooLongError):
        message = (f"{error.problem}: export it again with a larger --max-positions, or shorten the input or "
                   "--max-new-tokens")
    elif isinstance(error, NotExportedError) and error.model_folder:
        exported = f"{error.model_dir}-{error.backend}"
        message = (f"{error}: `vanilla-transformer export-{error.backend} --model {error.model_dir} --out {exported}`, "
                   f"then --model {exported}.")
    elif isinstance(error, NotExportedError):
        message = f"{error}; make one with `vanilla-transformer export-{error.backend}`."
    elif isinstance(error, ExportFolderError):
        message = f"{error}: run it with --backend {error.backend}"
    elif isinstance(error, AlignmentLayerError):
        message = (f"--alignment-layer {error.layer} is not a layer of the model's {error.layers}-layer decoder "
                   f"(0 to {error.layers - 1}, or -1 to -{error.layers} from the last)")
    elif isinstance(error, AlignmentUnavailableError) and error.exported_layer is None:
        message = (f"this {error.backend} export keeps no encoder-decoder attention with its heads averaged (it was "
                   "exported before export-ct2 recorded one): export the model again with export-ct2")
    elif isinstance(error, AlignmentUnavailableError):
        message = (f"this {error.backend} export aligns with decoder layer {error.exported_layer} (export-ct2 "
                   f"--alignment-layer chose it): leave --alignment-layer out, or export again with --alignment-layer "
                   f"{error.asked_layer}")
    elif isinstance(error, StandardInputClosedError):
        message = f"{error}: pipe the sentences in, or give --input FILE"
    elif isinstance(error, UserError):
        return str(error)
    else:
        return describe(error, path)
    return f"{path}: {message}" if path is not None and str(path) not in message else message


def user_errors(*types: type[BaseException], path: str | os.PathLike | None = None):
    """`errors.user_errors` worded by [`command_line_message`]: the exceptions of `types` raised inside, about the
    command's inputs, as one-line `UserError`s."""
    return errors.user_errors(*types, path=path, words=command_line_message)


@contextlib.contextmanager
def one_line_errors(name: str):
    """Run the command `name` inside, its mistakes and stops printed as one line each and the process ended with their
    exit status."""
    try:
        yield
    except (UserError, MissingExtraError) as error:  # one line, not a traceback
        message = command_line_message(error) if isinstance(error, UserError) else error
        print(f"vanilla-transformer {name}: error: {message}", file=sys.stderr)
        sys.exit(2)
    except TrainingDiverged as error:  # not the user's mistake, and no bug: the run's loss stopped being finite
        print(f"vanilla-transformer {name}: error: {error}", file=sys.stderr)
        sys.exit(3)
    except KeyboardInterrupt as interrupt:  # its message, where a command gives one, says how to continue
        print(f"vanilla-transformer {name}: {str(interrupt) or 'interrupted'}", file=sys.stderr)
        sys.exit(130)
    except Preempted as stop:  # SIGTERM stopped training: as Ctrl-C, 128 + the signal
        print(f"vanilla-transformer {name}: {stop}", file=sys.stderr)
        sys.exit(128 + stop.signal_number)


@contextlib.contextmanager
def hub_errors(action: str):
    """Report what stops an exchange with the Hub inside as one-line `UserError`s that start with `action`: its
    refusals (`HfHubHTTPError`, an `OSError`: no token, no access, no such repository), a bad value (`ValueError`)
    and the network failing on the way (see `hub.reachability.is_network_error`). Anything else is a bug and keeps its
    traceback."""
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
        return f"the connection to the Hub failed ({network_reason(error)})"
    return describe(error)


__all__ = ["command_line_message", "describe_hub_error", "hub_errors", "one_line_errors", "user_errors"]
