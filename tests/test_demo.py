"""The number-words demo (`vanilla-transformer train` with no data): a corpus whose held-out numbers cover every
magnitude from 100 up, every number below 1,000 evaluated (those in training reported apart, as seen), and exact match
per magnitude in the printed and saved results. The demo itself trains for minutes and is not run here."""

import json
import random
import shlex
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import ctrl_c_at_step
from safetensors.torch import load_file

from vanilla_transformer.demo.corpus import describe_training, magnitude, number_words_corpus, sample_numbers


MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"
# The demo's data and reporting with a tiny model trained for a few steps, a checkpoint each.
TINY_DEMO = [
    "--demo_train_size", "14000", "--demo_max_digits", "4", "--warmup_steps", "1", "--d_model", "32", "--layers", "1",
    "--heads", "2", "--ffn_dim", "64", "--vocab_size", "300", "--save_steps", "1", "--report_to", "none",
    "--disable_tqdm", "true", "--generation_num_beams", "1", "--generation_max_length", "8",
]


def make_demo_command() -> list[str]:
    """The `vanilla-transformer` arguments of the Makefile's `demo` recipe."""
    recipe = MAKEFILE.read_text(encoding="utf-8").split("\ndemo:", 1)[1].splitlines()[1]
    program, *arguments = shlex.split(recipe, comments=True)
    assert program.endswith("/vanilla-transformer"), recipe
    return arguments


@pytest.fixture(scope="module")
def demo_corpus():
    """A corpus of the demo's kind at a third of its default size (20,000 training pairs, numbers up to 6 digits), as
    against conftest's small `corpus` (600 pairs of up to 4 digits) that feeds the tokenizers and short runs."""
    return number_words_corpus("fr", train_size=20000, validation_size=100, test_size=300, max_digits=6,
                               repeats_below_10=80, repeats_short=50, repeats_hundreds=20, seed=0)


def test_magnitude_is_the_range_of_numbers_with_as_many_digits():
    assert [magnitude(n) for n in (0, 9, 10, 99, 100, 999, 1000, 42_007, 999_999)] == [
        "0-9", "0-9", "10-99", "10-99", "100-999", "100-999", "1,000-9,999", "10,000-99,999", "100,000-999,999"]


def test_held_out_numbers_cover_every_magnitude_from_100_and_are_never_in_training(demo_corpus):
    train, validation = set(demo_corpus["train"]["number"]), set(demo_corpus["validation"]["number"])
    test = demo_corpus["test"]["number"]
    assert not train & set(test) and not validation & set(test) and not train & validation
    assert test == sorted(set(test))
    counts = Counter(demo_corpus["test"]["magnitude"])
    assert list(counts) == ["100-999", "1,000-9,999", "10,000-99,999", "100,000-999,999"]
    assert counts["100-999"] == 450 and sum(counts.values()) == 450 + 300
    # The test numbers are drawn before the training ones, the digit count uniformly: each magnitude has its share.
    assert all(70 <= counts[m] <= 130 for m in ["1,000-9,999", "10,000-99,999", "100,000-999,999"]), counts
    assert demo_corpus["test"]["magnitude"] == [magnitude(n) for n in test]


def test_every_number_below_1000_is_evaluated_held_out_or_seen_in_training(demo_corpus):
    train = Counter(demo_corpus["train"]["number"])
    seen = demo_corpus["seen"]["number"]
    held_out = [n for n in demo_corpus["test"]["number"] if n < 1000]
    assert set(seen) | set(held_out) == set(range(1000)) and not set(seen) & set(held_out)
    assert set(range(100)) <= set(seen)
    # Many copies of the short ones (below 100, round hundreds), for token batches to spread them over many steps.
    assert all(train[n] == (80 if n < 10 else 50 if n < 100 or n % 100 == 0 else 20) for n in seen)
    assert len(demo_corpus["train"]) == 20000 and sum(train[n] for n in train if n >= 1000) == 20000 - sum(
        train[n] for n in seen)
    assert demo_corpus["seen"][9]["translation"] == {"en": "nine", "fr": "neuf"}
    assert demo_corpus["seen"][9]["magnitude"] == "0-9"
    round_hundreds = sum(n % 100 == 0 for n in seen) - 1  # 0 is not one
    assert (f"every number below 10, 80 times each, the others below 100 and {round_hundreds} of the 9 round "
            f"hundreds, 50 times each, "
            f"{450 - round_hundreds} of the other numbers 100-999, 20 times each") in describe_training(
        demo_corpus["train"])


def test_training_numbers_have_digit_counts_in_proportion_to_themselves_test_numbers_uniform(demo_corpus):
    # Five to seven digits: enough distinct numbers of each count that redrawing repeats does not skew the counts.
    weighted = Counter(len(str(n)) for n in sample_numbers(6000, random.Random(0), 5, 7, set(), weight_by_digits=True))
    assert all(abs(weighted[digits] - 6000 * digits / 18) < 150 for digits in (5, 6, 7)), weighted  # 5 : 6 : 7
    uniform = Counter(len(str(n)) for n in sample_numbers(6000, random.Random(0), 5, 7, set()))
    assert all(abs(uniform[digits] - 2000) < 150 for digits in (5, 6, 7)), uniform
    large = Counter(len(str(n)) for n in demo_corpus["train"]["number"] if n >= 1000)
    assert large[4] < large[5] < large[6]
    assert (f"({large[4]:,} of 4 digits, {large[5]:,} of 5 digits, {large[6]:,} of 6 digits)"
            in describe_training(demo_corpus["train"]))


def test_corpus_refuses_sizes_it_cannot_hold():
    with pytest.raises(ValueError, match="below 1,000"):
        number_words_corpus(train_size=10000, repeats_short=50, repeats_hundreds=20)  # ~14,000 pairs below 1,000
    with pytest.raises(ValueError, match="max_digits"):
        number_words_corpus(max_digits=3)


def test_make_demo_continues_an_interrupted_demo_and_replaces_a_finished_one():
    assert make_demo_command() == ["train", "--overwrite-finished-run"]


@pytest.mark.slow  # three runs of the demo's command: training, evaluation, model card
def test_make_demos_command_after_ctrl_c_continues_the_demo_and_once_finished_replaces_it(
    tmp_path, capsys, caplog, monkeypatch
):
    from vanilla_transformer.cli.main import main
    from vanilla_transformer.hub.card_facts import RunRecord

    monkeypatch.chdir(tmp_path)  # the demo's folder, outputs/number-words-en-fr, in it
    out = Path("outputs/number-words-en-fr")
    argv = [*make_demo_command(), *TINY_DEMO, "--max_steps", "3", "--average_last", "2"]
    with ctrl_c_at_step(3), pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"vanilla-transformer train: interrupted after step 2; the newest complete checkpoint is "
        f"{out / 'checkpoint-2'}: the same command continues the run from it")
    with caplog.at_level("INFO", logger="vanilla_transformer"):
        main(argv)
    assert f"continuing it from {out / 'checkpoint-2'}, its newest complete checkpoint (step 2)" in caplog.text
    assert RunRecord.read(out).facts.sessions == 2 and (out / "card_results.json").is_file()
    caplog.clear()
    with caplog.at_level("INFO", logger="vanilla_transformer"):
        main(argv)
    assert f"{out} holds a finished run: --overwrite-finished-run replaces it with a new one" in caplog.text
    assert RunRecord.read(out).facts.sessions == 1 and RunRecord.read(out).facts.steps == 3


@pytest.mark.slow  # the demo's command end to end: training, evaluation, model card
def test_demo_prints_and_saves_exact_match_per_magnitude(tmp_path, capsys):
    from vanilla_transformer.cli.train import train_command as main

    out = tmp_path / "demo"
    main(["--output_dir", str(out), *TINY_DEMO, "--max_steps", "2", "--average_last", "2"])
    printed = capsys.readouterr().out
    assert "Held-out (950 pairs, beam 1)" in printed
    assert "Seen in training (the 550 numbers below 1,000 of the training set)" in printed
    for line in ["0-9:    10 pairs", "10-99:    90 pairs", "100-999:   450 pairs", "1,000-9,999:   500 pairs"]:
        assert line in printed
    assert "Model: the average of the last 2 checkpoints (steps 1-2)" in printed  # section 6.1
    saved, step_1, step_2 = (load_file(out / path / "model.safetensors") for path in ("", "checkpoint-1", "checkpoint-2"))
    for name, tensor in saved.items():
        torch.testing.assert_close(tensor, (step_1[name] + step_2[name]) / 2)

    results = json.loads((out / "test_results.json").read_text())
    for key in ["test_exact_match", "test_exact_match_100-999", "test_exact_match_1000-9999", "seen_exact_match",
                "seen_exact_match_0-9", "seen_exact_match_10-99", "seen_exact_match_100-999", "seen_bleu"]:
        assert 0 <= results[key] <= 100, key

    card = json.loads((out / "card_results.json").read_text())
    by_magnitude = card["exact_match_by_magnitude"]
    assert {m: v["pairs"] for m, v in by_magnitude["test"].items()} == {"100-999": 450, "1,000-9,999": 500}
    assert {m: v["pairs"] for m, v in by_magnitude["seen"].items()} == {"0-9": 10, "10-99": 90, "100-999": 450}
    assert by_magnitude["seen"]["0-9"]["exact_match"] == results["seen_exact_match_0-9"]
    assert [(r["split"], r["num_sentences"]) for r in card["results"]] == [("test", 950), ("train", 550)]
    assert card["variants"][0]["model"] == "the average of the last 2 checkpoints (steps 1-2)"
    first, second = card["samples"]  # one of each held-out magnitude
    assert "hundred" in first["source"] and "thousand" not in first["source"] and "thousand" in second["source"]
    readme = (out / "README.md").read_text()
    assert "below 1,000, seen in training (550 sentences)" in readme and "held-out numbers (950 sentences)" in readme


@pytest.mark.parametrize("native, given, bf16", [
    (True, [], True),  # an Intel Xeon with AVX512-BF16 or AMX: the demo's bf16
    (False, [], False),  # an AVX2-only CPU emulates bfloat16, many times slower than float32: dropped
    (False, ["--bf16", "true"], True),  # given, it stays
])
def test_the_demos_bf16_is_kept_only_where_the_cpu_computes_bfloat16(native, given, bf16, monkeypatch):
    from vanilla_transformer.demo.profile import DEMO_PROFILE
    from vanilla_transformer.train_run import parsing

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine trains the demo on its GPU")
    monkeypatch.setattr(parsing, "cpu_computes_bfloat16", lambda: native)
    assert parsing.parse_arguments([*given], DEMO_PROFILE).training.bf16 is bf16
