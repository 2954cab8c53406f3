import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedTokenizerFast

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.averaging import average_checkpoints, find_checkpoints


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

    # The folder is the last checkpoint's save_pretrained output, without the Trainer's state to resume from.
    copied = {path.name for path in last.iterdir()} - set(TRAINER_STATE_FILES)
    assert {path.name for path in output_dir.iterdir()} == copied
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
    from vanilla_transformer.cli import main

    out = save_checkpoint(tmp_path / "model", seed=7)
    before = read_tensors(out)
    capsys.readouterr()  # saving prints a progress bar
    with pytest.raises(FileExistsError, match="already holds a model"):
        average_checkpoints(find_checkpoints(run_dir, 2), out)
    with pytest.raises(SystemExit) as exit_info:
        main(["average", "--run", str(run_dir), "--last", "2", "--out", str(out)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        f"vanilla-transformer average: error: {out} already holds a model; pass force=True (--force) to replace it.\n"
    )
    assert all(torch.equal(tensor, before[name]) for name, tensor in read_tensors(out).items())
    main(["average", "--run", str(run_dir), "--last", "2", "--out", str(out), "--force"])
    expected = average_checkpoints(find_checkpoints(run_dir, 2), tmp_path / "fresh")  # an empty folder needs no force
    assert read_tensors(out).keys() == read_tensors(expected).keys()
    assert all(torch.equal(tensor, read_tensors(expected)[name]) for name, tensor in read_tensors(out).items())


def test_average_command_reports_a_missing_run_in_one_line(tmp_path, capsys):
    from vanilla_transformer.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["average", "--run", str(tmp_path / "missing"), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    missing = tmp_path / "missing"
    assert capsys.readouterr().err == f"vanilla-transformer average: error: Run folder {missing} does not exist.\n"
