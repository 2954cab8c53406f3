"""The examples run end to end in their smoke modes (tiny models, a few steps), so they cannot rot."""

import gzip
import json
import runpy
import sys
from pathlib import Path

import pytest
from conftest import MULTI30K
from huggingface_hub import ModelCard
from transformers import GenerationConfig

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


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


@pytest.mark.slow
def test_multi30k_recipe_smoke(multi30k_like, tmp_path, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["run.py", "--data-dir", str(multi30k_like), "--output-dir", str(out),
                                      "--size", "smoke", "--seed", "1", "--average-last", "3",
                                      "--length-penalty", "0.8,1.6", "--dropout", "0.05", "--d_model", "48",
                                      "--attention_dropout", "0.1", "--activation_dropout", "0.2",
                                      "--bpe_dropout", "0.1", "--bpe_dropout_target", "false"])
    runpy.run_path(str(EXAMPLES / "multi30k" / "run.py"), run_name="__main__")
    # Options run.py does not know are the train command's, after the size's, so they override it.
    config = json.loads((out / "averaged" / "config.json").read_text())
    assert (config["dropout"], config["d_model"], config["encoder_layers"]) == (0.05, 48, 2)
    assert (config["attention_dropout"], config["activation_dropout"]) == (0.1, 0.2)
    # Two length penalties: each scored on the validation set, the better one used for test and saved with the model.
    choice = json.loads((out / "length_penalty.json").read_text())
    assert [trial["length_penalty"] for trial in choice["validation"]] == [0.8, 1.6]
    alpha = choice["chosen"]
    assert alpha == max(choice["validation"], key=lambda trial: trial["bleu"])["length_penalty"]
    rows = json.loads((out / "results.json").read_text())
    assert [(row["decoding"]) for row in rows] == [f"beam 4, length penalty {alpha:g}", "greedy"] * 2
    assert f"The length penalty {alpha:g}, chosen on the validation set" in (out / "results.md").read_text()
    assert rows[0]["model"].startswith("average of the last 3 checkpoints (steps 4-6)")
    assert all(0 <= row["bleu_bp"] <= 1 and 0 <= row["bleu_lc_moses"] <= 100 for row in rows)
    assert "|moses:de|" in rows[0]["bleu_lc_moses_signature"]
    # The shared model decodes as its results were measured: pipeline() and the card read its generation config.
    assert GenerationConfig.from_pretrained(out / "averaged").length_penalty == alpha
    assert GenerationConfig.from_pretrained(out / "checkpoint-6").length_penalty == 0.6
    for name in ("training", "attention_encoder", "attention_decoder", "attention_cross"):
        assert (out / "plots" / f"{name}.png").read_bytes().startswith(b"\x89PNG")
    card = ModelCard.load(out / "averaged" / "README.md")
    (bleu,) = [result for result in card.data.eval_results if result.metric_type == "bleu"]
    assert bleu.metric_value == pytest.approx(rows[0]["bleu"], abs=0.01)
    assert card.data.language == ["en", "de"] and f"beam size 4, length penalty {alpha:g}" in card.text
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


def fake_results(run_dir: Path, bleu: float, chrf: float, bp: float, lc_moses: float | None = None) -> None:
    """A run folder with the results.json the recipe writes: the averaged model with beam search first."""
    best = dict(model="average of the last 20 checkpoints (steps 5100-7000)", decoding="beam 4, length penalty 1",
                bleu=bleu, chrf=chrf, bleu_bp=bp, **({} if lc_moses is None else dict(bleu_lc_moses=lc_moses)))
    greedy = dict(best, decoding="greedy", bleu=1.0, chrf=2.0, bleu_bp=0.5)
    run_dir.mkdir(parents=True)
    (run_dir / "results.json").write_text(json.dumps([best, greedy]))


def test_multi30k_recipe_runs_each_seed_then_sums_them_up(tmp_path, monkeypatch, capsys):
    recipe = runpy.run_path(str(EXAMPLES / "multi30k" / "run.py"))
    scores = {0: (39.0, 63.0, 0.95, 41.0), 1: (40.0, 63.5, 0.975, 42.5), 2: (41.5, 64.5, 1.0, 43.0)}
    runs = []

    def made_up_run(args, limit):  # no training: the results a run would write
        runs.append((args.seed, args.output_dir))
        fake_results(args.output_dir, *scores[args.seed])

    monkeypatch.setitem(recipe["main"].__globals__, "run", made_up_run)
    recipe["main"](["--data-dir", str(tmp_path), "--output-dir", str(tmp_path / "seeds"), "--seeds", "0,1,2"])

    assert runs == [(seed, tmp_path / "seeds" / f"seed-{seed}") for seed in (0, 1, 2)]
    table = (tmp_path / "seeds" / "seeds.md").read_text()
    assert capsys.readouterr().out == table
    assert table.splitlines() == [
        "test_2016_flickr, beam 4, length penalty 1, over 3 runs (seed-0, seed-1, seed-2):",
        "",
        "| score | mean | range | each run |",
        "| --- | --- | --- | --- |",
        "| sacreBLEU | 40.17 | 39.00-41.50 | 39.00, 40.00, 41.50 |",
        "| chrF | 63.67 | 63.00-64.50 | 63.00, 63.50, 64.50 |",
        "| BLEU (lowercased, Moses-tokenized) | 42.17 | 41.00-43.00 | 41.00, 42.50, 43.00 |",
        "| brevity penalty | 0.975 | 0.950-1.000 | 0.950, 0.975, 1.000 |",
    ]


def test_multi30k_seeds_table_leaves_out_a_score_some_run_lacks(tmp_path):
    recipe = runpy.run_path(str(EXAMPLES / "multi30k" / "run.py"))
    fake_results(tmp_path / "old", 39.26, 62.9, 0.98)  # from before the lowercased Moses-tokenized BLEU
    fake_results(tmp_path / "new", 39.94, 63.45, 0.99, lc_moses=41.0)

    table = recipe["seeds_table"]([tmp_path / "old", tmp_path / "new"])

    assert "| sacreBLEU | 39.60 | 39.26-39.94 | 39.26, 39.94 |" in table
    assert "Moses" not in table and "| brevity penalty | 0.985 | 0.980-0.990 | 0.980, 0.990 |" in table


def test_multi30k_seeds_table_gives_the_tokenized_bleu_of_prepared_runs(tmp_path):
    """Runs on Wu et al.'s prepared text also score it as they do (fairseq's BLEU on the text as it is): its mean."""
    recipe = runpy.run_path(str(EXAMPLES / "multi30k" / "run.py"))
    for name, tokenized in (("seed-0", 40.5), ("seed-1", 41.75)):
        fake_results(tmp_path / name, 39.0, 63.0, 0.99, lc_moses=40.0)
        results = json.loads((tmp_path / name / "results.json").read_text())
        results[0]["bleu_tokenized"] = tokenized
        (tmp_path / name / "results.json").write_text(json.dumps(results))

    table = recipe["seeds_table"]([tmp_path / "seed-0", tmp_path / "seed-1"])

    assert "| BLEU (the tokenized text as it is, fairseq's) | 41.12 | 40.50-41.75 | 40.50, 41.75 |" in table


def test_multi30k_length_penalty_is_the_best_on_validation(monkeypatch):
    recipe = runpy.run_path(str(EXAMPLES / "multi30k" / "run.py"))
    bleu = {1.0: 39.5, 1.25: 40.0, 1.5: 40.25, 1.75: 40.25, 2.0: 37.5}  # a cliff past 1.75, two best alike
    decoded = []

    def made_up_evaluate(model_dir, sources, references, num_beams, length_penalty):
        decoded.append((model_dir, num_beams, length_penalty))
        return dict(bleu=bleu[length_penalty], bleu_bp=length_penalty / 2, chrf=60.0, bleu_lc_moses=41.0)

    monkeypatch.setitem(recipe["choose_length_penalty"].__globals__, "evaluate", made_up_evaluate)
    chosen, trials = recipe["choose_length_penalty"](Path("avg"), ["a"], ["b"], list(bleu))

    assert chosen == 1.5  # the highest BLEU; of two equal, the first (the shorter outputs)
    assert decoded == [(Path("avg"), 4, alpha) for alpha in bleu]
    assert [(trial["length_penalty"], trial["bleu"], trial["bleu_bp"]) for trial in trials] == [
        (alpha, bleu[alpha], alpha / 2) for alpha in bleu]


def test_multi30k_tiny_size_is_wu_et_al_recipe():
    recipe = runpy.run_path(str(EXAMPLES / "multi30k" / "run.py"))
    flags = recipe["SIZES"]["tiny"]
    wanted = {"--d_model": 128, "--layers": 4, "--heads": 4, "--ffn_dim": 256, "--dropout": 0.3,
              "--attention_dropout": 0.0, "--activation_dropout": 0.0, "--max_tokens": 8192, "--warmup_steps": 2000,
              "--learning_rate": 0.005, "--max_steps": 8000, "--max_train_minutes": 60.0}
    assert {name: recipe["flag_value"](flags, name, type(value)) for name, value in wanted.items()} == wanted
    assert recipe["AFTER_TRAINING"]["tiny"] == dict(average_last=10, length_penalty=[1.0, 1.25, 1.5, 1.75, 2.0],
                                                    num_beams=4, length_penalty_type="gnmt")


def test_multi30k_recipe_reads_train_options_spelled_either_way():
    recipe = runpy.run_path(str(EXAMPLES / "multi30k" / "run.py"))
    for flags in (["--max_tokens", "512"], ["--max-tokens", "512"], ["--max-tokens=1024", "--max_tokens=512"]):
        assert recipe["flag_value"](flags, "--max_tokens", int) == 512
    assert recipe["flag_value"](["--seed", "3"], "--seed", int) == 3


# Raw Multi30k lines and the same lines in Wu et al.'s prepared files (LividWo/Revisit-MMT, data/multi30k-en-de, BPE
# removed): lowercased, punctuation normalised, Moses-tokenized with Moses' escapes, hyphens kept.
WU2021_PREPARED = {
    "en": [("Two young, White males are outside near many bushes.",
            "two young , white males are outside near many bushes ."),
           ("A boy wearing headphones sits on a woman's shoulders.",
            "a boy wearing headphones sits on a woman &apos;s shoulders ."),
           ('Three people enter a building with a handwritten sign that says "Welcome Bikers."',
            "three people enter a building with a handwritten sign that says &quot; welcome bikers . &quot;")],
    "de": [("Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.",
            "ein boston terrier läuft über saftig-grünes gras vor einem weißen zaun ."),
           ("Ein Mann mit ergrauenden Haaren rasiert seinen Bart.",
            "ein mann mit ergrauenden haaren rasiert seinen bart ."),  # lowercased first: the period comes off
           ("Zwei Männer „kämpfen“.", "zwei männer &quot; kämpfen &quot; ."),  # normalised quotes (made up)
           ('Eine Frau auf einem Boot namens "El Corazon" lässt schwarze Gewichte ins Wasser fallen.',
            "eine frau auf einem boot namens &quot; el corazon &quot; lässt schwarze gewichte ins wasser fallen .")],
}


@pytest.mark.parametrize("lang", ["en", "de"])
def test_wu2021_preparation_writes_their_text(lang):
    recipe = runpy.run_path(str(EXAMPLES / "multi30k" / "run.py"))
    raw, prepared = zip(*WU2021_PREPARED[lang])
    assert recipe["prepare_like_wu2021"](list(raw), lang) == list(prepared)


def test_wu2021_preparation_run_again_leaves_the_files_as_they_were(multi30k, tmp_path):
    """The same command run again (to continue a stopped run) finds the bytes the run trained on: `train` refuses to
    resume on changed data, and a gzip time stamp alone would change them."""
    recipe = runpy.run_path(str(EXAMPLES / "multi30k" / "run.py"))
    out = recipe["prepared_data"](multi30k, tmp_path / "prepared", 20)
    written = {path.name: path.read_bytes() for path in out.iterdir()}
    assert len(written) == 6 and gzip.decompress(written["val.en.gz"]).decode().count("\n") == 20
    (out / "train.de.gz").write_bytes(gzip.compress(gzip.decompress(written["train.de.gz"]), mtime=12345))
    kept = (out / "train.de.gz").read_bytes()  # an earlier writer's time stamp: the same text, kept as it is
    recipe["prepared_data"](multi30k, out, 20)
    assert {path.name: path.read_bytes() for path in out.iterdir()} == {**written, "train.de.gz": kept}


def test_wu2021_bleu_is_fairseqs_on_the_text_as_it_is():
    recipe = runpy.run_path(str(EXAMPLES / "multi30k" / "run.py"))
    references = ["ein mann &apos;s hund läuft .", "zwei kinder spielen im park ."]
    # Split at spaces only: "&apos;s" is one token, "." another; 13a would split the escape into three.
    hypotheses = ["ein mann &apos;s hund läuft .", "zwei kinder spielen im garten ."]
    # n-gram precisions of the two sentences together (six tokens each; the second differs in its fifth)
    matches = [(6 + 5) / (6 + 6), (5 + 3) / (5 + 5), (4 + 2) / (4 + 4), (3 + 1) / (3 + 3)]
    expected = 100 * (matches[0] * matches[1] * matches[2] * matches[3]) ** 0.25
    assert recipe["tokenized_bleu"](hypotheses, references) == pytest.approx(expected)


def test_wu2021_size_is_their_run():
    recipe = runpy.run_path(str(EXAMPLES / "multi30k" / "run.py"))
    flags = recipe["SIZES"]["wu2021"]
    wanted = {"--d_model": 128, "--layers": 4, "--heads": 4, "--ffn_dim": 256, "--dropout": 0.3,
              "--max_tokens": 8192, "--warmup_steps": 2000, "--learning_rate": 0.005, "--max_steps": 8000,
              "--save_strategy": "epoch", "--eval_strategy": "epoch", "--patience": 10,
              "--save_total_limit": 11}
    assert {name: recipe["flag_value"](flags, name, type(value)) for name, value in wanted.items()} == wanted
    assert recipe["AFTER_TRAINING"]["wu2021"] == dict(average_last=10, length_penalty=recipe["LENGTH_PENALTIES"],
                                                      num_beams=5, length_penalty_type="transformers")


# --- Back-translation and alignment against eflomal -------------------------------------------------------------------


@pytest.mark.slow
def test_back_translation_runs_each_step_and_continues_where_it_stopped(multi30k_like, tmp_path, capsys):
    script = runpy.run_path(str(EXAMPLES / "multi30k" / "back_translation.py"))
    out = tmp_path / "bt"
    flags = ["--data-dir", str(multi30k_like), "--output-dir", str(out), "--size", "smoke", "--seeds", "0"]
    script["main"](flags)
    table = (out / "back_translation.md").read_text()
    assert capsys.readouterr().out.endswith(table)
    real = [line.split(" | ") for line in table.splitlines() if line.startswith("| real-half")]
    synthetic = [line.split(" | ") for line in table.splitlines() if line.startswith("| with-synthetic")]
    assert len(real) == len(synthetic) == 1 and real[0][2] == synthetic[0][2] == "6"  # the same updates
    sampled = (out / "synthetic.en").read_text(encoding="utf-8").splitlines()
    monolingual = gzip.open(out / "monolingual.de.gz", "rt", encoding="utf-8").read().splitlines()
    assert len(sampled) == len(monolingual) == 20  # the second half of the smoke's 40 pairs
    with gzip.open(out / "data" / "with-synthetic" / "train.de.gz", "rt", encoding="utf-8") as file:
        assert len(file.read().splitlines()) == 20 + sum(1 for line in sampled if line.strip())
    # Run again: every step's output is there, so nothing is trained again and the table is the same.
    files = {path: path.stat().st_mtime_ns for path in out.rglob("*.safetensors")}
    script["main"](flags)
    assert (out / "back_translation.md").read_text() == table
    assert {path: path.stat().st_mtime_ns for path in out.rglob("*.safetensors")} == files


def test_grow_diag_final_and_symmetrises_as_moses_does():
    script = runpy.run_path(str(EXAMPLES / "multi30k" / "alignment_vs_eflomal.py"))
    # forward: each target word to one source word; reverse: each source word to one target word.
    forward = {(0, 0), (1, 1), (3, 2), (3, 3)}
    reverse = {(0, 0), (1, 1), (2, 1), (3, 3)}
    # Intersection {0-0, 1-1, 3-3}; grow-diag adds 2-1 (next to 1-1, source word 2 unaligned) and 3-2 (next to 3-3,
    # target word 2 unaligned).
    assert script["grow_diag_final_and"](forward, reverse) == {(0, 0), (1, 1), (2, 1), (3, 2), (3, 3)}
    # final-and: a union link both of whose words are unaligned joins; one whose words are both aligned does not.
    assert script["grow_diag_final_and"]({(0, 0), (5, 5)}, {(0, 0)}) == {(0, 0), (5, 5)}
    assert script["grow_diag_final_and"]({(0, 0), (1, 1)}, {(0, 0), (1, 1), (0, 1)}) == {(0, 0), (1, 1)}


def test_alignment_agreement_is_precision_recall_and_aer():
    script = runpy.run_path(str(EXAMPLES / "multi30k" / "alignment_vs_eflomal.py"))
    ours = [{(0, 0), (1, 1), (2, 1)}, {(0, 0)}]
    reference = [{(0, 0), (1, 1)}, {(0, 0), (1, 1)}]
    found = script["agreement"](ours, reference)
    assert found["precision"] == pytest.approx(3 / 4) and found["recall"] == pytest.approx(3 / 4)
    assert found["aer"] == pytest.approx(1 - 2 * 3 / (4 + 4)) and found["links"] == 4


def test_alignment_vs_eflomal_scores_every_layer_against_the_reference(tokenizer, tmp_path, capsys):
    """The script end to end on a random model, eflomal replaced by a reference of diagonal links: a row per decoder
    layer, one hard link per target word, and the scores of those links against the diagonal, counted here."""
    import torch
    from conftest import tiny_config_for

    from vanilla_transformer import VanillaTransformerForConditionalGeneration

    script = runpy.run_path(str(EXAMPLES / "multi30k" / "alignment_vs_eflomal.py"))
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(tiny_config_for(tokenizer, dropout=0.0)).eval()
    model.generation_config.max_new_tokens = 8
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    data = tmp_path / "data"
    data.mkdir()
    for split, lines in (("train", ["one", "two"]), ("test_2016_flickr", ["three hundred", "", "forty-two", "seven"])):
        for lang in ("en", "fr"):
            with gzip.open(data / f"{split}.{lang}.gz", "wt", encoding="utf-8") as file:
                file.write("".join(line + "\n" for line in lines))
    seen = {}

    def diagonal(sources, translations, train):
        seen.update(sources=sources, translations=translations)
        return [{(i, i) for i in range(min(len(s.split()), len(t.split())))} for s, t in zip(sources, translations)]

    script["main"].__globals__["eflomal_links"] = diagonal
    script["main"](["--model", str(tmp_path / "model"), "--data-dir", str(data), "--target-lang", "fr",
                    "--out", str(tmp_path / "table.md")])
    table = (tmp_path / "table.md").read_text()
    assert capsys.readouterr().out == table
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row[0] for row in rows] == ["| 0", "| 1 (last)"]
    target_words = sum(len(translation.split()) for translation in seen["translations"])
    reference = diagonal(seen["sources"], seen["translations"], None)
    for row in rows:
        assert int(row[4].rstrip(" |").replace(",", "")) == target_words  # one link a target word
        precision, recall = float(row[1]), float(row[2])
        f1 = 2 * precision * recall / (precision + recall) if precision else 0.0
        assert float(row[3]) == pytest.approx(1 - f1, abs=2e-3)
        assert recall == pytest.approx(precision * target_words / sum(map(len, reference)), abs=2e-3)
