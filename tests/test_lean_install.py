"""The core install: without the optional packages of the extras (train, ct2, onnx, plots, demo), the package imports, a model
saves, loads, generates and translates through `pipeline()` and the translate command, and the features of a missing
extra say in one line which extra installs them."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # a fresh interpreter importing the package without the extras


# The packages of the extras, and what only they bring in: a core install has none of them.
OPTIONAL_PACKAGES = [
    "ctranslate2",
    "onnx",
    "onnxruntime",
    "onnxscript",
    "matplotlib",
    "num2words",
    "sacremoses",
    "tensorboard",
    "datasets",
    "accelerate",
    "evaluate",
    "pyarrow",
    "pandas",
    "gradio",
    "gradio_client",
    "selenium",
]

# Run in a fresh interpreter where the optional packages cannot be imported: None in `sys.modules` makes `import`
# raise ModuleNotFoundError and `importlib.util.find_spec` answer None, so transformers sees them as not installed.
LEAN_SCRIPT = """
import contextlib, io, json, sys, tempfile
from pathlib import Path

for name in OPTIONAL_PACKAGES:
    sys.modules[name] = None

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

import vanilla_transformer
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.cli.main import main
from vanilla_transformer.training.tokenization import train_tokenizer
from vanilla_transformer.inference.translate import translate_lines

report = {}
folder = Path(tempfile.mkdtemp())
tokenizer = train_tokenizer(["a cat sat on the mat", "le chat est assis sur le tapis"] * 4, vocab_size=260,
                            show_progress=False)
config = VanillaTransformerConfig.from_preset(
    "tiny", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
    eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.bos_token_id,
)
torch.manual_seed(0)
random_model = VanillaTransformerForConditionalGeneration(config)
# Outputs of letters only, so that every translation is visible text.
letters = set(tokenizer.convert_tokens_to_ids(list("abcdefghijklmnopqrstuvwxyz")))
random_model.generation_config.suppress_tokens = [i for i in range(len(tokenizer)) if i not in letters]
random_model.save_pretrained(folder / "model")
tokenizer.save_pretrained(folder / "model")

model = AutoModelForSeq2SeqLM.from_pretrained(folder / "model")
loaded_tokenizer = AutoTokenizer.from_pretrained(folder / "model")
generated = model.generate(**loaded_tokenizer(["a cat"], return_tensors="pt"), num_beams=2, max_new_tokens=4)
report["generate"] = list(generated.shape)
report["pipeline"] = pipeline("translation", model=str(folder / "model"))("a cat", max_new_tokens=4)[0]

(folder / "in.txt").write_text("a cat\\n\\nthe mat\\n", encoding="utf-8")
main(["translate", "--model", str(folder / "model"), "--input", str(folder / "in.txt"),
      "--output", str(folder / "out.txt"), "--num-beams", "1", "--max-new-tokens", "3"])
report["translate"] = (folder / "out.txt").read_text(encoding="utf-8").split("\\n")
report["translate_lines"] = translate_lines(model, loaded_tokenizer, ["a cat", "", "the mat"], num_beams=1,
                                            max_new_tokens=3)

with contextlib.redirect_stdout(io.StringIO()) as printed:
    main(["evaluate", "--model", str(folder / "model"), "--src", str(folder / "in.txt"), "--ref",
          str(folder / "in.txt"), "--num-beams", "1", "--max-new-tokens", "3"])
report["evaluate"] = printed.getvalue().splitlines()

report["refused"] = {}
for label, argv in (
    ("export-ct2", ["export-ct2", "--model", str(folder / "model"), "--out", str(folder / "ct2")]),
    ("translate --backend ct2",
     ["translate", "--backend", "ct2", "--model", str(folder / "model"), "--input", str(folder / "in.txt")]),
    ("export-onnx", ["export-onnx", "--model", str(folder / "model"), "--out", str(folder / "onnx")]),
    ("translate --backend onnx",
     ["translate", "--backend", "onnx", "--model", str(folder / "model"), "--input", str(folder / "in.txt")]),
    ("train", ["train", "--max-steps", "1"]),
    ("demo", ["demo", "--model", str(folder / "model")]),
    ("push --space", ["push", "--space", "me/demo", "--model-repo", "me/model", "--dry-run", str(folder / "space")]),
):
    with contextlib.redirect_stderr(io.StringIO()) as errors:
        try:
            main(argv)
        except SystemExit as exit:  # the message on standard error, status 2
            report["refused"][label] = [exit.code, errors.getvalue()]
report["loaded"] = sorted(name for name in OPTIONAL_PACKAGES if sys.modules.get(name) is not None)
print(json.dumps(report))
"""


def test_core_features_work_without_the_optional_packages(tmp_path):
    script = f"OPTIONAL_PACKAGES = {OPTIONAL_PACKAGES!r}\n" + textwrap.dedent(LEAN_SCRIPT)
    # This interpreter's import path (the package and its installed dependencies), offline.
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600, cwd=tmp_path, env=environment,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])

    assert report["generate"][0] == 1 and report["generate"][1] > 1
    assert report["pipeline"]["translation_text"].isalpha()
    assert report["translate"] == [*report["translate_lines"], ""]
    assert report["translate"][0] and report["translate"][1] == ""
    assert report["evaluate"][0].startswith("BLEU = ") and report["evaluate"][2].startswith("chrF2 = ")
    # The lowercased Moses-tokenized BLEU needs sacremoses: evaluate says so and which extra brings it.
    assert report["evaluate"][4:] == [
        "BLEU (lowercased, Moses-tokenized): not computed, sacremoses is not installed; it comes with the train extra: "
        "pip install 'vanilla-transformer[train]'"
    ]
    assert report["loaded"] == []
    # A feature of a missing extra: status 2 and one line naming the extra to install.
    for command, extra in (("export-ct2", "ct2"), ("translate --backend ct2", "ct2"), ("export-onnx", "onnx"),
                           ("translate --backend onnx", "onnx"), ("train", "train"), ("demo", "demo"),
                           ("push --space", "demo")):
        status, message = report["refused"][command]
        assert status == 2 and message.endswith("\n") and "\n" not in message[:-1], (command, message)
        message = message[:-1]
        assert message.startswith(f"vanilla-transformer {command.split()[0]}: error: ")
        assert message.endswith(f"pip install 'vanilla-transformer[{extra}]'"), (command, message)
