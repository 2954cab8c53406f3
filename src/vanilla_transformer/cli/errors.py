"""How the command line words what stops a command: a `UserError` or a missing extra as one line,
`vanilla-transformer COMMAND: error: ...`, exit status 2; a training run that diverged as one such line, exit status 3;
Ctrl-C and a handled signal as one line with the signal's exit status; a push that the Hub refuses or the network
drops as a `UserError`. Any other exception is a bug and keeps its traceback."""

import contextlib
import sys

from ..errors import Preempted, TrainingDiverged, UserError, describe
from ..extras import MissingExtraError
from ..hub.reachability import is_network_error, network_reason


@contextlib.contextmanager
def one_line_errors(name: str):
    """Run the command `name` inside, its mistakes and stops printed as one line each and the process ended with their
    exit status."""
    try:
        yield
    except (UserError, MissingExtraError) as error:  # one line, not a traceback
        print(f"vanilla-transformer {name}: error: {error}", file=sys.stderr)
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


__all__ = ["describe_hub_error", "hub_errors", "one_line_errors"]
