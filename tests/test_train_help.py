"""`train --help` imports neither torch nor transformers, and shows what the full parser (`train --help-trainer`)
knows: the package's flags in both spellings, transformers' defaults of the Trainer flags it shows, the presets."""

import dataclasses
import subprocess
import sys

import pytest

# The package's __init__ imports the model (for the Auto classes): the help's own imports are what is tested, so the
# subprocess makes the package a bare namespace first.
HELP_WITHOUT_TORCH = """
import importlib.util, sys, types
spec = importlib.util.find_spec("vanilla_transformer")
package = types.ModuleType("vanilla_transformer")
package.__path__ = list(spec.submodule_search_locations)
sys.modules["vanilla_transformer"] = package
from vanilla_transformer.cli.train import train_command as main
try:
    main(["--help"])
except SystemExit as stop:
    assert stop.code == 0, stop.code
assert "torch" not in sys.modules and "transformers" not in sys.modules, "imported torch or transformers"
"""


@pytest.mark.slow  # a process of its own
def test_train_help_imports_neither_torch_nor_transformers():
    shown = subprocess.run([sys.executable, "-c", HELP_WITHOUT_TORCH], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    out = " ".join(shown.stdout.split())
    assert out.startswith("usage: vanilla-transformer train [--help] [options]")
    assert "(default: 4000; demo: 300)" in out and "--help-trainer" in out


def test_train_help_shows_every_flag_of_the_full_parser_and_transformers_defaults():
    from transformers import Seq2SeqTrainingArguments

    from vanilla_transformer.cli.train import train_help_text as help_text
    from vanilla_transformer.model.configuration_vanilla_transformer import PRESETS
    from vanilla_transformer.train_run.arguments import ARGUMENT_CLASSES, PRESET_NAMES, TRAINER_DEFAULTS
    from vanilla_transformer.train_run.parsing import argument_parser

    shown = help_text().split()
    ours = {item.name for cls in ARGUMENT_CLASSES for item in dataclasses.fields(cls)}
    for action in argument_parser()._actions:
        if action.dest in ours:
            for option in action.option_strings:
                assert option in shown or f"{option}," in shown, option
    trainer_fields = {item.name: item for item in dataclasses.fields(Seq2SeqTrainingArguments)}
    for name, default in TRAINER_DEFAULTS.items():
        assert trainer_fields[name].default == default, name
    assert sorted(PRESET_NAMES) == sorted(PRESETS)


def test_train_help_trainer_lists_the_trainers_flags_with_the_demos_values(capsys):
    from vanilla_transformer.cli.train import train_command as main

    with pytest.raises(SystemExit) as exit_info:
        main(["--help-trainer"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--gradient_accumulation_steps" in out and "(default: 37000; demo: 1000)" in out
