"""`vanilla-transformer train`: the number-words demo when no data flag is given, else a run of the paper's recipe on
the data the flags give (training/run.py). A resumed run keeps its kind, as its record says.

`train --help` imports neither torch nor transformers: it shows the package's flags and the Trainer's flags the
command sets, with the demo's values beside the defaults; `train --help-trainer` lists every flag, with transformers'
help.
"""

import sys
from dataclasses import replace

from ..training.arguments import DATA_FLAGS, given_flags, train_help
from ..training.profile import PAPER_PROFILE, RunProfile
from .profile import DEMO_PROFILE


DESCRIPTION = ("Train (or fine-tune) a translation model with the paper's recipe on Seq2SeqTrainer. With no data flags "
               "it trains the number-words demo, whose own settings --help shows beside the defaults (demo: VALUE).")
HELP_FLAGS = ("-h", "--help")


def main(argv: list[str] | None = None):
    """Run the `train` command on `argv` (by default the process's arguments); returns the Trainer."""
    argv = sys.argv[1:] if argv is None else argv
    if set(HELP_FLAGS) & set(argv):
        print(help_text())
        sys.exit(0)
    from ..training import parsing, run  # torch and transformers: after --help

    if "--help-trainer" in argv:
        print(parsing.trainer_help(DESCRIPTION, DEMO_PROFILE))
        sys.exit(0)
    return run.main(argv, chosen_profile(argv))


def help_text() -> str:
    """`train --help`, without torch or transformers."""
    return train_help(DESCRIPTION, DEMO_PROFILE.defaults, DEMO_PROFILE.name)


def chosen_profile(argv: list[str]) -> RunProfile:
    """The kind of run `argv` asks for: the paper's recipe on the data flags' data, else the demo, unless the run it
    resumes (found as `training.run.main` finds it, in the demo's folder by default) recorded that it is not the
    demo: then that run, in the demo's folder."""
    if given_flags(argv) & set(DATA_FLAGS):
        return PAPER_PROFILE
    from ..training.resume import resolve_resume, resume_checkpoint
    from ..training.run_record import recorded_run

    checkpoint = resume_checkpoint(resolve_resume(argv, DEMO_PROFILE.output_dir)[0])
    record = recorded_run(checkpoint) if checkpoint else None
    if record is not None and record.demo is False:
        return replace(PAPER_PROFILE, output_dir=DEMO_PROFILE.output_dir)
    return DEMO_PROFILE


def parse_arguments(argv: list[str] | None = None, continued: bool = False):
    """The `train` command's arguments for `argv` (`training.parsing.RunArguments`), with the profile it chooses."""
    from ..training.parsing import parse_arguments

    argv = sys.argv[1:] if argv is None else argv
    return parse_arguments(argv, chosen_profile(argv), continued)


if __name__ == "__main__":
    main()
