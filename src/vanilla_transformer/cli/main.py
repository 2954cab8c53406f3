"""The `vanilla-transformer` command: each subcommand listed with its one-line summary in `COMMANDS`, one module per
group of commands (`train.py`, `translate.py`, `export.py`, `hub.py`).

`vanilla-transformer --help` lists the commands, `vanilla-transformer COMMAND --help` gives a command's options; both
import neither torch nor transformers, since each command builds its parser first and imports what does the work
after. Options are spelled with dashes (`--max-new-tokens`); `train` also takes transformers' underscores
(`--max_steps`).

A mistake in what a command is given (a missing folder, a bad value, a file with a bad line) is a `UserError`; `main`
prints it, or a `MissingExtraError`, as one line, `vanilla-transformer COMMAND: error: ...`, and exits with status 2
(`cli/errors.py`). Paths are checked before any work, and outputs are written whole or not at all
(`text_files.output_file`). So is a Hub that cannot be reached, found by one quick request before anything is fetched
from or sent to it (`hub.reachability.hub_unreachable`), and a push that the Hub refuses or the network drops
(`cli/errors.py`). Any other exception is a bug and keeps its traceback.
"""

import contextlib
import os
import signal
import stat
import sys
import threading

from ..errors import CommandParser, Preempted, UserError
from .errors import one_line_errors
from .demo import demo_command
from .export import export_ct2_command, export_onnx_command
from .hub import model_card_command, push_command
from .scores import score_command
from .train import average_command, train_command
from .translate import evaluate_command, plot_attention_command, translate_command

# Each command with its one-line summary, in the order `--help` lists them.
COMMANDS = {
    "train": (train_command, "Train or fine-tune a translation model with the paper's recipe (no data: a demo)."),
    "average": (average_command, "Average the weights of a run's last checkpoints (section 6.1)."),
    "translate": (translate_command, "Translate a file or standard input, one line per sentence."),
    "evaluate": (evaluate_command, "Translate a test set and score it with sacreBLEU: BLEU and chrF."),
    "score": (score_command, "Score given translations: each pair's log-probability under the model."),
    "export-ct2": (export_ct2_command, "Convert a saved model to CTranslate2 for fast CPU and GPU inference."),
    "export-onnx": (export_onnx_command, "Export a saved model to ONNX, for ONNX Runtime and generate()."),
    "demo": (demo_command, "Serve a page to try a model in the browser: translations, n-best lists, alignments."),
    "plot-attention": (plot_attention_command, "Draw a sentence's attention weights as heatmaps (figures 3-5)."),
    "model-card": (model_card_command, "Write the Hub model card (README.md) of a saved model."),
    "push": (push_command, "Upload a saved model, its tokenizer, code and model card to the Hub."),
}

# The commands whose backend registers the model when it loads one (backends/table.py).
REGISTERED_BY_BACKEND = ("translate", "evaluate", "score", "demo")


@contextlib.contextmanager
def quiet_model_loading(quiet: bool = True):
    """Without transformers' progress bars (its "Loading weights" bar, drawn for every model loaded, which takes a
    blink): a command's own bars and its output are what it shows. `train` keeps them (its long steps show progress)."""
    from transformers.utils import logging as transformers_logging

    was_enabled = transformers_logging.is_progress_bar_enabled()
    if quiet:
        transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if quiet and was_enabled:
            transformers_logging.enable_progress_bar()


@contextlib.contextmanager
def quiet_when_the_reader_goes():
    """A reader of standard output that stops reading (`translate | head -1`) ends the command as it ends a Unix
    filter: quietly, with exit status 141 (128 + SIGPIPE), the work left undone. Standard output is pointed at the null
    device first, or Python's flush at exit would fail on the closed pipe again. A broken pipe that is not standard
    output's is a bug and keeps its traceback."""
    try:
        yield
    except BrokenPipeError:
        try:
            stdout_is_a_pipe = stat.S_ISFIFO(os.fstat(sys.stdout.fileno()).st_mode)
        except (OSError, ValueError, AttributeError):  # closed, or replaced by an object without a file
            stdout_is_a_pipe = False
        if not stdout_is_a_pipe:
            raise
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)


@contextlib.contextmanager
def sigterm_as_a_stop(name: str):
    """SIGTERM (`kill`, a job scheduler) stops the command `name` as Ctrl-C does: the file or folder it was writing is
    removed (`text_files.output_file`, `output_folder`), what was there before kept, and one line says so, exit status
    143 (`errors.Preempted`). `train` handles SIGTERM itself, with a checkpoint first (`train_run/run.py`)."""
    if name == "train" or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(number, frame):
        raise Preempted(f"stopped by {signal.Signals(number).name}", number)

    former = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, former)


def asks_for_help(argv: list[str]) -> bool:
    """Whether a command's arguments ask for its --help, which its parser prints without loading anything."""
    return any(argument in ("-h", "--help") for argument in argv)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = CommandParser(
        prog="vanilla-transformer",
        description='The Transformer of "Attention Is All You Need" as a Hugging Face model: train, translate, '
        "evaluate and share it.",
        epilog="Run `vanilla-transformer COMMAND --help` for the options of a command.",
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command", required=True)
    for name, (_, summary) in COMMANDS.items():
        commands.add_parser(name, help=summary, add_help=False)
    if not argv:
        parser.print_help()
        sys.exit(2)
    try:  # --help prints the list of commands; an unknown one is an error
        name = parser.parse_args(argv[:1]).command
    except UserError as error:
        print(f"vanilla-transformer: error: {error}", file=sys.stderr)
        sys.exit(2)
    command, _ = COMMANDS[name]
    with quiet_when_the_reader_goes(), one_line_errors(name), sigterm_as_a_stop(name):
        if asks_for_help(argv[1:]):
            command(argv[1:])
            return
        # The model's classes and pipelines registered with transformers (model/__init__.py), for the commands that
        # load or save a model: the package's __init__ leaves them to the first use when the command line starts.
        # translate and evaluate leave it to their backend: CTranslate2's needs neither torch nor the registration.
        if name not in REGISTERED_BY_BACKEND:
            from ..model import register

            register()
        with quiet_model_loading(name != "train"):
            command(argv[1:])


if __name__ == "__main__":
    # `python -m vanilla_transformer.cli` (torchrun): the package's own module runs, so that the `UserError` the
    # commands raise is the class `main` catches, not a copy in `__main__`.
    from vanilla_transformer.cli.main import main as package_main

    package_main()
