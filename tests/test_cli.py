"""The `vanilla-transformer` command explains itself: `--help` lists every command with its summary, every command has
its own `--help`, and options are spelled with dashes everywhere (`train` also takes transformers' underscores)."""

import re
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pytest
import torch
from packaging.version import Version

from vanilla_transformer.backends.onnx.export import EXPORTER_TORCH
from vanilla_transformer.cli.main import COMMANDS, main
from vanilla_transformer.errors import UserError


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
    from vanilla_transformer.cli.train import parse_arguments

    dashed = ["--train-file", "pairs.tsv", "--output-dir", "out", "--max-tokens", "512", "--max-steps", "3"]
    underscored = ["--train_file", "pairs.tsv", "--output_dir", "out", "--max_tokens", "512", "--max_steps", "3"]
    for argv in (dashed, underscored):
        _, data_args, _, training_args, profile = parse_arguments(argv)
        assert not profile.demo and training_args.output_dir == "out"
        assert (data_args.train_file, data_args.max_tokens, training_args.max_steps) == ("pairs.tsv", 512, 3)
    with pytest.raises(UserError, match="--output-dir is required"):  # own data still needs an output folder
        parse_arguments(["--source-file", "train.en", "--target-file", "train.de"])


def test_train_help_shows_the_defaults_of_a_run_on_ones_own_data_and_the_demos_beside_them(capsys):
    from vanilla_transformer.demo.profile import DEMO_DEFAULTS

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert "(default: base)" in out  # the preset
    assert "--d-model D_MODEL Override the preset's d_model. (default: None; demo: 128)" in out
    assert "(default: 37000; demo: 1000)" in out  # the vocabulary
    assert "(default: 4000; demo: 300)" in out  # the warm-up
    assert "(default: -1; demo: 1200)" in out  # the steps: -1, --num-train-epochs decides (3)
    assert f"demo: {DEMO_DEFAULTS['output_dir']})" in out and f"(default: {DEMO_DEFAULTS['output_dir']}" not in out


def test_validation_files_mean_validation_at_every_checkpoint():
    from vanilla_transformer.cli.train import parse_arguments
    from vanilla_transformer.train_run.report import validation_schedule

    own = ["--train-file", "pairs.tsv", "--output-dir", "out", "--save-steps", "500"]
    validation = ["--validation-source-file", "val.en", "--validation-target-file", "val.fr"]
    training_args = parse_arguments([*own, *validation])[3]
    assert (training_args.eval_strategy, training_args.eval_steps) == ("steps", 500)
    assert parse_arguments(own)[3].eval_strategy == "no"  # nothing to validate on
    assert parse_arguments([*own, *validation, "--eval-strategy", "no"])[3].eval_strategy == "no"  # asked not to
    assert parse_arguments([*own, *validation, "--eval-strategy", "epoch"])[3].eval_strategy == "epoch"
    assert validation_schedule(training_args) == (
        "validation: loss, BLEU and chrF (greedy, at most source length + 20 tokens) every 500 steps")
    assert validation_schedule(parse_arguments(own)[3]) == "validation: loss, BLEU and chrF never (--eval-strategy no)"


# --- User errors: one line, exit status 2, no traceback --------------------------------------------------------------


def run_main(argv, capsys) -> str:
    """What `main(argv)` prints on standard error when it stops with exit status 2."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.fixture
def no_hub(monkeypatch):
    """Loading anything with transformers fails the test: the checks must come first, and never reach the Hub."""
    import transformers

    def refuse(*args, **kwargs):
        pytest.fail(f"from_pretrained{args} was called")

    for auto_class in (transformers.AutoTokenizer, transformers.AutoModelForSeq2SeqLM, transformers.AutoConfig):
        monkeypatch.setattr(auto_class, "from_pretrained", refuse)


@pytest.fixture
def model_without_tokenizer(tmp_path):
    from conftest import make_tiny_config

    from vanilla_transformer import VanillaTransformerForConditionalGeneration

    folder = tmp_path / "model"
    VanillaTransformerForConditionalGeneration(make_tiny_config()).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("command", ["translate", "evaluate", "plot-attention", "export-ct2", "model-card"])
def test_a_missing_model_folder_is_named_in_one_line(command, tmp_path, capsys, no_hub):
    extra = {
        "translate": [],
        "evaluate": ["--src", "src.txt", "--ref", "ref.txt"],
        "plot-attention": ["--source", "a cat", "--out", str(tmp_path / "plot.png")],
        "export-ct2": ["--out", str(tmp_path / "ct2")],
        "model-card": ["--out", str(tmp_path / "README.md")],
    }[command]
    if command == "evaluate":  # the model is checked after the files it scores
        for name in ("src.txt", "ref.txt"):
            (tmp_path / name).write_text("a cat\n")
        extra = ["--src", str(tmp_path / "src.txt"), "--ref", str(tmp_path / "ref.txt")]
    missing = "/path/that/does/not/exist"
    err = run_main([command, "--model", missing, *extra], capsys)
    assert err == f"vanilla-transformer {command}: error: no such folder: {missing}\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["translte"], "argument COMMAND: invalid choice: 'translte'"),
        (["translate", "--model", "m", "--batch-size", "0"], "argument --batch-size: expected a positive integer, got 0"),
        (["evaluate", "--model", "m"], "the following arguments are required: --src, --ref"),
        (["average", "--run", "r", "--out", "o", "--lst", "3"], "unrecognized argument --lst (did you mean --last?)"),
        # A misspelt required flag is named as unknown, not reported as the required one missing.
        (["translate", "--modle", "m"], "unrecognized argument --modle (did you mean --model?)\n"),
        # No abbreviations: a flag added later cannot make an old command line mean something else.
        (["translate", "--model", "m", "--num-beam", "2"], "unrecognized argument --num-beam (did you mean --num-beams?)"),
        (["translate", "--model=m", "--max-new=3"], "unrecognized argument --max-new (did you mean --max-new-tokens?)"),
        (["train", "--max_stpes", "3"], "unrecognized argument --max_stpes (did you mean --max_steps?)"),
        (["train", "--max-step", "3"], "unrecognized argument --max-step (did you mean --max-steps?)"),
        (["plot-attention", "--xyz"], "unrecognized argument --xyz\n"),
        (["train", "--max-steps", "many"], "argument --max_steps/--max-steps: invalid int value: 'many'"),
        (["train", "--train-file", "pairs.tsv"], "--output-dir is required when training on your own data."),
    ],
)
def test_a_bad_flag_is_one_line_without_the_usage(argv, message, capsys):
    err = run_main(argv, capsys)
    command = f" {argv[0]}" if argv[0] != "translte" else ""
    assert err.startswith(f"vanilla-transformer{command}: error: {message}") and err.count("\n") == 1


def test_a_relative_path_that_does_not_exist_is_not_sent_to_the_hub(tmp_path, capsys, monkeypatch, no_hub):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    # A path under an existing folder, or one that is not USER/NAME, is a path: no Hub request is made.
    for value in ["runs/en-de", "./en-de", "en-de/averaged/", "runs/en-de/averaged"]:
        assert run_main(["translate", "--model", value], capsys).endswith(f"error: no such folder: {value}\n")
    err = run_main(["translate", "--model", "en-de"], capsys)
    assert err == "vanilla-transformer translate: error: no such folder: en-de (a Hub model is named USER/NAME)\n"


def test_a_folder_without_tokenizer_files_says_so(model_without_tokenizer, capsys, no_hub):
    err = run_main(["translate", "--model", str(model_without_tokenizer)], capsys)
    assert err == (
        f"vanilla-transformer translate: error: {model_without_tokenizer} has no tokenizer files "
        "(tokenizer.json or tokenizer_config.json)\n"
    )
    (model_without_tokenizer / "config.json").unlink()
    plot = ["plot-attention", "--model", str(model_without_tokenizer), "--source", "a", "--out", "a.png"]
    err = run_main(plot, capsys)
    assert err.endswith(f"error: {model_without_tokenizer} has no config.json: it is not a saved model folder\n")


def test_a_missing_input_file_and_a_bad_device_are_named(model_without_tokenizer, tmp_path, capsys):
    err = run_main(["translate", "--model", str(tmp_path), "--input", str(tmp_path / "missing.en")], capsys)
    assert err == f"vanilla-transformer translate: error: no such file or folder: {tmp_path / 'missing.en'}\n"
    err = run_main(["translate", "--model", str(tmp_path), "--input", str(tmp_path)], capsys)
    assert err == f"vanilla-transformer translate: error: {tmp_path} is a folder, not a file\n"
    assert "expected a device such as cpu" in run_main(["translate", "--model", "m", "--device", "gpu0"], capsys)


@pytest.mark.slow  # a fresh process
def test_console_script_reports_a_missing_export_folder_in_one_line(tmp_path):
    script = Path(sys.executable).with_name("vanilla-transformer")
    if not script.exists():
        pytest.skip("the vanilla-transformer console script is not installed next to this Python")
    result = subprocess.run(
        [script, "export-ct2", "--model", tmp_path / "missing", "--out", tmp_path / "ct2"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr == f"vanilla-transformer export-ct2: error: no such folder: {tmp_path / 'missing'}\n"


def test_a_value_that_is_no_number_is_named_without_internal_names(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", "--model", "any", "--batch-size", "four"])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "argument --batch-size: expected a positive integer, got 'four'" in error and "_positive_int" not in error


@pytest.mark.parametrize(("flag", "value"), [("--source", ""), ("--source", "  "), ("--translation", "")])
def test_plot_attention_refuses_an_empty_sentence_before_loading_anything(flag, value, tmp_path, capsys):
    arguments = {"--source": "A man.", "--translation": None, flag: value}
    argv = ["plot-attention", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "plot.png")]
    argv += [part for name, text in arguments.items() if text is not None for part in (name, text)]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert f"{flag} is empty" in capsys.readouterr().err
    assert not (tmp_path / "plot.png").exists()


@pytest.fixture
def model_with_a_larger_tokenizer(tmp_path, tokenizer_dir):
    """A model of 128 embedding rows saved with a tokenizer of 300 tokens: not made together."""
    from conftest import make_tiny_config
    from transformers import AutoTokenizer

    from vanilla_transformer import VanillaTransformerForConditionalGeneration

    folder = tmp_path / "model"
    VanillaTransformerForConditionalGeneration(make_tiny_config(vocab_size=128)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(folder)
    return folder


def model_command_arguments(command: str, model, tmp_path) -> list[str]:
    """The arguments with which `command` reads the model folder `model`, its outputs and inputs under `tmp_path`
    (`evaluate` reads src.txt and ref.txt, `train` pairs.tsv)."""
    return {
        "translate": ["--model", str(model)],
        "evaluate": ["--model", str(model), "--src", str(tmp_path / "src.txt"), "--ref", str(tmp_path / "ref.txt")],
        "plot-attention": ["--model", str(model), "--source", "a cat", "--out", str(tmp_path / "plot.png")],
        "export-ct2": ["--model", str(model), "--out", str(tmp_path / "ct2")],
        "export-onnx": ["--model", str(model), "--out", str(tmp_path / "onnx")],
        "train": ["--model-name-or-path", str(model), "--train-file", str(tmp_path / "pairs.tsv"),
                  "--output-dir", str(tmp_path / "run")],
        "push": ["--model", str(model), "--repo-id", "user/model", "--dry-run", str(tmp_path / "staged")],
    }[command]


@pytest.mark.parametrize("command", ["translate", "plot-attention", "export-ct2", "export-onnx", "train", "push"])
def test_a_tokenizer_that_does_not_fit_its_model_is_named_in_one_line(command, model_with_a_larger_tokenizer,
                                                                     tmp_path, capsys):
    model = model_with_a_larger_tokenizer
    extra = model_command_arguments(command, model, tmp_path)
    (tmp_path / "pairs.tsv").write_text("one\tun\n")
    err = run_main([command, *extra], capsys)
    assert err == (f"vanilla-transformer {command}: error: its tokenizer has 300 tokens but the model {model} has 128 "
                   "embedding rows (vocab_size): they were not made together\n")
    assert not any((tmp_path / name).exists() for name in ("plot.png", "ct2", "onnx", "run", "staged"))


def test_a_tokenizer_with_other_special_ids_is_named_in_one_line(model_with_a_larger_tokenizer, capsys):
    import json

    model = model_with_a_larger_tokenizer
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(dict(config, vocab_size=300, eos_token_id=7)))
    err = run_main(["translate", "--model", str(model)], capsys)
    assert err.endswith(f"error: its tokenizer has eos_token_id 2 but the model {model} has eos_token_id 7: they were "
                        "not made together\n")


# --- The Hub: a path is never sent to it, and without a network one line comes at once -------------------------------


def test_a_misspelt_folder_is_named_not_sent_to_the_hub(tmp_path, capsys, monkeypatch, no_hub):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs" / "model").mkdir(parents=True)
    # A first part this close to a folder here is a path, whose nearest existing folder is suggested.
    for value, near in [("ouputs/model", "outputs/model"), ("Outputs/modle", "outputs/model"),
                        ("ouputs/model/averaged", "a folder in outputs"), ("ouputs/other", "a folder in outputs")]:
        err = run_main(["translate", "--model", value], capsys)
        assert err == f"vanilla-transformer translate: error: no such folder: {value} (did you mean {near}?)\n"


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """huggingface_hub's session on a machine without a network: every request fails at once, as a failed name lookup
    does, in the exception class of the HTTP library huggingface_hub uses; the requests are listed. The Hub cache is
    an empty folder."""
    session_class = type(huggingface_hub.get_session())
    library = sys.modules[session_class.__module__.split(".")[0]]
    requests = []

    def send(client, request, **kwargs):
        requests.append(f"{request.method} {str(request.url).rstrip('/')}")
        raise library.ConnectError("[Errno -2] Name or service not known", request=request)

    monkeypatch.setattr(session_class, "send", send)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    return requests


def fake_model_folder(folder: Path) -> Path:
    """A folder with the files that the commands check before loading anything, whole but empty (they are never
    loaded): JSON objects and a safetensors file of no tensors."""
    folder.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_text("{}")
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    return folder


@pytest.mark.parametrize("command", ["translate", "evaluate", "plot-attention", "push"])
def test_without_a_network_a_hub_command_stops_at_once_in_one_line(command, tmp_path, capsys, monkeypatch, no_network):
    monkeypatch.chdir(tmp_path)
    repo_id = "nobody-here/no-such-model"
    (tmp_path / "src.txt").write_text("a cat\n")
    argv = {
        "translate": ["translate", "--model", repo_id],
        "evaluate": ["evaluate", "--model", repo_id, "--src", "src.txt", "--ref", "src.txt"],
        "plot-attention": ["plot-attention", "--model", repo_id, "--source", "a cat", "--out", "plot.png"],
        "push": ["push", "--model", "model", "--repo-id", repo_id],
    }[command]
    if command == "push":
        fake_model_folder(tmp_path / "model")

    start = time.perf_counter()
    err = run_main(argv, capsys)
    elapsed = time.perf_counter() - start

    endpoint = huggingface_hub.constants.ENDPOINT
    if command == "push":
        assert err == (f"vanilla-transformer push: error: the Hub ({endpoint}) cannot be reached (Name or service not "
                       "known); --dry-run OUT writes the folder that would be uploaded\n")
    else:
        assert err == (f"vanilla-transformer {command}: error: {repo_id} is no folder here, and the Hub ({endpoint}) "
                       "cannot be reached to fetch it as a model (Name or service not known); a model already in the "
                       "cache loads with HF_HUB_OFFLINE=1\n")
    assert no_network == [f"HEAD {endpoint}"]  # one request, no retry
    assert elapsed < 3
    left = sorted(path.name for path in tmp_path.iterdir())
    assert left == (["model", "src.txt"] if command == "push" else ["src.txt"])  # no output begun


def cache_model(cache: Path, repo_id: str) -> None:
    """`repo_id` in a huggingface_hub cache folder, as a download of its config.json leaves it."""
    repo, commit = cache / f"models--{repo_id.replace('/', '--')}", "0" * 40
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


def test_without_a_network_a_cached_model_is_pointed_to_offline_mode(tmp_path, capsys, monkeypatch, no_network):
    monkeypatch.chdir(tmp_path)
    cache_model(tmp_path / "hub-cache", "someone/cached")

    err = run_main(["translate", "--model", "someone/cached"], capsys)

    assert err.endswith("(Name or service not known); it is in the cache, which loads with HF_HUB_OFFLINE=1\n")


def test_in_offline_mode_nothing_is_requested(tmp_path, capsys, monkeypatch, no_network):
    from vanilla_transformer.hub.reachability import check_model

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cache_model(tmp_path / "hub-cache", "someone/cached")

    assert check_model("someone/cached") == "someone/cached"  # huggingface_hub answers from its cache
    err = run_main(["translate", "--model", "someone/other"], capsys)
    assert err == ("vanilla-transformer translate: error: someone/other is no folder here, nor a model in the Hub "
                   "cache (HF_HUB_OFFLINE is set)\n")
    err = run_main(["push", "--model", str(fake_model_folder(tmp_path / "model")), "--repo-id", "someone/x"], capsys)
    assert err == ("vanilla-transformer push: error: HF_HUB_OFFLINE is set, so nothing can be sent to the Hub: unset "
                   "it to push, or write the folder that would be uploaded with --dry-run OUT\n")
    assert no_network == []


def test_a_hub_that_does_not_answer_is_given_up_on(monkeypatch):
    """A name lookup that hangs is not bounded by the HTTP library's timeout: the probe waits for it only so long."""
    from vanilla_transformer.hub.reachability import hub_unreachable

    release = threading.Event()

    def hang(client, request, **kwargs):
        release.wait(30)
        raise RuntimeError("released")

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(type(huggingface_hub.get_session()), "send", hang)
    start = time.perf_counter()
    try:
        assert hub_unreachable(timeout=0.1) == "no answer in 0.1 s"
    finally:
        release.set()
    assert time.perf_counter() - start < 2


def test_evaluate_checks_its_json_file_first(tmp_path, capsys, no_hub):
    (tmp_path / "src.txt").write_text("a cat\n")
    source = str(tmp_path / "src.txt")
    argv = ["evaluate", "--model", str(tmp_path), "--src", source, "--ref", source]
    missing = tmp_path / "missing" / "results.json"
    err = run_main([*argv, "--json", str(missing)], capsys)
    assert err == f"vanilla-transformer evaluate: error: no such folder: {missing.parent} (to write {missing} in)\n"
    err = run_main([*argv, "--json", "-"], capsys)
    assert err.endswith("error: --json -: give the name of a file to write (standard output has the scores)\n")
    err = run_main([*argv, "--dataset", "Multi30k"], capsys)
    assert err.endswith("error: --dataset names the data in the --json results file; give --json FILE too\n")


def test_a_tokenizer_file_that_is_no_tokenizer_is_named_in_one_line(model_with_a_larger_tokenizer, capsys):
    model = model_with_a_larger_tokenizer
    (model / "tokenizer.json").write_text("{}")
    err = run_main(["translate", "--model", str(model)], capsys)
    assert err.startswith(f"vanilla-transformer translate: error: cannot read the tokenizer in {model}: ")
    assert err.count("\n") == 1


@pytest.fixture
def saved_model(tmp_path, tokenizer_dir):
    """A tiny model saved with the tokenizer it was made for."""
    from conftest import tiny_config_for
    from transformers import AutoTokenizer

    from vanilla_transformer import VanillaTransformerForConditionalGeneration

    folder = tmp_path / "model"
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    VanillaTransformerForConditionalGeneration(tiny_config_for(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json", "config.json", "generation_config.json"])
@pytest.mark.parametrize("command", ["translate", "evaluate", "plot-attention", "export-ct2", "export-onnx", "train",
                                     "push"])
def test_a_truncated_model_file_is_named_in_one_line(command, name, saved_model, tmp_path, capsys, no_hub):
    model = saved_model
    for text in ("src.txt", "ref.txt"):
        (tmp_path / text).write_text("one\n")
    (tmp_path / "pairs.tsv").write_text("one\tun\n")
    extra = model_command_arguments(command, model, tmp_path)
    path = model / name
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[: size // 2])
    err = run_main([command, *extra], capsys)
    if name == "model.safetensors":
        assert err == f"vanilla-transformer {command}: error: {path} is truncated ({size // 2:,} bytes of {size:,})\n"
    else:
        assert err == f"vanilla-transformer {command}: error: {path} is truncated or not JSON\n"
    assert not any((tmp_path / name).exists() for name in ("plot.png", "ct2", "onnx", "run", "staged"))


@pytest.mark.parametrize("value, problem", [
    ('"big"', "Field 'd_model' expected int, got str (value: 'big')"),
    ("-4", "`d_model` must be a positive integer, got -4."),
])
@pytest.mark.parametrize("command", ["translate", "plot-attention", "export-ct2", "train", "push"])
def test_a_config_value_of_the_wrong_type_is_named_in_one_line(command, value, problem, saved_model, tmp_path, capsys,
                                                               no_hub):
    for text in ("src.txt", "ref.txt"):
        (tmp_path / text).write_text("one\n")
    (tmp_path / "pairs.tsv").write_text("one\tun\n")
    config = saved_model / "config.json"
    config.write_text(re.sub(r'"d_model": \d+', f'"d_model": {value}', config.read_text()))
    err = run_main([command, *model_command_arguments(command, saved_model, tmp_path)], capsys)
    assert err == f"vanilla-transformer {command}: error: {config}: {problem}\n"


@pytest.mark.slow  # a process of its own
def test_console_script_names_a_config_value_of_the_wrong_type(saved_model, tmp_path):
    config = saved_model / "config.json"
    config.write_text(re.sub(r'"d_model": \d+', '"d_model": "big"', config.read_text()))
    result = subprocess.run([Path(sys.executable).with_name("vanilla-transformer"), "translate", "--model",
                             saved_model], input=b"one\n", capture_output=True)
    assert result.returncode == 2 and result.stdout == b""
    assert result.stderr.decode() == (f"vanilla-transformer translate: error: {config}: Field 'd_model' expected int, "
                                      "got str (value: 'big')\n")


def test_a_full_disk_stops_translate_in_one_line_and_keeps_the_old_output(saved_model, tmp_path, capsys,
                                                                          monkeypatch):
    import errno

    from vanilla_transformer.paths import text_files

    class FullDisk:
        """A file whose writes the disk refuses once some lines are in."""

        def __init__(self, *args, **kwargs):
            self.file = open(*args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device", self.file.name)

    (tmp_path / "input.txt").write_text("one\ntwo\n")
    output = tmp_path / "out.txt"
    output.write_text("the old translations\n")
    def full_disk_open(path, mode="r", *args, **kwargs):  # the new files the disk refuses; reading as usual
        return (FullDisk if "x" in mode else open)(path, mode, *args, **kwargs)

    monkeypatch.setattr(text_files, "open", full_disk_open, raising=False)
    err = run_main(["translate", "--model", str(saved_model), "--input", str(tmp_path / "input.txt"), "--output",
                    str(output), "--max-new-tokens", "2"], capsys)
    assert re.fullmatch(rf"vanilla-transformer translate: error: cannot write in {re.escape(str(tmp_path))}: no space "
                        r"left on its device \([\d,.]+ [MG]iB free\)\n", err), err
    assert output.read_text() == "the old translations\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["input.txt", "model", "out.txt"]  # no temporary file


def test_a_full_disk_during_export_says_about_what_the_export_writes(saved_model, tmp_path, capsys, monkeypatch):
    from vanilla_transformer.cli import export

    out = tmp_path / "ct2"
    main(["export-ct2", "--model", str(saved_model), "--out", str(out), "--max-positions", "512"])
    capsys.readouterr()
    written = sum(path.stat().st_size for path in out.iterdir())
    # The same export on a disk that refuses it: the space it says the export needs is about what it wrote.
    import errno

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("vanilla_transformer.backends.ctranslate2.export.export_ctranslate2", full_disk)
    monkeypatch.setattr("vanilla_transformer.paths.disk.free_space", lambda folder: 2**20)
    err = run_main(["export-ct2", "--model", str(saved_model), "--out", str(tmp_path / "full"), "--max-positions",
                    "512"], capsys)
    needed = float(re.search(r"\(1\.0 MiB free, ([\d.]+) MiB needed\)", err).group(1)) * 2**20
    assert 0.8 * written <= needed <= 1.2 * written, (needed, written)
    estimate = export._size_written(SimpleNamespace(model=str(saved_model), max_positions=512), "ONNX")
    assert estimate == 3 * export._size_written(SimpleNamespace(model=str(saved_model), max_positions=512),
                                                "CTranslate2")


# --- A bug keeps its traceback; an input mistake is one line ---------------------------------------------------------


@pytest.mark.parametrize("exporter", ["ctranslate2", "onnx"])
def test_an_unexpected_error_inside_an_export_keeps_its_traceback_and_its_refusals_stay_one_line(
    exporter, saved_model, tmp_path, capsys, monkeypatch
):
    """Only the export's own refusals (settings, an unsupported model, what the disk says) are worded as one line:
    a ValueError from inside the conversion is a bug, raised with its traceback (the console script exits with 1)."""
    command, function = {"ctranslate2": ("export-ct2", "export_ctranslate2"), "onnx": ("export-onnx", "export_onnx")}[
        exporter]
    module = f"vanilla_transformer.backends.{exporter}.export"

    def bug(*args, **kwargs):
        raise ValueError("an internal check failed")

    with monkeypatch.context() as patch:
        patch.setattr(f"{module}.{function}", bug)
        with pytest.raises(ValueError, match="an internal check failed"):
            main([command, "--model", str(saved_model), "--out", str(tmp_path / "out")])
    # An input mistake the export finds itself: its one line, exit status 2. Under a torch too old for the ONNX
    # exporter, that refusal comes first (the extras are checked before the arguments), one line as well.
    err = run_main([command, "--model", str(saved_model), "--out", str(saved_model), "--force"], capsys)
    if exporter == "onnx" and Version(torch.__version__).release < EXPORTER_TORCH:
        assert err.startswith(f"vanilla-transformer {command}: error: the ONNX export needs torch >= ")
        assert err.count("\n") == 1
    else:
        assert err == (f"vanilla-transformer {command}: error: The output folder {saved_model} would replace the "
                       f"model folder {saved_model}; choose another.\n")


@pytest.mark.slow  # a process of its own
def test_the_command_ends_a_bug_inside_an_export_with_its_traceback_and_exit_status_1(saved_model, tmp_path):
    script = ("import vanilla_transformer.backends.ctranslate2.export as export; "
              "export.export_ctranslate2 = lambda *a, **k: int('x'); "
              "from vanilla_transformer.cli.main import main; main()")
    result = subprocess.run([sys.executable, "-c", script, "export-ct2", "--model", str(saved_model), "--out",
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback (most recent call last)" in result.stderr
    assert result.stderr.rstrip().endswith("ValueError: invalid literal for int() with base 10: 'x'")


def test_an_unexpected_error_while_building_a_run_keeps_its_traceback_and_bad_data_stays_one_line(
    corpus, tokenizer_dir, tmp_path, capsys, monkeypatch
):
    from test_training import train_command

    from vanilla_transformer.training import data

    argv = train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "run", "--max_steps", "1")

    def bug(*args, **kwargs):
        raise ValueError("an internal check failed")

    with monkeypatch.context() as patch:
        patch.setattr(data, "load_tsv", bug)
        with pytest.raises(ValueError, match="an internal check failed"):
            main(argv)
    bad = tmp_path / "bad.tsv"
    bad.write_text("one\tun\ntwo deux\n", encoding="utf-8")
    err = run_main([*argv, "--train_file", str(bad), "--output_dir", str(tmp_path / "bad-run")], capsys)
    assert err.splitlines()[-1] == f"vanilla-transformer train: error: {bad}, line 2: expected one tab, found 0"


def test_an_unexpected_error_while_averaging_keeps_its_traceback(tmp_path, monkeypatch):
    from vanilla_transformer.training import averaging

    def bug(*args, **kwargs):
        raise ValueError("an internal check failed")

    monkeypatch.setattr(averaging, "find_checkpoints", bug)
    with pytest.raises(ValueError, match="an internal check failed"):
        main(["average", "--run", str(tmp_path), "--out", str(tmp_path / "averaged")])
