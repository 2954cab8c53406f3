import json
import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedTokenizerFast

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.training.averaging import average_checkpoints, find_checkpoints


STEPS = [10, 20, 100]  # lexical order (10, 100, 20) differs from step order
TRAINER_STATE_FILES = ["optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "training_args.bin"]


def save_checkpoint(path, seed, **overrides):
    torch.manual_seed(seed)
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny", **overrides))
    model.save_pretrained(path)
    return path


def read_tensors(path):
    with safe_open(path / "model.safetensors", framework="pt") as file:
        return {name: file.get_tensor(name) for name in file.keys()}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A Trainer-like run: three tiny checkpoints (seeds 0, 1, 2) with optimizer state, the last with a tokenizer."""
    run = tmp_path_factory.mktemp("run")
    for seed, step in enumerate(STEPS):
        checkpoint = save_checkpoint(run / f"checkpoint-{step}", seed)
        for name in TRAINER_STATE_FILES:
            (checkpoint / name).write_bytes(b"not a model file")
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "hello": 4, "world": 5}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(run / "checkpoint-100")
    (run / "checkpoint-5").write_text("a file, not a checkpoint folder")
    (run / "checkpoint-best").mkdir()
    (run / "runs").mkdir()
    return run


def test_find_checkpoints_orders_by_step_number(run_dir):
    assert find_checkpoints(run_dir, 3) == [run_dir / f"checkpoint-{step}" for step in STEPS]
    assert find_checkpoints(run_dir, 2) == [run_dir / "checkpoint-20", run_dir / "checkpoint-100"]
    assert find_checkpoints(str(run_dir), 1) == [run_dir / "checkpoint-100"]


@pytest.mark.parametrize("last_n, message", [(4, "holds 3"), (0, "at least 1")])
def test_find_checkpoints_refuses_impossible_requests(run_dir, last_n, message):
    with pytest.raises(ValueError, match=message):
        find_checkpoints(run_dir, last_n)


@pytest.mark.parametrize("last_n", [2, 3])
def test_average_is_the_elementwise_mean(run_dir, tmp_path, last_n):
    checkpoints = find_checkpoints(run_dir, last_n)

    output_dir = average_checkpoints(checkpoints, tmp_path / "averaged")

    assert output_dir == tmp_path / "averaged"
    inputs = [read_tensors(path) for path in checkpoints]
    averaged = read_tensors(output_dir)
    assert averaged.keys() == inputs[0].keys()
    for name, tensor in averaged.items():
        expected = torch.stack([tensors[name] for tensors in inputs]).mean(dim=0)
        assert tensor.dtype == torch.float32, name
        torch.testing.assert_close(tensor, expected, rtol=0, atol=1e-6, msg=name)
    assert not torch.equal(averaged["model.shared.weight"], inputs[-1]["model.shared.weight"])
    with safe_open(output_dir / "model.safetensors", framework="pt") as file:
        assert file.metadata() == {"format": "pt"}


def test_average_loads_like_a_saved_model(run_dir, tmp_path):
    last = run_dir / "checkpoint-100"
    output_dir = average_checkpoints(find_checkpoints(run_dir, 3), tmp_path / "averaged")

    # The folder is the last checkpoint's save_pretrained output, without the Trainer's state to resume from, and the
    # record of the checkpoints averaged (their steps from their names, here where trainer_state.json is no JSON).
    copied = {path.name for path in last.iterdir()} - set(TRAINER_STATE_FILES)
    assert {path.name for path in output_dir.iterdir()} == copied | {"averaged_checkpoints.json"}
    assert json.loads((output_dir / "averaged_checkpoints.json").read_text()) == {"checkpoints": [
        {"checkpoint": f"checkpoint-{step}", "step": step, "epoch": None} for step in STEPS]}
    assert (output_dir / "config.json").read_text() == (last / "config.json").read_text()
    # The tied embedding is stored once, as save_pretrained stores it.
    stored = read_tensors(output_dir)
    assert [name for name in stored if "shared" in name or "embed_tokens" in name or "lm_head" in name] == [
        "model.shared.weight"
    ]

    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir)

    assert isinstance(model, VanillaTransformerForConditionalGeneration)
    shared = model.model.shared.weight
    for tied in [model.lm_head, model.model.encoder.embed_tokens, model.model.decoder.embed_tokens]:
        assert tied.weight.data_ptr() == shared.data_ptr()
    state = model.state_dict()
    for name, tensor in stored.items():
        torch.testing.assert_close(state[name], tensor, rtol=0, atol=0, msg=name)
    tokenizer = AutoTokenizer.from_pretrained(output_dir, trust_remote_code=False)
    assert tokenizer("hello world").input_ids == [4, 5]


def test_average_keeps_dtypes_and_takes_non_float_tensors_from_the_last(tmp_path):
    checkpoints = []
    for index, value in enumerate([1.0, 2.0, 4.0]):
        path = tmp_path / f"checkpoint-{index}"
        path.mkdir()
        tensors = {"half": torch.full((3,), value, dtype=torch.float16), "steps": torch.tensor([index])}
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
        checkpoints.append(path)

    averaged = read_tensors(average_checkpoints(checkpoints, tmp_path / "averaged"))

    assert averaged["half"].dtype == torch.float16
    torch.testing.assert_close(averaged["half"], torch.full((3,), 7 / 3, dtype=torch.float16))
    assert averaged["steps"].tolist() == [2]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(d_model=64), "has tensor '.*' of shape"),
        (dict(vocab_size=256), "has tensor 'model.shared.weight' of shape \\[256, 32\\]"),
        (dict(position_embedding_type="learned"), "has tensor '.*embed_positions.*' that .* lacks"),
    ],
)
def test_average_refuses_a_different_model(run_dir, tmp_path, overrides, message):
    other = save_checkpoint(tmp_path / "checkpoint-200", seed=3, **overrides)

    with pytest.raises(ValueError, match=message) as error:
        average_checkpoints([run_dir / "checkpoint-100", other], tmp_path / "averaged")
    assert str(other) in str(error.value)
    assert not (tmp_path / "averaged").exists()


def test_average_refuses_no_checkpoints_or_missing_weights(run_dir, tmp_path):
    with pytest.raises(ValueError, match="at least one checkpoint"):
        average_checkpoints([], tmp_path / "averaged")
    empty = tmp_path / "checkpoint-300"
    empty.mkdir()
    with pytest.raises(ValueError, match=re.escape(f"Checkpoint {empty} has no model.safetensors")):
        average_checkpoints([run_dir / "checkpoint-100", empty], tmp_path / "averaged")
    with pytest.raises(ValueError, match="is one of the checkpoints"):
        average_checkpoints([run_dir / "checkpoint-100"], run_dir / "checkpoint-100")


def test_average_replaces_a_model_only_when_forced(run_dir, tmp_path, capsys):
    from vanilla_transformer.cli.main import main

    out = save_checkpoint(tmp_path / "model", seed=7)
    before = read_tensors(out)
    capsys.readouterr()  # saving prints a progress bar
    with pytest.raises(FileExistsError, match="already holds a model"):
        average_checkpoints(find_checkpoints(run_dir, 2), out)
    with pytest.raises(SystemExit) as exit_info:
        main(["average", "--run", str(run_dir), "--last", "2", "--out", str(out)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        f"vanilla-transformer average: error: {out} already holds a model; pass --force to replace it.\n"
    )
    assert all(torch.equal(tensor, before[name]) for name, tensor in read_tensors(out).items())
    main(["average", "--run", str(run_dir), "--last", "2", "--out", str(out), "--force"])
    expected = average_checkpoints(find_checkpoints(run_dir, 2), tmp_path / "fresh")  # an empty folder needs no force
    assert read_tensors(out).keys() == read_tensors(expected).keys()
    assert all(torch.equal(tensor, read_tensors(expected)[name]) for name, tensor in read_tensors(out).items())


def test_average_command_reports_a_missing_run_in_one_line(tmp_path, capsys):
    from vanilla_transformer.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["average", "--run", str(tmp_path / "missing"), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    missing = tmp_path / "missing"
    assert capsys.readouterr().err == f"vanilla-transformer average: error: Run folder {missing} does not exist.\n"


def marked_run_with_an_interrupted_checkpoint(run_dir, folder):
    """A copy of `run_dir` whose checkpoints are marked complete, with checkpoint-200 cut short as a kill leaves it:
    half of its weights, no tokenizer, no mark."""
    import shutil

    from vanilla_transformer.training.checkpoints import mark_complete

    run = shutil.copytree(run_dir, folder)
    for step in STEPS:
        mark_complete(run / f"checkpoint-{step}")
    interrupted = save_checkpoint(run / "checkpoint-200", seed=3)
    weights = interrupted / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return run


def test_average_uses_complete_checkpoints_only_and_says_which_it_skipped(run_dir, tmp_path, capsys):
    from vanilla_transformer.training.checkpoints import COMPLETE
    from vanilla_transformer.cli.main import main

    run = marked_run_with_an_interrupted_checkpoint(run_dir, tmp_path / "run")
    capsys.readouterr()
    assert find_checkpoints(run, 2) == [run / "checkpoint-20", run / "checkpoint-100"]
    main(["average", "--run", str(run), "--last", "2", "--out", str(tmp_path / "averaged")])
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == (f"skipped {run / 'checkpoint-200'}, an incomplete checkpoint: it has no {COMPLETE}: its writing was "
                   "interrupted")
    assert (tmp_path / "averaged" / "tokenizer.json").is_file() and not (tmp_path / "averaged" / COMPLETE).exists()
    with pytest.raises(ValueError, match=re.escape(f"holds 3 complete (and 1 incomplete) `checkpoint-<step>` folders")):
        find_checkpoints(run, 4)
    # Given by name, the interrupted checkpoint is refused.
    with pytest.raises(ValueError, match="checkpoint-200 is incomplete: it has no checkpoint_complete.json"):
        average_checkpoints([run / "checkpoint-100", run / "checkpoint-200"], tmp_path / "other")


def test_a_checkpoint_changed_after_it_was_marked_is_incomplete(run_dir, tmp_path):
    from vanilla_transformer.training.checkpoints import checkpoint_problem, complete_checkpoints

    run = marked_run_with_an_interrupted_checkpoint(run_dir, tmp_path / "run")
    weights = run / "checkpoint-20" / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[:1000])
    assert checkpoint_problem(run / "checkpoint-20") == f"model.safetensors holds 1,000 bytes, not the {size:,} written"
    (run / "checkpoint-10" / "tokenizer_config.json").unlink(missing_ok=True)
    (run / "checkpoint-10" / "config.json").unlink()
    assert checkpoint_problem(run / "checkpoint-10") == "config.json is missing"
    assert complete_checkpoints(run)[0] == [run / "checkpoint-100"]


def test_a_run_without_marks_is_judged_by_its_files(run_dir, tmp_path):
    from vanilla_transformer.training.checkpoints import checkpoint_problem

    # The fixture's checkpoints are unmarked, with a trainer_state.json that is not JSON: complete weights suffice to
    # average them, not to resume from them.
    assert checkpoint_problem(run_dir / "checkpoint-10", to_resume=False) is None
    assert checkpoint_problem(run_dir / "checkpoint-10") == "its trainer_state.json is truncated or not JSON"
    cut = save_checkpoint(tmp_path / "checkpoint-1", seed=0)
    (cut / "trainer_state.json").write_text("{}")
    assert checkpoint_problem(cut) is None
    weights = cut / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[:-10])
    assert checkpoint_problem(cut) == f"model.safetensors is truncated ({size - 10:,} bytes of {size:,})"
    weights.write_bytes(b"garbage")
    assert checkpoint_problem(cut) == "model.safetensors is not a safetensors file (truncated or garbled)"


def test_a_full_disk_leaves_the_average_folder_as_it_was(run_dir, tmp_path, capsys, monkeypatch):
    import vanilla_transformer.training.averaging as averaging
    from vanilla_transformer.cli.main import main

    def full_disk(tensors, path, metadata=None):
        # safetensors' own words for ENOSPC, after part of the file is written
        path.write_bytes(b"partial")
        raise Exception('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left '
                        'on device" })')

    monkeypatch.setattr(averaging, "save_file", full_disk)
    before = save_checkpoint(tmp_path / "out", seed=7)
    files = {path.name: path.read_bytes() for path in before.iterdir()}
    for out, force in ((tmp_path / "new", []), (before, ["--force"])):
        with pytest.raises(SystemExit) as exit_info:
            main(["average", "--run", str(run_dir), "--last", "2", "--out", str(out), *force])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.splitlines()[-1]
        assert re.fullmatch(rf"vanilla-transformer average: error: cannot write in {re.escape(str(out))}: no space "
                            r"left on its device \([\d,.]+ [MG]iB free, [\d,.]+ MiB needed\)", err), err
    # Nothing new under the names, nothing beside them; the model --force would have replaced is untouched.
    assert not (tmp_path / "new").exists()
    assert {path.name: path.read_bytes() for path in before.iterdir()} == files
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]


def test_checkpoints_older_than_a_runs_first_mark_are_judged_by_their_files(run_dir, tmp_path):
    """A run begun by a release that did not mark its checkpoints and resumed by this one: its unmarked checkpoints
    before the first marked one are complete (judged by their files), an unmarked one after it was interrupted."""
    import shutil

    from vanilla_transformer.training.checkpoints import checkpoint_problem, complete_checkpoints, mark_complete

    run = shutil.copytree(run_dir, tmp_path / "run")
    first, *later = STEPS
    for step in later:
        mark_complete(run / f"checkpoint-{step}")
    save_checkpoint(run / "checkpoint-200", seed=3)  # written whole, but not marked: cut before its mark
    complete, skipped = complete_checkpoints(run, to_resume=False)
    assert [path.name for path in complete] == [f"checkpoint-{step}" for step in STEPS]
    assert list(skipped) == [run / "checkpoint-200"]
    assert checkpoint_problem(run / f"checkpoint-{first}", to_resume=False) is None
