"""`vanilla-transformer train` and `average`: a training run, and the average of its last checkpoints.

`train` is the number-words demo when no data flag is given, else a run of the paper's recipe on the data the flags
give (`train_run/run.py`); a resumed run keeps its kind, as its record says. `train --help` imports neither torch nor
transformers: it shows the package's flags and the Trainer's flags the command sets, with the demo's values beside
the defaults; `train --help-trainer` lists every flag, with transformers' help.
"""

import sys
from dataclasses import replace

from ..demo.profile import DEMO_PROFILE
from ..paths.disk import folder_size, write_errors
from ..errors import CommandParser
from ..paths.files import check_output_folder
from ..train_run.arguments import DATA_FLAGS, given_flags, train_help
from ..train_run.profile import PAPER_PROFILE, RunProfile
from .arguments import positive_int
from .errors import user_errors


DESCRIPTION = ("Train (or fine-tune) a translation model with the paper's recipe on Seq2SeqTrainer. With no data flags "
               "it trains the number-words demo, whose own settings --help shows beside the defaults (demo: VALUE).")
HELP_FLAGS = ("-h", "--help")


def train_command(argv: list[str] | None = None):
    """Run the `train` command on `argv` (by default the process's arguments); returns the Trainer."""
    argv = sys.argv[1:] if argv is None else argv
    if set(HELP_FLAGS) & set(argv):
        print(train_help_text())
        sys.exit(0)
    from ..train_run import parsing, run  # torch and transformers: after --help

    if "--help-trainer" in argv:
        print(parsing.trainer_help(DESCRIPTION, DEMO_PROFILE))
        sys.exit(0)
    return run.main(argv, chosen_profile(argv))


def train_help_text() -> str:
    """`train --help`, without torch or transformers."""
    return train_help(DESCRIPTION, DEMO_PROFILE.defaults, DEMO_PROFILE.name)


def chosen_profile(argv: list[str]) -> RunProfile:
    """The kind of run `argv` asks for: the paper's recipe on the data flags' data, else the demo, unless the run it
    resumes (found as `train_run.run.main` finds it, in the demo's folder by default) recorded that it is not the demo:
    then that run, in the demo's folder."""
    if given_flags(argv) & set(DATA_FLAGS):
        return PAPER_PROFILE
    from ..train_run.resume import resolve_resume, resume_checkpoint
    from ..train_run.run_record import checkpoint_run_record

    checkpoint = resume_checkpoint(resolve_resume(argv, DEMO_PROFILE.output_dir)[0])
    record = checkpoint_run_record(checkpoint) if checkpoint else None
    if record is not None and record.demo is False:
        return replace(PAPER_PROFILE, output_dir=DEMO_PROFILE.output_dir)
    return DEMO_PROFILE


def parse_arguments(argv: list[str] | None = None, continued: bool = False):
    """The `train` command's arguments for `argv` (`train_run.parsing.RunArguments`), with the profile it chooses."""
    from ..train_run.parsing import parse_arguments

    argv = sys.argv[1:] if argv is None else argv
    return parse_arguments(argv, chosen_profile(argv), continued)


def average_command(argv: list[str]) -> None:
    parser = CommandParser(
        prog="vanilla-transformer average",
        description="Average the weights of the last N checkpoints of a run (section 6.1: 5 for base, 20 for big).",
    )
    parser.add_argument("--run", required=True, help="A Trainer output folder holding checkpoint-<step> folders.")
    parser.add_argument("--last", type=positive_int, default=5, help="How many of the latest checkpoints to average.")
    parser.add_argument("--out", required=True, help="Folder for the averaged model (loads with from_pretrained).")
    parser.add_argument("--force", action="store_true", help="Replace the model --out already holds.")
    args = parser.parse_args(argv)
    from ..training.averaging import AveragingError, average_checkpoints, find_checkpoints
    from ..training.checkpoints import IncompleteCheckpointError, complete_checkpoints

    check_output_folder(args.out)
    with user_errors(AveragingError, IncompleteCheckpointError, OSError):
        checkpoints = find_checkpoints(args.run, args.last)
        for path, problem in complete_checkpoints(args.run, to_resume=False)[1].items():
            print(f"skipped {path}, an incomplete checkpoint: {problem}", file=sys.stderr)
        with write_errors(args.out, needed=folder_size(checkpoints[-1], "model.safetensors", "*.json", "*.py")):
            average_checkpoints(checkpoints, args.out, force=args.force)
    print(f"averaged {len(checkpoints)} checkpoints ({', '.join(str(c) for c in checkpoints)}) into {args.out}")
