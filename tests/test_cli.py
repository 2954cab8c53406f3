"""The `vanilla-transformer` command explains itself: `--help` lists every command with its summary, every command has
its own `--help`, and options are spelled with dashes everywhere (`train` also takes transformers' underscores)."""

import pytest

from vanilla_transformer.cli import COMMANDS, main


def test_help_lists_every_command_with_its_summary(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    listing = " ".join(capsys.readouterr().out.split())  # argparse wraps the summaries
    for name, (_, summary) in COMMANDS.items():
        assert f"{name} {summary}" in listing


def test_no_command_prints_the_list_and_fails(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


def test_an_unknown_command_is_named(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["translte"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'translte'" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_has_its_help(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: vanilla-transformer {name} ")
    options = [word.strip(",[]") for word in out.split() if word.startswith(("--", "[--"))]
    if name == "train":  # both spellings of every option
        assert "--max-tokens" in options and "--max_tokens" in options
    else:
        assert options and not any("_" in option for option in options)


def test_train_takes_dashes_and_underscores():
    from vanilla_transformer.train import parse_arguments

    dashed = ["--train-file", "pairs.tsv", "--output-dir", "out", "--max-tokens", "512", "--max-steps", "3"]
    underscored = ["--train_file", "pairs.tsv", "--output_dir", "out", "--max_tokens", "512", "--max_steps", "3"]
    for argv in (dashed, underscored):
        _, data_args, _, training_args, is_demo = parse_arguments(argv)
        assert not is_demo and training_args.output_dir == "out"
        assert (data_args.train_file, data_args.max_tokens, training_args.max_steps) == ("pairs.tsv", 512, 3)
    with pytest.raises(SystemExit):  # own data, spelled with dashes, still needs an output folder
        parse_arguments(["--source-file", "train.en", "--target-file", "train.de"])
