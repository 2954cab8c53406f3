"""Sharing on the Hub: the generated model card, the one-commit push (intercepted at `HfApi`, never reaching the
network), and loading a saved folder where the package is not installed."""

import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import huggingface_hub
import pytest
import torch
from huggingface_hub import CommitInfo, HfApi, ModelCard, RepoUrl
from huggingface_hub.errors import EntryNotFoundError
from huggingface_hub.repocard_data import eval_results_to_model_index, model_index_to_eval_results
from safetensors.torch import load as load_safetensors
from torch.utils.tensorboard import SummaryWriter
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import vanilla_transformer
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.cli.main import main as cli
from vanilla_transformer.hub.card import _architecture_rows, model_card, write_model_card
from vanilla_transformer.hub.card_facts import RunFacts, RunRecord
from vanilla_transformer.hub.push import push_to_hub
from vanilla_transformer.training.tokenization import train_tokenizer
from vanilla_transformer.training.trainer import paper_training_arguments


SENTENCES = [
    "a man rides a bike", "un homme fait du vélo",
    "two dogs play in the snow", "deux chiens jouent dans la neige",
    "a woman reads a book", "une femme lit un livre",
    "the children run on the beach", "les enfants courent sur la plage",
] * 5
SOURCES = ["a man reads a book", "two children play"]
REPO_ID = "user/tiny-en-fr"
# What a Hub repository of the model must hold to load and translate without the package.
REQUIRED_FILES = {
    "README.md",
    "config.json",
    "configuration_vanilla_transformer.py",
    "modeling_vanilla_transformer.py",
    "pipeline_vanilla_transformer.py",
    "model.safetensors",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
}
CARD_RESULTS = {
    "datasets": ["bentrevett/multi30k"],
    "training_data": "the 29,000 Multi30k training pairs.",
    "training": {"max_tokens": 4096},
    "results": [
        {
            "dataset": "Multi30k",
            "dataset_id": "bentrevett/multi30k",
            "split": "test_2016_flickr",
            "bleu": 33.987,
            "chrf": 57.111,
            "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
            "num_sentences": 1000,
        }
    ],
    "samples": [{"source": "a man | a bike", "reference": "un homme | un vélo", "hypothesis": "un homme"}],
}


def hub_online(monkeypatch) -> None:
    """huggingface_hub's online mode, whatever the caller's environment (`HF_HUB_OFFLINE=1`, as on offline clusters,
    makes `push` stop and transformers save `local_files_only` into tokenizer configs). huggingface_hub reads the
    variables once, at import, so its constant is set too. The network stays out of reach: see the `hub` fixture."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A tiny en -> fr model folder as `train` leaves it online: save_pretrained of the model and of its tokenizer."""
    root = tmp_path_factory.mktemp("hub")
    train_tokenizer(SENTENCES, vocab_size=300, show_progress=False).save_pretrained(root / "tokenizer")
    with pytest.MonkeyPatch.context() as monkeypatch:  # the tokenizer config saved as online
        hub_online(monkeypatch)
        tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer")
    config = VanillaTransformerConfig.from_preset(
        "tiny", vocab_size=len(tokenizer), dropout=0.0, source_lang="en", target_lang="fr"
    )
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config).eval()
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return root / "model"


@pytest.fixture(scope="module")
def run_dir(saved_model, tmp_path_factory):
    """A `vanilla-transformer train` output folder: the model plus the Trainer's results, state, logged arguments
    (TensorBoard), a checkpoint and `training_args.bin` (here not a pickle: reading it would fail)."""
    run = tmp_path_factory.mktemp("run") / "run"
    shutil.copytree(saved_model, run)
    metrics = {"test_bleu": 12.345, "test_chrf": 40.5, "test_exact_match": 5.0, "test_loss": 3.2}
    (run / "test_results.json").write_text(json.dumps(metrics))
    (run / "all_results.json").write_text(json.dumps({**metrics, "train_loss": 4.25}))
    trainer_state = {
        "global_step": 120,
        "epoch": 3.0,
        "log_history": [{"step": 120, "train_runtime": 95.0, "train_loss": 4.25, "total_flos": 1.0}],
    }
    (run / "trainer_state.json").write_text(json.dumps(trainer_state))
    (run / "training_args.bin").write_bytes(b"not a pickle")
    (run / "checkpoint-120").mkdir()
    shutil.copy(saved_model / "model.safetensors", run / "checkpoint-120")
    arguments = paper_training_arguments(str(run), d_model=32, warmup_steps=40, max_steps=120, report_to=[])
    with SummaryWriter(run / "runs" / "tensorboard") as writer:  # what the Trainer's TensorBoardCallback logs
        writer.add_text("args", arguments.to_json_string())
    return run


def http_library():
    """The HTTP library of huggingface_hub's session (httpx2 today), whose Response and errors the fakes use."""
    return sys.modules[type(huggingface_hub.get_session()).__module__.split(".")[0]]


@pytest.fixture
def hub(monkeypatch):
    """The Hub at its `HfApi` boundary, in online mode whatever the environment (`hub_online`): `create_repo` and
    `create_commit` record their calls, a new repository has no README yet, the reachability probe (a HEAD of the
    endpoint) is answered, and any other request to the Hub fails."""
    calls = {"repos": [], "commits": [], "probes": 0}

    def create_repo(self, repo_id, *, private=None, exist_ok=False, **kwargs):
        calls["repos"].append(dict(repo_id=repo_id, private=private, exist_ok=exist_ok))
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_commit(self, repo_id, operations, *, commit_message, **kwargs):
        files = {}
        for operation in operations:
            with operation.as_file() as file:
                files[operation.path_in_repo] = file.read()
        calls["commits"].append(dict(repo_id=repo_id, files=files, message=commit_message, **kwargs))
        return CommitInfo(
            commit_url=f"https://huggingface.co/{repo_id}/commit/{'0' * 40}",
            commit_message=commit_message,
            commit_description="",
            oid="0" * 40,
        )

    def no_readme_yet(repo_id, filename, **kwargs):
        raise EntryNotFoundError(f"{filename} not found in {repo_id}")

    def refuse(client, request, **kwargs):
        if request.method == "HEAD" and str(request.url).rstrip("/") == huggingface_hub.constants.ENDPOINT:
            calls["probes"] += 1
            return http_library().Response(200, request=request)
        raise RuntimeError(f"a test tried to reach the network: {request.method} {request.url}")

    hub_online(monkeypatch)
    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "create_commit", create_commit)
    monkeypatch.setattr(huggingface_hub.repocard, "hf_hub_download", no_readme_yet)
    # Not offline mode: transformers would write its `local_files_only=True` into the saved tokenizer_config.json.
    monkeypatch.setattr(type(huggingface_hub.get_session()), "send", refuse)
    return calls


# --- the model card -------------------------------------------------------------------------------------------------


def test_card_metadata(saved_model):
    card = ModelCard(str(model_card(saved_model, CARD_RESULTS, repo_id=REPO_ID)))  # parses as the Hub would

    data = card.data
    assert data.library_name == "transformers"
    assert data.pipeline_tag == "translation"
    assert data.language == ["en", "fr"]
    assert data.license == "apache-2.0"
    assert data.datasets == ["bentrevett/multi30k"]
    assert {"translation", "vanilla-transformer", "transformer", "seq2seq"} <= set(data.tags)
    assert data.model_name == "tiny-en-fr"
    scores = {result.metric_type: result for result in data.eval_results}
    assert set(scores) == {"bleu", "chrf"}
    assert scores["bleu"].metric_value == 33.99
    assert scores["chrf"].metric_value == 57.11
    for result in scores.values():
        assert result.task_type == "translation"
        assert (result.dataset_type, result.dataset_name) == ("bentrevett/multi30k", "Multi30k")
        assert result.dataset_split == "test_2016_flickr"
    # The model-index round trip of huggingface_hub (what ModelCard.validate checks online, minus the Hub).
    model_index = card.data.to_dict()["model-index"]
    assert model_index_to_eval_results(model_index) == ("tiny-en-fr", data.eval_results)
    assert eval_results_to_model_index("tiny-en-fr", data.eval_results) == model_index


def test_card_body(saved_model):
    text = ModelCard(str(model_card(saved_model, CARD_RESULTS, repo_id=REPO_ID))).text

    assert "| Multi30k (1,000 sentences) | test_2016_flickr | 33.99 | 57.11 |" in text
    assert "`nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0`" in text
    for row in ["| layers | N | 2 |", "| model width | d_model | 32 |", "| attention heads | h | 4 |",
                "| feed-forward inner size | d_ff | 64 |", "| residual dropout | P_drop | 0 |"]:
        assert row in text
    parameters = f"{VanillaTransformerForConditionalGeneration.from_pretrained(saved_model).num_parameters():,}"
    assert f"| parameters |  | {parameters} |" in text
    assert "beam size 4, length penalty 0.6 (GNMT's" in text
    assert "| batch (5.1) | ~4,096 tokens" in text
    assert "Data: the 29,000 Multi30k training pairs." in text
    assert "| a man \\| a bike | un homme \\| un vélo | un homme |" in text
    assert f'pipeline("translation", model="{REPO_ID}", trust_remote_code=True)' in text
    assert f'AutoModelForSeq2SeqLM.from_pretrained("{REPO_ID}", trust_remote_code=True)' in text
    assert "title     = {Attention Is All You Need}" in text and "booktitle = {Advances in Neural" in text


def test_card_from_training_run(run_dir):
    """Without results the card reports the run's test_results.json; the recipe comes from the logged arguments."""
    card = ModelCard(str(model_card(run_dir)))

    # The Trainer's metrics do not name the data: the card says so, and its model-index, which names the data of each
    # score, leaves them out rather than list them under a made-up name.
    assert card.data.eval_results is None and card.data.metrics == ["bleu", "chrf"]
    assert "| data not named | test | 12.35 | 40.50 | 5.0 |" in card.text
    assert 'The results do not name the data of the scores marked "data not\nnamed"' in card.text
    assert "held-out data" not in card.text
    assert "the sacreBLEU signature was not recorded" in card.text
    for row in [
        "| optimizer (5.3) | Adam, beta1 0.9, beta2 0.98, eps 1e-09",
        "| learning rate (5.3) | d_model^-0.5 * min(step^-0.5, step * 40^-1.5): warm-up 40 steps",
        "| label smoothing (5.4) | 0.1 |",
        "| gradient clipping | none |",
        "| steps | 120 (3.0 epochs) |",
        "| precision | fp32 |",
    ]:
        assert row in card.text


@pytest.mark.parametrize("flags, precision", [
    ({"bf16": False}, "fp32"),
    ({"bf16": True}, "bf16 mixed precision (float32 weights)"),
    ({"bf16": False, "fp16": True}, "fp16 mixed precision (float32 weights)"),
])
def test_card_names_the_precision_of_the_run(flags, precision):
    from vanilla_transformer.hub.card import _recipe_rows

    assert ("precision", precision) in _recipe_rows(VanillaTransformerConfig(), flags, None, {})


def test_card_without_results(saved_model):
    card = ModelCard(str(model_card(saved_model)))

    assert card.data.eval_results is None and "model-index" not in card.data.to_dict()
    assert "No evaluation results were given for this model." in card.text
    assert "The training arguments were not recorded with this model." in card.text


def test_model_card_command(saved_model, tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(CARD_RESULTS))
    out = tmp_path / "model_cards" / "tiny.md"

    cli(["model-card", "--model", str(saved_model), "--results", str(tmp_path / "results.json"), "--out", str(out)])

    card = ModelCard.load(out)
    assert [r.metric_value for r in card.data.eval_results] == [33.99, 57.11]
    assert "| Multi30k (1,000 sentences) | test_2016_flickr | 33.99 | 57.11 |" in card.text


def card_with_plot(tmp_path) -> tuple[dict, Path]:
    """Card facts with a results table of variants and one figure, and the run folder holding that figure."""
    run = tmp_path / "run"
    (run / "plots").mkdir(parents=True)
    (run / "plots" / "training.png").write_bytes(b"\x89PNG\r\n\x1a\n a training curve")
    facts = dict(CARD_RESULTS, variants=[
        {"model": "average of the last 5 checkpoints", "decoding": "beam 4", "bleu": 33.987, "chrf": 57.111},
        {"model": "last checkpoint (step 120)", "decoding": "greedy", "bleu": 31.5, "chrf": None},
    ], figures=[{"file": "plots/training.png", "caption": "Loss against steps"}])
    return facts, run


def test_card_shows_variants_and_figures(saved_model, tmp_path):
    facts, run = card_with_plot(tmp_path)
    out = tmp_path / "card" / "README.md"

    text = write_model_card(saved_model, out, facts, run_dir=run).text

    assert "The same test set with other checkpoints and decoding (Multi30k test_2016_flickr):" in text
    assert "| average of the last 5 checkpoints | beam 4 | 33.99 | 57.11 |" in text
    assert "| last checkpoint (step 120) | greedy | 31.50 |  |" in text
    assert "![Loss against steps](training.png)" in text
    # The card names the figure by its file name, so the figure is written next to it.
    assert (out.parent / "training.png").read_bytes() == (run / "plots" / "training.png").read_bytes()
    assert ModelCard.load(out).text == text


def test_card_refuses_a_missing_figure(saved_model, tmp_path):
    facts, run = card_with_plot(tmp_path)
    (run / "plots" / "training.png").unlink()

    with pytest.raises(FileNotFoundError, match="'plots/training.png' is not in the run folder"):
        model_card(saved_model, facts, run_dir=run)


def test_card_reports_what_the_run_recorded(run_dir, hub, tmp_path, capsys):
    """`train` writes card_results.json: model-card, push and model_card read it before the Trainer's metrics."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (run / "card_results.json").write_text(json.dumps(CARD_RESULTS))

    cli(["model-card", "--model", str(run), "--out", str(tmp_path / "card" / "README.md")])
    push_to_hub(run, REPO_ID)

    [commit] = hub["commits"]
    for text in [model_card(run).content, (tmp_path / "card" / "README.md").read_text(encoding="utf-8"),
                 commit["files"]["README.md"].decode("utf-8")]:
        card = ModelCard(text)
        assert [r.metric_value for r in card.data.eval_results] == [33.99, 57.11]
        assert "| Multi30k (1,000 sentences) | test_2016_flickr | 33.99 | 57.11 |" in card.text
        assert "Data: the 29,000 Multi30k training pairs." in card.text
        assert "print(translator('a man | a bike'))" in card.text  # the first sample's source


def stopped_run(saved_model, folder: Path, steps=(250, 300, 337), final=337) -> Path:
    """A run folder as `train` leaves it when stopped early (preempted, or --max-train-minutes): planned for 1,200
    steps, stopped at `final`, with a checkpoint at each of `steps` and no final Trainer state or model."""
    run = folder / "run"
    for step in steps:
        checkpoint = run / f"checkpoint-{step}"
        shutil.copytree(saved_model, checkpoint)
        state = {"global_step": step, "epoch": step / 100, "log_history": [{"step": step, "loss": 3.0}]}
        (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    RunRecord({"max_steps": 1200, "warmup_steps": 40, "learning_rate": 0, "source_lang": "en", "target_lang": "fr",
               "demo_train_size": 12000, "demo_max_digits": 4}, demo=True,
              facts=RunFacts(pairs={"train": 12000}, steps=final, epochs=final / 100, sessions=1,
                             training_seconds=95.0)).write(run)
    return run


def test_card_of_an_averaged_model_of_a_stopped_run(saved_model, tmp_path, capsys):
    """The card reports the steps the weights were trained for, and the checkpoints averaged, from what the run and
    `average` recorded: never the planned --max-steps as if trained."""
    run = stopped_run(saved_model, tmp_path)
    averaged = tmp_path / "averaged"
    cli(["average", "--run", str(run), "--last", "3", "--out", str(averaged)])

    for card, argv in [(tmp_path / "card.md", ["--run", str(run)]), (tmp_path / "alone.md", [])]:
        cli(["model-card", "--model", str(averaged), *argv, "--out", str(card)])
        text = card.read_text(encoding="utf-8")
        assert "| steps | 337 (3.4 epochs) |" in text
        assert ("| checkpoint averaging (6.1) | the mean of the weights of the 3 checkpoints at steps "
                "250, 300 and 337 |") in text
        assert "1,200" not in text
    text = (tmp_path / "card.md").read_text(encoding="utf-8")
    assert "| training time | 2 min |" in text  # the whole run's, as recorded
    assert "The recipe of sections 5.1-5.4" in text
    assert "The training arguments were not recorded with this model; its steps were:" in (
        tmp_path / "alone.md").read_text(encoding="utf-8")


def test_card_of_a_stopped_run_reports_the_steps_it_trained(saved_model, tmp_path):
    """A run stopped early has no final trainer_state.json: the steps come from what `train` recorded, else from its
    newest checkpoint; the planned --max-steps is said to be a plan."""
    from vanilla_transformer.hub.card import _recipe_rows

    run = stopped_run(saved_model, tmp_path)
    assert "| steps | 337 (3.4 epochs) |" in model_card(run / "checkpoint-337", run_dir=run).text
    assert "| steps | 300 (3.0 epochs) |" in model_card(run / "checkpoint-300", run_dir=run).text  # its own state
    record = RunRecord.read(run)
    record.facts = RunFacts()  # killed before it recorded its steps
    record.write(run)
    text = model_card(saved_model, run_dir=run).text
    assert "| steps | 337 (3.4 epochs) |" in text and "1,200" not in text
    assert dict(_recipe_rows(VanillaTransformerConfig(), {"max_steps": 1200}, None, {}))["steps"] == (
        "not recorded (`max_steps` 1,200 was planned)")


@pytest.mark.parametrize("arguments, data", [
    ({"demo_train_size": 12000, "demo_max_digits": 4},
     "Data: the number-words corpus the package generates (12,000 pairs of numbers below 10^4), en -> fr, for "
     "training."),
    ({"train_file": "/data/pairs.tsv", "validation_source_file": "/data/val.en",
      "validation_target_file": "/data/val.fr", "test_file": "/data/test.tsv"},
     "Data: `pairs.tsv` (600 sentence pairs), en -> fr, for training; `val.en` and `val.fr` (50 sentence pairs) for "
     "validation; `test.tsv` for testing."),
    ({"dataset_name": "wmt14", "dataset_config_name": "fr-en"},
     "Data: the Hub dataset `wmt14`, configuration `fr-en`, split `train` (600 sentence pairs), en -> fr, for "
     "training."),
])
def test_card_describes_the_recorded_data_in_a_sentence(saved_model, tmp_path, arguments, data):
    RunRecord({"source_lang": "en", "target_lang": "fr", **arguments}, demo="demo_train_size" in arguments,
              facts=RunFacts(pairs={"train": 12000 if "demo_train_size" in arguments else 600, "validation": 50})
              ).write(tmp_path)

    assert data in model_card(saved_model, run_dir=tmp_path).text


@pytest.mark.parametrize("argv, license", [([], "apache-2.0"), (["--license", "cc-by-4.0"], "cc-by-4.0")])
def test_the_license_is_said_to_be_a_choice(saved_model, tmp_path, capsys, argv, license):
    cli(["model-card", "--model", str(saved_model), *argv, "--out", str(tmp_path / "card.md")])

    card = ModelCard.load(tmp_path / "card.md")
    assert card.data.license == license
    assert f"This model is released under the `{license}` license" in card.text
    assert "the license chosen\nwith `--license` when the card was generated" in card.text
    assert ("The Python files are the\n`vanilla-transformer` package's code" in card.text) == (license != "apache-2.0")
    with pytest.raises(SystemExit):
        cli(["push", "--help"])
    assert "(default: apache-2.0)" in " ".join(capsys.readouterr().out.split())


def test_card_without_samples_invents_no_sentence(saved_model):
    results = {"results": [{"dataset": "Multi30k", "bleu": 30.0}]}

    text = model_card(saved_model, results, repo_id=REPO_ID).text

    assert "print(translator('<a sentence in en>'))" in text
    assert "inputs = tokenizer(['<a sentence in en>'], return_tensors=\"pt\", padding=True)" in text
    assert "bicycle" not in text


@pytest.mark.parametrize("content, message", [
    ("bleu = 33", "{file} is not JSON (Expecting value, line 1 column 1)"),
    (b"\xff\xfe{", "{file} is not UTF-8 text"),
    ("[1, 2]", 'expected a JSON object (`{{"results": [...], ...}}`) in {file}, found a list'),
    ('{"results": {"bleu": 3}}', "`results` in {file} must be a list, found an object"),
    ('{"results": [{"dataset": "x", "chrf": 50}]}', "result 1 in {file} has no BLEU score (`bleu` or `test_bleu`); "
                                                     "its keys: chrf, dataset"),
    ('{"dataset": "x", "chrf": 50}', "result 1 in {file} has no BLEU score (`bleu` or `test_bleu`); its keys: chrf, "
                                     "dataset"),
    ('{"results": [{"bleu": "high"}]}', "`bleu` of result 1 in {file} is not a number: 'high'"),
    ('{"test_bleu": 3, "test_chrf": "n/a"}', "`test_chrf` of result 1 in {file} is not a number: 'n/a'"),
    ('{"samples": [{"source": "a"}]}', "sample 1 in {file} needs the strings `source`, `reference` and `hypothesis`"),
    ('{"variants": [{"model": "last", "bleu": null}]}', "variant 1 in {file} needs a `model` and a numeric `bleu`"),
    ('{"figures": [{"file": "nope.png"}]}', "The card's figure 'nope.png' is not in the run folder {run}."),
])
@pytest.mark.parametrize("command", ["model-card", "push"])
def test_a_bad_results_file_is_named_before_any_work(command, content, message, saved_model, hub, tmp_path, capsys):
    results = tmp_path / "results.json"
    results.write_bytes(content if isinstance(content, bytes) else content.encode())
    argv = {
        "model-card": ["model-card", "--results", str(results), "--out", str(tmp_path / "card" / "README.md")],
        "push": ["push", "--card-results", str(results), "--repo-id", REPO_ID],
    }[command]

    with pytest.raises(SystemExit) as exit_info:
        cli([*argv, "--model", str(saved_model)])

    assert exit_info.value.code == 2
    error = message.format(file=results, run=saved_model)
    assert capsys.readouterr().err == f"vanilla-transformer {command}: error: {error}\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["results.json"]  # no card folder left behind
    assert hub == {"repos": [], "commits": [], "probes": 0}


def test_a_results_file_without_results_is_a_card_without_scores(saved_model, tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"samples": CARD_RESULTS["samples"]}))

    cli(["model-card", "--model", str(saved_model), "--results", str(results), "--out", str(tmp_path / "README.md")])

    text = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "No evaluation results were given for this model." in text and "| a man \\| a bike |" in text


def test_model_card_out_where_no_folder_can_be(saved_model, tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "card" / "README.md"

    with pytest.raises(SystemExit) as exit_info:
        cli(["model-card", "--model", str(saved_model), "--out", str(out)])

    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        f"vanilla-transformer model-card: error: cannot write {out}: {tmp_path / 'a-file'} is a file, not a folder\n"
    )


def test_evaluate_json_is_the_results_file_of_the_card(saved_model, tmp_path, capsys):
    pairs = [("a man reads a book", "un homme lit un livre"), ("", ""), ("two dogs play", "deux chiens jouent")]
    (tmp_path / "test.en").write_text("".join(source + "\n" for source, _ in pairs), encoding="utf-8")
    (tmp_path / "test.fr").write_text("".join(target + "\n" for _, target in pairs), encoding="utf-8")
    results = tmp_path / "results.json"
    evaluate = ["evaluate", "--model", str(saved_model), "--src", str(tmp_path / "test.en"), "--ref",
                str(tmp_path / "test.fr"), "--device", "cpu", "--json", str(results)]

    cli([*evaluate, "--num-beams", "1", "--max-new-tokens", "4", "--dataset", "Multi30k", "--split",
         "test_2016_flickr"])

    printed = capsys.readouterr().out
    written = json.loads(results.read_text(encoding="utf-8"))
    [entry] = written["results"]
    assert {key: entry[key] for key in ("dataset", "split", "num_sentences", "decoding")} == {
        "dataset": "Multi30k", "split": "test_2016_flickr", "num_sentences": 3,
        "decoding": "greedy search, at most 4 new tokens"}
    for metric in ("bleu", "chrf"):  # the numbers and signatures that evaluate prints
        assert f"signature: {entry[f'{metric}_signature']}\n" in printed
    assert f"BLEU = {entry['bleu']:.2f} " in printed and f"chrF2 = {entry['chrf']:.2f}\n" in printed
    if "bleu_lc_moses" in entry:  # with sacremoses
        assert f"signature: {entry['bleu_lc_moses_signature']}\n" in printed
    assert [sample["source"] for sample in written["samples"]] == ["a man reads a book", "two dogs play"]

    card_file = tmp_path / "card" / "README.md"
    cli(["model-card", "--model", str(saved_model), "--results", str(results), "--out", str(card_file)])

    card = ModelCard.load(card_file)
    assert [r.metric_value for r in card.data.eval_results] == [round(entry["bleu"], 2), round(entry["chrf"], 2)]
    assert {(r.dataset_name, r.dataset_split) for r in card.data.eval_results} == {("Multi30k", "test_2016_flickr")}
    assert f"| Multi30k (3 sentences) | test_2016_flickr | {entry['bleu']:.2f} | {entry['chrf']:.2f} |" in card.text
    assert (f"- Multi30k test_2016_flickr: decoded with greedy search, at most 4 new tokens; BLEU signature "
            f"`{entry['bleu_signature']}`, chrF signature `{entry['chrf_signature']}`") in card.text
    assert "print(translator('a man reads a book'))" in card.text

    # Without names, the test file's: no dataset is made up, nor a decoding other than the saved one.
    cli([*evaluate, "--max-new-tokens", "4"])
    [entry] = json.loads(results.read_text(encoding="utf-8"))["results"]
    assert (entry["dataset"], entry["split"], entry["decoding"]) == ("test.en", "test", "at most 4 new tokens")


# --- pushing --------------------------------------------------------------------------------------------------------


def test_push_uploads_one_complete_repo(run_dir, saved_model, hub):
    push_to_hub(run_dir, REPO_ID, private=True)

    assert hub["repos"] == [dict(repo_id=REPO_ID, private=True, exist_ok=True)]
    [commit] = hub["commits"]
    files = commit["files"]
    # Exactly the files of save_pretrained (model and tokenizer) plus the card: no run files, no checkpoints.
    assert set(files) == {path.name for path in saved_model.iterdir()} | {"README.md"}
    assert REQUIRED_FILES <= set(files)
    for name in set(files) - {"README.md"}:
        assert files[name] == (saved_model / name).read_bytes(), name
    package_dir = os.path.join(os.path.dirname(vanilla_transformer.__file__), "model")
    for name in [name for name in files if name.endswith(".py")]:
        assert files[name] == open(os.path.join(package_dir, name), "rb").read(), name

    config = json.loads(files["config.json"])
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == (
        "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration"
    )
    assert config["custom_pipelines"]["translation"]["impl"].startswith("pipeline_vanilla_transformer.")
    # The shared embedding matrix (section 3.4) is stored once.
    tensors = load_safetensors(files["model.safetensors"])
    embeddings = [name for name, tensor in tensors.items() if tensor.shape == (config["vocab_size"], config["d_model"])]
    assert embeddings == ["model.shared.weight"]

    card = ModelCard(files["README.md"].decode("utf-8"))
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "translation"
    assert card.data.language == ["en", "fr"] and card.data.license == "apache-2.0"
    assert "| data not named | test | 12.35 | 40.50 | 5.0 |" in card.text  # the run's test_results.json
    assert f'pipeline("translation", model="{REPO_ID}", trust_remote_code=True)' in card.text


def test_push_command(saved_model, hub, tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(CARD_RESULTS))

    cli(["push", "--model", str(saved_model), "--repo-id", REPO_ID, "--card-results", str(tmp_path / "results.json"),
         "--commit-message", "Multi30k model", "--license", "mit"])

    assert hub["repos"] == [dict(repo_id=REPO_ID, private=False, exist_ok=True)]
    [commit] = hub["commits"]
    assert commit["message"] == "Multi30k model"
    card = ModelCard(commit["files"]["README.md"].decode("utf-8"))
    assert card.data.license == "mit"
    assert [r.metric_value for r in card.data.eval_results] == [33.99, 57.11]


def test_push_uploads_the_figures_of_the_card(saved_model, hub, tmp_path):
    facts, run = card_with_plot(tmp_path)

    push_to_hub(saved_model, REPO_ID, results=facts, run_dir=run)

    [commit] = hub["commits"]
    assert commit["files"]["training.png"] == (run / "plots" / "training.png").read_bytes()
    assert "![Loss against steps](training.png)" in commit["files"]["README.md"].decode("utf-8")


def test_push_refuses_a_folder_without_tokenizer(saved_model, hub, tmp_path):
    for name in ["config.json", "generation_config.json", "model.safetensors"]:
        shutil.copy(saved_model / name, tmp_path)

    with pytest.raises(ValueError, match="No tokenizer"):
        push_to_hub(tmp_path, REPO_ID)
    assert hub["repos"] == [] and hub["commits"] == []  # checked before the repository is created


def test_transformers_push_to_hub_uploads_the_code(saved_model, hub):
    """transformers' own `model.push_to_hub` also uploads config.json with auto_map and the code it names."""
    model = VanillaTransformerForConditionalGeneration.from_pretrained(saved_model)

    model.push_to_hub(REPO_ID)

    [commit] = hub["commits"]
    files = commit["files"]
    model_files = {path.name for path in saved_model.iterdir()} - {"tokenizer.json", "tokenizer_config.json"}
    assert set(files) == model_files | {"README.md"}
    for name in model_files:
        assert files[name] == (saved_model / name).read_bytes(), name


def test_push_dry_run_writes_exactly_what_push_uploads(saved_model, hub, tmp_path, capsys):
    facts, run = card_with_plot(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps(facts))
    push = ["push", "--model", str(saved_model), "--run", str(run), "--card-results", str(tmp_path / "results.json"),
            "--repo-id", REPO_ID]
    out = tmp_path / "staged" / "repo"

    cli([*push, "--dry-run", str(out)])

    assert hub == {"repos": [], "commits": [], "probes": 0}  # no network at all
    written = {path.relative_to(out).as_posix(): path.read_bytes() for path in out.rglob("*") if path.is_file()}
    assert REQUIRED_FILES | {"training.png"} <= set(written)
    assert f"written to {out}" in capsys.readouterr().out
    assert sorted(path.name for path in out.parent.iterdir()) == ["repo"]  # no staging folder left beside it

    cli(push)

    [commit] = hub["commits"]
    assert commit["files"] == written


def test_push_dry_run_replaces_a_folder_only_when_forced(saved_model, hub, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    push = ["push", "--model", str(saved_model), "--repo-id", REPO_ID]

    for argv, error in [
        ([*push, "--dry-run", str(out)], f"--dry-run {out} is not empty; pass --force to replace what it holds, or "
                                         "choose another"),
        ([*push, "--dry-run", str(saved_model), "--force"], f"--dry-run {saved_model} would replace the --model folder "
                                                              f"{saved_model}; choose another"),
        ([*push, "--dry-run", str(out / "old.txt")], f"--dry-run {out / 'old.txt'} is a file, not a folder"),
        ([*push, "--force"], "--force replaces the folder of --dry-run; without --dry-run there is nothing to replace"),
        (["push", "--model", str(saved_model), "--repo-id", "user/bad name!", "--dry-run", str(out)],
         "--repo-id 'user/bad name!' is not a Hub repository name: Repo id must use alphanumeric chars"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            cli(argv)
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.startswith(f"vanilla-transformer push: error: {error}")
    assert [path.name for path in out.iterdir()] == ["old.txt"]

    cli([*push, "--dry-run", str(out), "--force"])

    assert "old.txt" not in {path.name for path in out.iterdir()} and (out / "README.md").is_file()
    assert hub == {"repos": [], "commits": [], "probes": 0}


def http_error(status: int, message: str):
    """The `HfHubHTTPError` that huggingface_hub raises for an answer of `status` to creating a repository."""
    from huggingface_hub.utils import hf_raise_for_status

    request = http_library().Request("POST", f"{huggingface_hub.constants.ENDPOINT}/api/repos/create")
    try:
        hf_raise_for_status(http_library().Response(status, request=request, json={"error": message}))
    except huggingface_hub.errors.HfHubHTTPError as error:
        return error
    raise AssertionError(f"no error for {status}")


@pytest.mark.parametrize("step, error, message", [
    ("create_commit", lambda library: library.RemoteProtocolError("Server disconnected without sending a response."),
     "the connection to the Hub failed (Server disconnected without sending a response.)"),
    ("create_commit", lambda library: library.WriteTimeout("The write operation timed out"),
     "the connection to the Hub failed (The write operation timed out)"),
    ("create_repo", lambda library: http_error(401, "Invalid username or password."),
     "the Hub answered 401 Unauthorized to POST {endpoint}/api/repos/create: Invalid username or password. (a "
     "token with write access: `hf auth login`, HF_TOKEN or --token)"),
    ("create_repo", lambda library: http_error(403, 'You don\'t have the rights to create a model under "user"'),
     "the Hub answered 403 Forbidden to POST {endpoint}/api/repos/create: You don't have the rights to create a model "
     'under "user" (a token with write access: `hf auth login`, HF_TOKEN or --token)'),
])
def test_a_push_that_fails_on_the_way_is_one_line(step, error, message, saved_model, hub, monkeypatch, capsys):
    """The network dropping during the upload (errors of the HTTP library, which are no OSErrors) or the Hub refusing
    it stops push with one line, not a traceback."""

    def fail(self, *args, **kwargs):
        raise error(http_library())

    monkeypatch.setattr(HfApi, step, fail)

    with pytest.raises(SystemExit) as exit_info:
        cli(["push", "--model", str(saved_model), "--repo-id", REPO_ID])

    assert exit_info.value.code == 2
    endpoint = huggingface_hub.constants.ENDPOINT
    assert capsys.readouterr().err == (
        f"vanilla-transformer push: error: push to {REPO_ID}: {message.format(endpoint=endpoint)}\n"
    )


# --- loading without the package ------------------------------------------------------------------------------------

# A fresh interpreter in which `import vanilla_transformer` fails (it is installed editable, so leaving it off
# sys.path is not enough), offline, with its own cache for the dynamic modules. It loads the folder through the Auto
# classes and the pipelines once (a start of Python with torch and transformers costs seconds), for the tests below.
WITHOUT_PACKAGE = textwrap.dedent(
    """
    import importlib.abc, json, sys

    class BlockPackage(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "vanilla_transformer":
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)")

    sys.meta_path.insert(0, BlockPackage())
    try:
        import vanilla_transformer
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit("vanilla_transformer is importable")

    from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

    folder, sources = sys.argv[1], json.loads(sys.argv[2])
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    inputs = tokenizer(sources, return_tensors="pt", padding=True)
    ids = model.generate(**inputs, num_beams=1, do_sample=False, max_new_tokens=8).tolist()
    logits = model(**inputs, decoder_input_ids=inputs["input_ids"]).logits.detach().tolist()
    output = dict(config=type(config).__module__, model=type(model).__module__, ids=ids, logits=logits)
    try:
        output["translations"] = {
            task: pipeline(task, model=folder, trust_remote_code=True)(sources[0])
            for task in ["translation", "translation_en_to_fr"]
        }
    except Exception as error:
        output["pipeline_error"] = f"{type(error).__name__}: {error}"
    # Fine-tuning with transformers alone: the remote code under a plain Seq2SeqTrainer.
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

    pairs = [dict(tokenizer(source, text_target=source)) for source in sources]
    args = Seq2SeqTrainingArguments(output_dir="fine-tuned", max_steps=2, per_device_train_batch_size=2,
                                    report_to=[], save_strategy="no", disable_tqdm=True, use_cpu=True)
    trainer = Seq2SeqTrainer(model=model.train(), args=args, train_dataset=pairs,
                             data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))
    output["fine_tuning_loss"] = trainer.train().training_loss
    print(json.dumps(output))
    """
)


@pytest.fixture(scope="module")
def without_package(saved_model, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("without_package")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(cwd / "hf_home"), "PYTHONPATH": ""}
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_PACKAGE, str(saved_model), json.dumps(SOURCES)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_loads_with_remote_code_without_the_package(saved_model, without_package):
    assert without_package["config"].startswith("transformers_modules.")
    assert without_package["model"].startswith("transformers_modules.")
    model = VanillaTransformerForConditionalGeneration.from_pretrained(saved_model).eval()
    tokenizer = AutoTokenizer.from_pretrained(saved_model)
    inputs = tokenizer(SOURCES, return_tensors="pt", padding=True)
    ids = model.generate(**inputs, num_beams=1, do_sample=False, max_new_tokens=8).tolist()
    assert without_package["ids"] == ids
    with torch.no_grad():
        logits = model(**inputs, decoder_input_ids=inputs["input_ids"]).logits
    torch.testing.assert_close(torch.tensor(without_package["logits"]), logits)


@pytest.mark.slow
def test_translation_pipeline_without_the_package(saved_model, without_package):
    assert "pipeline_error" not in without_package, without_package["pipeline_error"]
    # The pipeline decodes with the model's saved generation config, as generate() does here.
    model = VanillaTransformerForConditionalGeneration.from_pretrained(saved_model).eval()
    tokenizer = AutoTokenizer.from_pretrained(saved_model)
    [ids] = model.generate(**tokenizer(SOURCES[:1], return_tensors="pt"))
    expected = [{"translation_text": tokenizer.decode(ids, skip_special_tokens=True)}]
    assert without_package["translations"] == {"translation": expected, "translation_en_to_fr": expected}


@pytest.mark.slow
def test_fine_tunes_with_a_plain_seq2seq_trainer_without_the_package(saved_model, without_package, tmp_path,
                                                                     monkeypatch):
    """docs/training.md: without `import vanilla_transformer`, `trust_remote_code=True` is all fine-tuning needs. The
    remote code trains as the package does: the same Seq2SeqTrainer run on the package's class, same seed and data,
    ends with the same loss."""
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

    monkeypatch.chdir(tmp_path)
    model = VanillaTransformerForConditionalGeneration.from_pretrained(saved_model)
    tokenizer = AutoTokenizer.from_pretrained(saved_model)
    pairs = [dict(tokenizer(source, text_target=source)) for source in SOURCES]
    args = Seq2SeqTrainingArguments(output_dir="fine-tuned", max_steps=2, per_device_train_batch_size=2,
                                    report_to=[], save_strategy="no", disable_tqdm=True, use_cpu=True)
    trainer = Seq2SeqTrainer(model=model.train(), args=args, train_dataset=pairs,
                             data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))
    loss = trainer.train().training_loss
    assert math.isfinite(loss) and loss > 0
    assert without_package["fine_tuning_loss"] == pytest.approx(loss, rel=1e-5)


@pytest.mark.slow  # a fresh process
def test_an_older_transformers_gets_a_clear_error():
    """The remote code runs under the user's transformers; 5.17 used to fail with a TypeError in OutputRecorder."""
    code = "import transformers; transformers.__version__ = '5.17.0'; import vanilla_transformer"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode != 0
    assert "ImportError: vanilla-transformer needs transformers>=5.24" in result.stderr
    assert "found 5.17.0" in result.stderr


def test_pickle_checkpoints_load_only_when_asked(saved_model, tmp_path):
    """A folder with only pytorch_model.bin: unpickling can run code, so loading needs use_safetensors=False."""
    model = VanillaTransformerForConditionalGeneration.from_pretrained(saved_model)
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")

    for model_class in [VanillaTransformerForConditionalGeneration, AutoModelForSeq2SeqLM]:
        with pytest.raises(OSError, match=r"(?s)(pickle.*safetensors|safetensors.*pickle)"):
            model_class.from_pretrained(tmp_path)
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path, use_safetensors=False)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=0, atol=0)


def test_card_marks_dropout_the_paper_does_not_have():
    # Section 5.4 has residual dropout only; attention and ReLU dropout are named as the departure they are.
    paper = {name: value for name, _, value in _architecture_rows(VanillaTransformerConfig.from_preset("tiny"))}
    assert paper["attention / ReLU dropout"] == "0 / 0"
    config = VanillaTransformerConfig.from_preset("tiny", attention_dropout=0.1, activation_dropout=0.2)
    rows = {name: value for name, _, value in _architecture_rows(config)}
    assert rows["attention / ReLU dropout"].startswith("0.1 / 0.2 (not in the paper")


@pytest.mark.parametrize("sizes, symbol, value", [
    ({}, "d_k = d_v", "8"),  # d_model 32 / h 4
    ({"d_k": 4, "d_v": 8}, "d_k / d_v", "4 / 8"),  # Table 3 row (B)'s shape
    ({"d_k": 16, "d_v": 16}, "d_k = d_v", "16"),
    ({"decoder_attention_heads": 2}, "d_k = d_v", "8 (encoder), 16 (decoder)"),
])
def test_card_gives_the_head_sizes_the_model_has(sizes, symbol, value):
    rows = {name: (symbol, value) for name, symbol, value in
            _architecture_rows(VanillaTransformerConfig.from_preset("tiny", **sizes))}
    assert rows["key / value size per head"] == (symbol, value)


@pytest.mark.parametrize("training, row", [
    ({}, None),
    ({"bpe_dropout": None}, None),
    ({"bpe_dropout": 0.0}, None),
    ({"bpe_dropout": 0.1}, "0.1 on the training pairs, drawn anew every epoch (not in the paper: Provilkov et al., 2020)"),
    ({"bpe_dropout": 0.05, "bpe_dropout_target": False}, "0.05 on the training sources, drawn anew every epoch (not in "
                                                          "the paper: Provilkov et al., 2020)"),
])
def test_card_names_bpe_dropout_as_not_the_papers(training, row):
    from vanilla_transformer.hub.card import _recipe_rows

    rows = dict(_recipe_rows(VanillaTransformerConfig(), {}, None, training))
    assert rows.get("BPE-dropout") == row
