"""The command line starts at once: `vanilla-transformer --help` and each `COMMAND --help` import neither torch,
transformers nor gradio (a fresh interpreter, started as the console script starts, through `vanilla_transformer_cli`)."""

import json
import subprocess
import sys

import pytest

from vanilla_transformer.cli.main import COMMANDS

# Runs the console script's entry with each of the argument lists in sys.argv[1] (JSON), then prints whether torch,
# transformers or gradio were imported after each.
HELP_SCRIPT = """
import json, sys
import vanilla_transformer_cli

report = {}
for argv in json.loads(sys.argv[1]):
    sys.argv = ["vanilla-transformer", *argv]
    try:
        vanilla_transformer_cli.main()
    except SystemExit:
        pass
    report[" ".join(argv)] = [name for name in ("torch", "transformers", "gradio") if name in sys.modules]
print(json.dumps(report))
"""


def imported_by(*argvs: list[str]) -> dict[str, list[str]]:
    """For each command line of `argvs`, run in turn in one fresh interpreter: torch, transformers and gradio, if
    imported."""
    run = subprocess.run(
        [sys.executable, "-c", HELP_SCRIPT, json.dumps(argvs)], capture_output=True, text=True, check=True
    )
    return json.loads(run.stdout.splitlines()[-1])


def test_help_and_every_commands_help_import_neither_torch_transformers_nor_gradio():
    argvs = [["--help"], *([name, "--help"] for name in COMMANDS)]
    assert imported_by(*argvs) == {" ".join(argv): [] for argv in argvs}


@pytest.mark.slow  # a process of its own
def test_importing_the_package_registers_the_model_with_transformers():
    """Outside the command line, `import vanilla_transformer` is eager, as documented: the Auto classes and the
    pipelines know the model."""
    script = """
import vanilla_transformer
from transformers import AutoConfig
from transformers.pipelines import PIPELINE_REGISTRY
config = AutoConfig.for_model("vanilla_transformer")
print(type(config).__name__, "translation" in PIPELINE_REGISTRY.get_supported_tasks())
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["VanillaTransformerConfig", "True"]
