"""The `vanilla-transformer` command: `train` and `average` (more subcommands build on these)."""

import argparse
import sys


def average_command(argv: list[str]) -> None:
    from .averaging import average_checkpoints, find_checkpoints

    parser = argparse.ArgumentParser(
        prog="vanilla-transformer average",
        description="Average the weights of the last N checkpoints of a run (section 6.1: 5 for base, 20 for big).",
    )
    parser.add_argument("--run", required=True, help="A Trainer output folder holding checkpoint-<step> folders.")
    parser.add_argument("--last", type=int, default=5, help="How many of the latest checkpoints to average.")
    parser.add_argument("--out", required=True, help="Folder for the averaged model (loads with from_pretrained).")
    args = parser.parse_args(argv)
    checkpoints = find_checkpoints(args.run, args.last)
    average_checkpoints(checkpoints, args.out)
    print(f"averaged {len(checkpoints)} checkpoints ({', '.join(str(c) for c in checkpoints)}) into {args.out}")


def train_command(argv: list[str]) -> None:
    from .train import main

    main(argv)


COMMANDS = {"train": train_command, "average": average_command}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: vanilla-transformer {{{','.join(COMMANDS)}}} [options]   (COMMAND --help for its options)")
        sys.exit(0 if argv and argv[0] in ("-h", "--help") else 2)
    COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    main()
