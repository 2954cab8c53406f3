"""The examples run end to end in their smoke modes (tiny models, a few steps), so they cannot rot."""

import gzip
import json
import runpy
import sys
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from transformers import GenerationConfig

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


@pytest.fixture
def multi30k_like(tmp_path):
    """The real corpus when it is beside the project, else a few made-up lines in its layout."""
    if MULTI30K.exists():
        return MULTI30K
    folder = tmp_path / "multi30k"
    folder.mkdir()
    lines = {"en": [f"a man number {i} rides a bike ." for i in range(60)],
             "de": [f"ein mann nummer {i} fährt fahrrad ." for i in range(60)]}
    for split in ("train", "val", "test_2016_flickr"):
        for lang, text in lines.items():
            with gzip.open(folder / f"{split}.{lang}.gz", "wt", encoding="utf-8") as file:
                file.write("\n".join(text) + "\n")
    return folder


def test_multi30k_recipe_smoke(multi30k_like, tmp_path, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["run.py", "--data-dir", str(multi30k_like), "--output-dir", str(out),
                                      "--size", "smoke", "--seed", "1", "--average-last", "3",
                                      "--length-penalty", "0.8", "--dropout", "0.05", "--d_model", "48",
                                      "--attention_dropout", "0.1", "--activation_dropout", "0.2",
                                      "--bpe_dropout", "0.1", "--bpe_dropout_target", "false"])
    runpy.run_path(str(EXAMPLES / "multi30k" / "run.py"), run_name="__main__")
    # Options run.py does not know are the train command's, after the size's, so they override it.
    config = json.loads((out / "averaged" / "config.json").read_text())
    assert (config["dropout"], config["d_model"], config["encoder_layers"]) == (0.05, 48, 2)
    assert (config["attention_dropout"], config["activation_dropout"]) == (0.1, 0.2)
    rows = json.loads((out / "results.json").read_text())
    assert [(row["decoding"]) for row in rows] == ["beam 4, length penalty 0.8", "greedy"] * 2
    assert rows[0]["model"].startswith("average of the last 3 checkpoints (steps 4-6)")
    # The shared model decodes as its results were measured: pipeline() and the card read its generation config.
    assert GenerationConfig.from_pretrained(out / "averaged").length_penalty == 0.8
    assert GenerationConfig.from_pretrained(out / "checkpoint-6").length_penalty == 0.6
    for name in ("training", "attention_encoder", "attention_decoder", "attention_cross"):
        assert (out / "plots" / f"{name}.png").read_bytes().startswith(b"\x89PNG")
    card = ModelCard.load(out / "averaged" / "README.md")
    (bleu,) = [result for result in card.data.eval_results if result.metric_type == "bleu"]
    assert bleu.metric_value == pytest.approx(rows[0]["bleu"], abs=0.01)
    assert card.data.language == ["en", "de"] and "beam size 4, length penalty 0.8" in card.text
    assert "| BPE-dropout | 0.1 on the training sources, drawn anew every epoch (not in the paper" in card.text
    # The card also shows the whole results table and the plots, which sit next to it.
    for row in rows:
        assert f"| {row['model']} | {row['decoding']} | {row['bleu']:.2f} | {row['chrf']:.2f} |" in card.text
    for name in ("training", "attention_encoder", "attention_decoder", "attention_cross"):
        assert f"]({name}.png)" in card.text
        assert (out / "averaged" / f"{name}.png").read_bytes() == (out / "plots" / f"{name}.png").read_bytes()
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    # Validation in training is its loss only (no generate() on the training clock); the BLEU curve for the plot is
    # computed from the checkpoints at the validation steps (3 and 6) after training.
    assert any("eval_loss" in entry for entry in history) and not any("eval_bleu" in entry for entry in history)
    assert [step for step, _ in json.loads((out / "validation_bleu.json").read_text())] == [3, 6]


def test_multi30k_recipe_reads_train_options_spelled_either_way():
    recipe = runpy.run_path(str(EXAMPLES / "multi30k" / "run.py"))
    for flags in (["--max_tokens", "512"], ["--max-tokens", "512"], ["--max-tokens=1024", "--max_tokens=512"]):
        assert recipe["flag_value"](flags, "--max_tokens", int) == 512
    assert recipe["flag_value"](["--seed", "3"], "--seed", int) == 3
