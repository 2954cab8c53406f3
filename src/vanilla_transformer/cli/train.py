"""`vanilla-transformer train` and `average`: a training run, and the average of its last checkpoints."""

import sys

from ..disk import folder_size, write_errors
from ..errors import CommandParser, user_errors
from ..files import check_output_folder
from .arguments import positive_int


def train_command(argv: list[str]) -> None:
    from ..demo.train_command import main  # the demo when no data is given; --help without torch

    main(argv)


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
    from ..training.averaging import average_checkpoints, find_checkpoints
    from ..training.checkpoints import complete_checkpoints

    check_output_folder(args.out)
    with user_errors(ValueError, OSError):
        checkpoints = find_checkpoints(args.run, args.last)
        for path, problem in complete_checkpoints(args.run, to_resume=False)[1].items():
            print(f"skipped {path}, an incomplete checkpoint: {problem}", file=sys.stderr)
        with write_errors(args.out, needed=folder_size(checkpoints[-1], "model.safetensors", "*.json", "*.py")):
            average_checkpoints(checkpoints, args.out, force=args.force)
    print(f"averaged {len(checkpoints)} checkpoints ({', '.join(str(c) for c in checkpoints)}) into {args.out}")
