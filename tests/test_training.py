"""The training recipe on Seq2SeqTrainer: schedule, token batches, the demo corpus, fine-tuning with plain
transformers pieces, resuming, the command line, and two-process DDP equal to one process."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch
from conftest import ctrl_c_at_step
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments
from transformers.trainer_pt_utils import LabelSmoother

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.errors import UserError
from vanilla_transformer.train_run.callbacks import TrainingTimeBudget
from vanilla_transformer.training.trainer import (
    BPEDropoutDataset,
    TokenBatchSeq2SeqTrainer,
    label_smoothed_cross_entropy,
    paper_learning_rate,
    paper_training_arguments,
    tokenize_pairs,
    translation_metrics,
)


def small_model(tokenizer, seed=0, **overrides):
    torch.manual_seed(seed)
    config = VanillaTransformerConfig.from_preset(
        "tiny", vocab_size=len(tokenizer), d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, **overrides
    )
    return VanillaTransformerForConditionalGeneration(config)


def section_5_3_rate(step, d_model, warmup):
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


# --- The recipe --------------------------------------------------------------------------------------------------


def test_learning_rate_follows_section_5_3_at_1_warmup_and_4_warmup(tmp_path):
    d_model, warmup = 512, 4000
    args = paper_training_arguments(str(tmp_path), d_model=d_model, warmup_steps=warmup, report_to=[])
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny", d_model=512, encoder_attention_heads=8, decoder_attention_heads=8))
    trainer = Seq2SeqTrainer(model=model, args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=20 * warmup)
    scheduler, optimizer = trainer.lr_scheduler, trainer.optimizer
    for step in [1, warmup, 4 * warmup]:
        learning_rate = args.learning_rate * scheduler.lr_lambdas[0](step)  # the rate after `step` scheduler steps
        assert math.isclose(learning_rate, section_5_3_rate(step, d_model, warmup), rel_tol=1e-9), step
    assert math.isclose(paper_learning_rate(d_model, warmup, scale=2.0), 2 * (d_model * warmup) ** -0.5)
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9 and group["weight_decay"] == 0.0
    assert trainer.label_smoother.epsilon == 0.1
    assert args.max_grad_norm == 0.0  # the paper clips no gradients


@pytest.mark.parametrize("num_items_in_batch", [None, 23])
def test_fused_label_smoothed_loss_equals_transformers_label_smoother(num_items_in_batch):
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, requires_grad=True)
    labels = torch.randint(0, 11, (3, 5)).masked_fill(torch.tensor([[0, 0, 0, 1, 1], [0] * 5, [0, 1, 1, 1, 1]]) == 1, -100)
    ours = label_smoothed_cross_entropy(0.1)({"logits": logits}, labels, num_items_in_batch=num_items_in_batch)
    (ours_grad,) = torch.autograd.grad(ours, logits)
    theirs = LabelSmoother(epsilon=0.1)({"logits": logits}, labels, num_items_in_batch=num_items_in_batch)
    (theirs_grad,) = torch.autograd.grad(theirs, logits)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(ours_grad, theirs_grad)


def test_tokenize_pairs_drops_exactly_the_over_long_pairs(corpus, tokenizer):
    train = corpus["train"]
    everything = train.map(tokenize_pairs(tokenizer, "en", "fr"), batched=True, batch_size=64,
                           remove_columns=train.column_names)
    source_limit = sorted(len(ids) for ids in everything["input_ids"])[len(train) // 2]
    target_limit = sorted(len(ids) for ids in everything["labels"])[len(train) // 2]
    filtered = [(source, target) for source, target in zip(everything["input_ids"], everything["labels"])
                if len(source) <= source_limit and len(target) <= target_limit]
    assert 0 < len(filtered) < len(train)
    dropped_here = train.map(tokenize_pairs(tokenizer, "en", "fr", source_limit, target_limit), batched=True,
                             batch_size=64, remove_columns=train.column_names)
    assert dropped_here.column_names == ["input_ids", "labels"]
    assert list(zip(dropped_here["input_ids"], dropped_here["labels"])) == filtered

    # With the text kept, it stays aligned with the ids of the pairs kept.
    with_text = train.map(tokenize_pairs(tokenizer, "en", "fr", source_limit, target_limit, keep_translation=True),
                          batched=True, batch_size=64, remove_columns=train.column_names)
    assert len(with_text) == len(filtered)
    for row in with_text.select(range(0, len(with_text), 37)):
        assert row["input_ids"] == tokenizer(row["translation"]["en"])["input_ids"]
        assert row["labels"] == tokenizer(text_target=row["translation"]["fr"])["input_ids"]


def test_token_batch_trainer_computes_the_label_smoothed_loss_of_seq2seq_trainer(tokenizer, tokenized, tmp_path):
    model = small_model(tokenizer).eval()
    args = paper_training_arguments(str(tmp_path), d_model=64, warmup_steps=10, report_to=[])
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    batch = collator([tokenized["train"][i] for i in range(8)])
    ours = TokenBatchSeq2SeqTrainer(model=model, args=args, data_collator=collator, max_tokens=512)
    plain = Seq2SeqTrainer(model=model, args=args, data_collator=collator)
    assert ours.compute_loss_func is not None and plain.compute_loss_func is None
    batch = batch.to(model.device)  # the Trainer moved the model to the GPU where there is one
    with torch.no_grad():
        torch.testing.assert_close(ours.compute_loss(model, dict(batch)), plain.compute_loss(model, dict(batch)))


def test_trainer_batches_hold_at_most_max_tokens(tokenizer, tokenized, tmp_path):
    model = small_model(tokenizer)
    args = paper_training_arguments(str(tmp_path), d_model=64, warmup_steps=10, report_to=[])
    trainer = TokenBatchSeq2SeqTrainer(
        model=model, args=args, train_dataset=tokenized["train"], max_tokens=512,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
    )
    seen = 0
    for batch in trainer.get_train_dataloader():
        rows = batch["input_ids"].shape[0]
        assert rows * max(batch["input_ids"].shape[1], batch["labels"].shape[1]) <= 512
        seen += rows
    assert seen == len(tokenized["train"])


def test_trainer_batches_by_the_lengths_its_collator_pads_to(tokenizer, tokenized, tmp_path):
    """A collator that pads to multiples of 8: the budget counts the rounded lengths, and every epoch repeats the
    first epoch's batch shapes (bucketed shapes)."""
    model = small_model(tokenizer)
    args = paper_training_arguments(str(tmp_path), d_model=64, warmup_steps=10, report_to=[], use_cpu=True)
    trainer = TokenBatchSeq2SeqTrainer(
        model=model, args=args, train_dataset=tokenized["train"], max_tokens=256,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, pad_to_multiple_of=8),
    )
    loader = trainer.get_train_dataloader()
    sampler = getattr(loader.batch_sampler, "batch_sampler", loader.batch_sampler)
    assert sampler.pad_to_multiple_of == 8
    shapes = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        shapes.append(sorted((*batch["input_ids"].shape, batch["labels"].shape[1]) for batch in loader))
    assert shapes[0] == shapes[1] and len(set(shapes[0])) < len(shapes[0])
    for rows, source_length, target_length in shapes[0]:
        assert source_length % 8 == 0 and target_length % 8 == 0
        assert rows * max(source_length, target_length) <= 256


def test_bpe_dropout_trainer_sees_every_pair_once_an_epoch_in_a_new_segmentation(corpus, tokenizer, tmp_path):
    pairs = corpus["train"]["translation"]
    dataset = BPEDropoutDataset.from_translations(corpus["train"], "en", "fr", tokenizer, p=0.1, seed=5)
    model = small_model(tokenizer)
    args = paper_training_arguments(str(tmp_path), d_model=64, warmup_steps=10, report_to=[], seed=5)
    trainer = TokenBatchSeq2SeqTrainer(
        model=model, args=args, train_dataset=dataset, max_tokens=512,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
    )
    loader = trainer.get_train_dataloader()
    epochs = []
    for epoch in range(3):
        loader.set_epoch(epoch)  # as the Trainer does before each epoch
        batches = list(loader)
        assert len(batches) == len(loader)
        seen = {}
        for batch in batches:
            # The epoch's budget is searched for a fixed number of batches: it moves a little from max_tokens.
            assert batch["input_ids"].shape[0] * max(batch["input_ids"].shape[1], batch["labels"].shape[1]) <= 530
            for source, target in zip(batch["input_ids"].tolist(), batch["labels"].tolist()):
                source_text = tokenizer.decode(source, skip_special_tokens=True)
                seen[source_text] = (source, target)
        # Every pair once, its target with it, both sides decoding to the pair's text.
        assert sorted(seen) == sorted(pair["en"] for pair in pairs)
        by_source = {pair["en"]: pair["fr"] for pair in pairs}
        for source_text, (_, target) in seen.items():
            assert tokenizer.decode([i for i in target if i != -100], skip_special_tokens=True) == by_source[source_text]
        epochs.append(seen)
    plain = dict(zip((pair["en"] for pair in pairs), tokenizer([pair["en"] for pair in pairs])["input_ids"]))
    unpadded = lambda ids: [i for i in ids if i != tokenizer.pad_token_id]  # noqa: E731
    for seen in epochs:
        changed = sum(unpadded(source) != plain[text] for text, (source, _) in seen.items())
        assert 0.2 * len(pairs) < changed < len(pairs)  # dropout shows, and many pairs keep some merges
    assert any(unpadded(epochs[0][text][0]) != unpadded(epochs[1][text][0]) for text in epochs[0])


def test_bpe_dropout_on_the_sources_only_keeps_the_tokenizers_targets(corpus, tokenizer):
    pairs = corpus["train"]["translation"]
    plain = tokenizer([pair["en"] for pair in pairs], text_target=[pair["fr"] for pair in pairs])
    dataset = BPEDropoutDataset.from_translations(corpus["train"], "en", "fr", tokenizer, p=0.1, seed=5,
                                                  target_side=False)
    both_sides = BPEDropoutDataset.from_translations(corpus["train"], "en", "fr", tokenizer, p=0.1, seed=5)
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        both_sides.set_epoch(epoch)
        items = [dataset[i] for i in range(len(dataset))]
        assert [item["labels"] for item in items] == plain["labels"]
        assert sum(item["input_ids"] != ids for item, ids in zip(items, plain["input_ids"])) > 0.2 * len(pairs)
        assert [item["attention_mask"] for item in items] == [[1] * len(item["input_ids"]) for item in items]
        # The sources draw as they would with the targets: the targets take the draws after them.
        assert [item["input_ids"] for item in items] == [both_sides[i]["input_ids"] for i in range(len(dataset))]


# --- Training on the generated corpus, fine-tuning with plain transformers ---------------------------------------


@pytest.mark.slow  # 120 steps, over 10 s; learning shows in the fast tier in test_onnx.py's model (90% exact match)
def test_demo_corpus_trains_the_model_clearly_better_than_chance(tokenizer, tokenized, tmp_path):
    model = small_model(tokenizer, dropout=0.0)
    args = paper_training_arguments(
        str(tmp_path), d_model=64, warmup_steps=30, lr_scale=0.25, max_steps=120, report_to=[],
        save_strategy="no", disable_tqdm=True, per_device_eval_batch_size=64, predict_with_generate=False,
    )
    trainer = TokenBatchSeq2SeqTrainer(
        model=model, args=args, train_dataset=tokenized["train"], eval_dataset=tokenized["test"], max_tokens=1024,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
    )
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    chance = math.log(len(tokenizer))  # cross-entropy of a uniform guess
    assert before > 0.8 * chance
    assert after < 0.5 * chance, (before, after, chance)


def test_fine_tuning_a_saved_model_with_a_plain_seq2seq_trainer(tokenizer, tokenized, tmp_path):
    small_model(tokenizer).save_pretrained(tmp_path / "pretrained")
    tokenizer.save_pretrained(tmp_path / "pretrained")

    # What a user writes with transformers alone: no package-specific glue.
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "pretrained")
    user_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "pretrained")
    new_pairs = tokenized["validation"]
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / "finetuned"), learning_rate=3e-3, max_steps=40, per_device_train_batch_size=16,
        per_device_eval_batch_size=16, report_to=[], save_strategy="no", disable_tqdm=True,
    )
    trainer = Seq2SeqTrainer(
        model=model, args=args, train_dataset=new_pairs, eval_dataset=new_pairs,
        data_collator=DataCollatorForSeq2Seq(user_tokenizer, model=model), processing_class=user_tokenizer,
    )
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert after < before - 0.5, (before, after)

    trainer.save_model()
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "finetuned")
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[name], tensor.cpu(), msg=name)
    assert AutoTokenizer.from_pretrained(tmp_path / "finetuned").get_vocab() == user_tokenizer.get_vocab()


def test_predicting_leaves_the_generation_config_to_save_without_a_max_length(tokenizer, tokenized, tmp_path):
    """Seq2SeqTrainer fills the model's generation config with transformers' defaults when it predicts; saved, their
    `max_length` 20 made transformers warn at every `generate(max_new_tokens=...)` and pipeline call."""
    from transformers import pipeline
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    model = small_model(tokenizer)
    args = paper_training_arguments(str(tmp_path), d_model=64, report_to=[], disable_tqdm=True,
                                    generation_num_beams=1, generation_max_length=8, per_device_eval_batch_size=16)
    trainer = TokenBatchSeq2SeqTrainer(model=model, args=args, processing_class=tokenizer,
                                       data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))
    before = model.generation_config.to_diff_dict()
    trainer.predict(tokenized["validation"].select(range(4)))
    assert model.generation_config.to_diff_dict() == before
    trainer.save_model()
    saved = json.loads((tmp_path / "generation_config.json").read_text())
    assert not {"max_length", "min_length"} & set(saved)
    assert saved["num_beams"] == 4 and saved["max_length_over_source"] == 50
    translator = pipeline("translation", model=str(tmp_path))
    with CaptureLogger(logging.get_logger("transformers.generation.utils")) as captured:
        translator(["one", "two"], max_new_tokens=3)
        translator.model.generate(**tokenizer(["one"], return_tensors="pt"), max_new_tokens=3)
    assert "max_length" not in captured.out


def test_resuming_reports_a_missing_weight_but_not_the_tied_copies_of_the_shared_embedding(tokenizer, tmp_path):
    """A checkpoint's safetensors hold the shared embedding once: the Trainer's load, which
    `train(resume_from_checkpoint=...)` calls, would report its tied copies as missing keys."""
    from safetensors.torch import save_file
    from transformers.testing_utils import CaptureLogger, LoggingLevel
    from transformers.utils import logging

    saved_model = small_model(tokenizer)
    saved_model.save_pretrained(tmp_path / "checkpoint")
    weights = load_file(tmp_path / "checkpoint" / "model.safetensors")
    assert "model.shared.weight" in weights and "lm_head.weight" not in weights
    args = paper_training_arguments(str(tmp_path / "run"), d_model=64, report_to=[])
    trainer = TokenBatchSeq2SeqTrainer(model=small_model(tokenizer, seed=1), args=args, max_tokens=512)
    with LoggingLevel(logging.INFO), CaptureLogger(logging.get_logger("transformers.trainer")) as captured:
        trainer._load_from_checkpoint(str(tmp_path / "checkpoint"))
    assert "Loading model from" in captured.out and "missing keys" not in captured.out
    for copy in (trainer.model.lm_head, trainer.model.model.encoder.embed_tokens):
        torch.testing.assert_close(copy.weight, saved_model.model.shared.weight.to(copy.weight.device))

    del weights["model.encoder.layers.0.fc1.weight"]
    save_file(weights, tmp_path / "checkpoint" / "model.safetensors", metadata={"format": "pt"})
    with CaptureLogger(logging.get_logger("transformers.trainer")) as captured:
        trainer._load_from_checkpoint(str(tmp_path / "checkpoint"))
    assert ("There were missing keys in the checkpoint model loaded: ['model.encoder.layers.0.fc1.weight']"
            in captured.out)


# --- The command line: resume, DDP -------------------------------------------------------------------------------


def write_tsv(corpus, path):
    lines = [f"{pair['en']}\t{pair['fr']}" for pair in corpus["train"]["translation"]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def train_command(tmp_path, corpus, tokenizer_dir, output_dir, *extra):
    return [
        "train", "--train_file", str(write_tsv(corpus, tmp_path / "pairs.tsv")), "--source_lang", "en",
        "--target_lang", "fr", "--tokenizer_name", str(tokenizer_dir), "--preset", "tiny", "--dropout", "0.1",
        "--max_tokens", "256", "--warmup_steps", "4", "--output_dir", str(output_dir), "--report_to", "none",
        "--disable_tqdm", "true", "--logging_steps", "1", "--seed", "3", *extra,
    ]


def final_weights(folder):
    return load_file(Path(folder) / "model.safetensors")


@pytest.mark.slow  # three runs; the BPE-dropout resume and the killed runs below cover resuming in the fast tier
def test_resumed_run_ends_with_the_same_weights_as_an_uninterrupted_one(corpus, tokenizer_dir, tmp_path):
    from vanilla_transformer.cli.main import main

    main(train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "straight", "--max_steps", "6",
                       "--save_strategy", "no"))
    # The same run stopped after step 3, its checkpoint holding optimizer, scheduler and RNG states ...
    main(train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "interrupted", "--max_steps", "3",
                       "--save_steps", "3"))
    # ... and resumed from it, with no flag but the longer run: the model, tokenizer, data and recipe come from the
    # checkpoint and its run. The section 5.3 schedule does not depend on the total number of steps.
    main(["train", "--resume_from_checkpoint", str(tmp_path / "interrupted" / "checkpoint-3"), "--max_steps", "6",
          "--save_strategy", "no", "--disable_tqdm", "true"])
    straight, resumed = final_weights(tmp_path / "straight"), final_weights(tmp_path / "interrupted")
    for name, tensor in straight.items():
        torch.testing.assert_close(resumed[name], tensor, atol=1e-6, rtol=0, msg=name)


# A `train` command killed (SIGKILL, nothing cleaned up) at a named point: "step" at the start of optimizer step STEP;
# a file name, half of that file of checkpoint-STEP written; "mark", checkpoint-STEP written but not yet marked
# complete. "sigterm" sends SIGTERM instead, at the start of step STEP, as a cluster preempting the job does.
KILLED_TRAIN = r"""
import os, shutil, signal, sys, tempfile

import torch
import transformers.modeling_utils
from transformers import Trainer, TrainerState

import vanilla_transformer.training.checkpoints
from vanilla_transformer.cli.main import main

point, step, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
target = f"checkpoint-{step}{os.sep}{point}"


def kill():
    os.kill(os.getpid(), signal.SIGKILL)


def cut_short(write):
    # The file written whole elsewhere, then its first half where it belongs, and the process killed.
    def wrapped(obj, path, *args, **kwargs):
        if not str(path).endswith(target):
            return write(obj, path, *args, **kwargs)
        with tempfile.TemporaryDirectory() as folder:
            write(obj, os.path.join(folder, "whole"), *args, **kwargs)
            data = open(os.path.join(folder, "whole"), "rb").read()
        with open(path, "wb") as file:
            file.write(data[: len(data) // 2])
        kill()
    return wrapped


if point in ("step", "sigterm"):
    training_step = Trainer.training_step
    def step_or_kill(self, *args, **kwargs):
        if self.state.global_step + 1 == step:
            kill() if point == "step" else os.kill(os.getpid(), signal.SIGTERM)
        return training_step(self, *args, **kwargs)
    Trainer.training_step = step_or_kill
elif point == "mark":
    mark_complete = vanilla_transformer.training.checkpoints.mark_complete
    vanilla_transformer.training.checkpoints.mark_complete = lambda path: kill() if path.name == f"checkpoint-{step}" else (
        mark_complete(path))
else:
    transformers.modeling_utils.safe_save_file = cut_short(transformers.modeling_utils.safe_save_file)
    torch.save = cut_short(torch.save)
    save_to_json = TrainerState.save_to_json
    TrainerState.save_to_json = lambda self, path: cut_short(lambda state, path: save_to_json(state, path))(self, path)
main(argv)
"""


@pytest.fixture(scope="module")
def uninterrupted_run(corpus, tokenizer_dir, tmp_path_factory):
    """The final weights of a 6-step run, never interrupted."""
    from vanilla_transformer.cli.main import main

    folder = tmp_path_factory.mktemp("uninterrupted")
    main(train_command(folder, corpus, tokenizer_dir, folder / "run", "--max_steps", "6", "--save_strategy", "no"))
    return final_weights(folder / "run")


@pytest.mark.parametrize(
    ("point", "step", "continued_from"),
    [
        ("step", 5, "checkpoint-4"),
        ("model.safetensors", 4, "checkpoint-2"),
        # Each a process of its own (over 5 s), an unmarked checkpoint-4 as model.safetensors': in the slow tier.
        pytest.param("optimizer.pt", 4, "checkpoint-2", marks=pytest.mark.slow),
        pytest.param("trainer_state.json", 4, "checkpoint-2", marks=pytest.mark.slow),
        pytest.param("mark", 4, "checkpoint-2", marks=pytest.mark.slow),
        ("model.safetensors", 2, None),
    ],
)
def test_the_same_command_after_a_kill_continues_to_the_uninterrupted_runs_weights(
    point, step, continued_from, uninterrupted_run, corpus, tokenizer_dir, tmp_path, caplog
):
    from vanilla_transformer.training.checkpoints import COMPLETE
    from vanilla_transformer.cli.main import main

    argv = train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "run", "--max_steps", "6", "--save_steps", "2")
    killed = subprocess.run([sys.executable, "-c", KILLED_TRAIN, point, str(step), *argv], capture_output=True,
                            text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-3000:]
    interrupted = tmp_path / "run" / f"checkpoint-{step}"
    assert point == "step" or interrupted.is_dir() and not (interrupted / COMPLETE).exists()
    with caplog.at_level("INFO", logger="vanilla_transformer"):
        main(argv)  # the same command again
    if continued_from:
        assert (f"holds a run this command started and did not finish: continuing it from "
                f"{tmp_path / 'run' / continued_from}, its newest complete checkpoint") in caplog.text
    else:
        assert "holds a run stopped before its first complete checkpoint: it starts again" in caplog.text
    if point != "step":
        assert f"Removing {interrupted}, an incomplete checkpoint" in caplog.text
    resumed = final_weights(tmp_path / "run")
    for name, tensor in uninterrupted_run.items():
        torch.testing.assert_close(resumed[name], tensor, atol=1e-6, rtol=0, msg=name)
    for checkpoint in (tmp_path / "run").glob("checkpoint-*"):
        assert (checkpoint / COMPLETE).is_file()


@pytest.mark.slow  # a process of its own
def test_sigterm_saves_a_checkpoint_and_the_same_command_continues_to_the_uninterrupted_runs_weights(
    uninterrupted_run, corpus, tokenizer_dir, tmp_path, caplog, capsys
):
    from vanilla_transformer.cli.main import main

    run = tmp_path / "run"
    argv = train_command(tmp_path, corpus, tokenizer_dir, run, "--max_steps", "6", "--save_steps", "100")
    stopped = subprocess.run([sys.executable, "-c", KILLED_TRAIN, "sigterm", "3", *argv], capture_output=True,
                             text=True, timeout=600)
    assert stopped.returncode == 128 + 15, stopped.stderr[-3000:]
    assert stopped.stderr.splitlines()[-1] == (
        f"vanilla-transformer train: stopped by SIGTERM at step 3, with a checkpoint: {run / 'checkpoint-3'}; the same "
        "command continues the run")
    assert not (run / "model.safetensors").exists() and not (run / "trainer_state.json").exists()
    # Another recipe into the folder of the unfinished run is refused, not mixed into it.
    err = train_error([*argv, "--warmup_steps", "8"], capsys)
    assert err == ("vanilla-transformer train: error: --warmup-steps 8 contradicts the run this command continues "
                   f"(unfinished), trained with --warmup-steps 4 ({run / 'run_arguments.json'}); leave the flag out to "
                   "continue the run as it was, or pass --overwrite-output-dir to replace it")
    with caplog.at_level("INFO", logger="vanilla_transformer"):
        main(argv)
    assert f"continuing it from {run / 'checkpoint-3'}, its newest complete checkpoint (step 3)" in caplog.text
    resumed = final_weights(run)
    for name, tensor in uninterrupted_run.items():
        torch.testing.assert_close(resumed[name], tensor, atol=1e-6, rtol=0, msg=name)


def test_after_ctrl_c_overwrite_finished_run_continues_the_run_and_once_finished_replaces_it(
    uninterrupted_run, corpus, tokenizer_dir, tmp_path, caplog, capsys, monkeypatch
):
    """`make demo`'s flag: the same command continues a run that Ctrl-C stopped, and replaces the run once it
    finished. Resuming does not report the tied copies of the shared embedding as missing from the checkpoint."""
    from transformers.testing_utils import CaptureLogger, LoggingLevel
    from transformers.utils import logging

    from vanilla_transformer.cli.main import main
    from vanilla_transformer.hub.card_facts import RunRecord

    run = tmp_path / "run"
    argv = train_command(tmp_path, corpus, tokenizer_dir, run, "--max_steps", "6", "--save_steps", "2",
                         "--overwrite-finished-run")
    with ctrl_c_at_step(5), pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"vanilla-transformer train: interrupted after step 4; the newest complete checkpoint is "
        f"{run / 'checkpoint-4'}: the same command continues the run from it")

    trainer_log = logging.get_logger("transformers.trainer")
    with caplog.at_level("INFO", logger="vanilla_transformer"), LoggingLevel(logging.INFO), \
            CaptureLogger(trainer_log) as resumed_log:
        main(argv)
    assert f"continuing it from {run / 'checkpoint-4'}, its newest complete checkpoint (step 4)" in caplog.text
    assert "Loading model from" in resumed_log.out and "missing keys" not in resumed_log.out
    assert RunRecord.read(run).facts.sessions == 2
    for name, tensor in uninterrupted_run.items():
        torch.testing.assert_close(final_weights(run)[name], tensor, atol=1e-6, rtol=0, msg=name)

    caplog.clear()
    with caplog.at_level("INFO", logger="vanilla_transformer"):
        main(argv)
    assert f"{run} holds a finished run: --overwrite-finished-run replaces it with a new one" in caplog.text
    assert "continuing" not in caplog.text and RunRecord.read(run).facts.sessions == 1


def test_the_way_to_continue_a_stopped_run_is_the_same_command_unless_it_replaces_or_goes_back(tmp_path):
    from vanilla_transformer.train_run.resume import how_to_continue

    run, checkpoint = tmp_path / "run", str(tmp_path / "run" / "checkpoint-4")
    for argv in (["--output-dir", str(run)], ["--resume-from-checkpoint", "auto", "--output-dir", str(run)],
                 ["--resume-from-checkpoint", str(run)], ["--output-dir", str(run), "--overwrite-finished-run"]):
        assert how_to_continue(argv, run) == "the same command continues the run"
    assert how_to_continue(["--output-dir", str(run), "--overwrite-output-dir"], run) == (
        "the same command without --overwrite-output-dir continues the run")
    assert how_to_continue(["--resume-from-checkpoint", checkpoint], run) == (
        f"the same command with --resume-from-checkpoint {run} in place of {checkpoint} continues the run")


@pytest.mark.slow  # the installed command in a process of its own, over 5 s; Ctrl-C's line in the fast tier above
@pytest.mark.skipif(not Path(sys.executable).with_name("vanilla-transformer").exists(),
                    reason="the console script is not installed next to this Python")
def test_ctrl_c_stops_the_installed_command_at_once_in_one_line_naming_how_to_continue(corpus, tokenizer_dir,
                                                                                      tmp_path):
    """SIGINT, which Ctrl-C sends, to `vanilla-transformer train` once it saved a checkpoint: exit status 130 and
    one line naming the newest complete checkpoint, the one the same command continues from."""
    import re
    import signal
    import time

    from vanilla_transformer.training.checkpoints import COMPLETE
    from vanilla_transformer.train_run.resume import resolve_resume

    run = tmp_path / "run"
    argv = train_command(tmp_path, corpus, tokenizer_dir, run, "--max_steps", "10000", "--save_steps", "2")
    command = Path(sys.executable).with_name("vanilla-transformer")
    with open(tmp_path / "stderr", "w+", encoding="utf-8") as stderr:
        training = subprocess.Popen([str(command), *argv], stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + 300
        checkpoint_2 = run / "checkpoint-2" / COMPLETE
        while not checkpoint_2.exists() and training.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        training.send_signal(signal.SIGINT)
        try:
            training.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pass  # the assertion below shows what it printed
        finally:
            training.kill()
        stderr.seek(0)
        err = stderr.read()
    assert training.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    stopped = re.fullmatch(
        rf"vanilla-transformer train: interrupted after step (\d+); the newest complete checkpoint is "
        rf"{re.escape(str(run / 'checkpoint-'))}(\d+): the same command continues the run from it",
        err.splitlines()[-1])
    assert stopped and 2 <= int(stopped[2]) <= int(stopped[1]), err.splitlines()[-1]
    assert resolve_resume(argv[1:])[0][-2:] == ["--resume_from_checkpoint", str(run / f"checkpoint-{stopped[2]}")]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the interrupt the finalizer drops
def test_a_ctrl_c_dropped_inside_a_finalizer_still_stops_training_at_the_end_of_the_step():
    import signal
    from types import SimpleNamespace

    from vanilla_transformer.train_run.callbacks import TrainingProgress

    progress = TrainingProgress()
    progress.on_step_end(None, SimpleNamespace(global_step=1), None)  # no interrupt: the step ends as any
    with progress.handling():
        assert signal.getsignal(signal.SIGINT) == progress.interrupt

        class Finalized:
            def __del__(self):  # Python prints an exception raised here and drops it
                progress.interrupt(signal.SIGINT, None)

        Finalized()  # collected at once: the KeyboardInterrupt is lost, not the request
        with pytest.raises(KeyboardInterrupt):
            progress.on_step_end(None, SimpleNamespace(global_step=2), None)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert progress.step == 2


def test_a_full_disk_stops_train_in_one_line_and_the_same_command_continues(
    uninterrupted_run, corpus, tokenizer_dir, tmp_path, capsys, monkeypatch
):
    import shutil
    from collections import namedtuple

    from vanilla_transformer.cli.main import main

    run = tmp_path / "run"
    argv = train_command(tmp_path, corpus, tokenizer_dir, run, "--max_steps", "6", "--save_steps", "2")
    save = torch.save

    def full_disk(obj, path, *args, **kwargs):
        # checkpoint-4's optimizer state: half of it written, then torch's writer fails as on a full disk.
        if not str(path).endswith(f"checkpoint-4{os.sep}optimizer.pt"):
            return save(obj, path, *args, **kwargs)
        Path(path).write_bytes(b"PK" * 1000)
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0")

    usage = namedtuple("usage", "total used free")
    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", full_disk)
        patch.setattr(shutil, "disk_usage", lambda path: usage(2**30, 2**30, 0))
        err = train_error(argv, capsys)
    needed = sum(path.stat().st_size for path in (run / "checkpoint-2").iterdir())
    assert err == (f"vanilla-transformer train: error: cannot write in {run}: no space left on its device (0.0 MiB "
                   f"free, {needed / 2**20:,.1f} MiB needed); {run / 'checkpoint-2'} is the newest complete "
                   "checkpoint: free space and run the same command to continue")
    assert sorted(path.name for path in run.glob("checkpoint-*")) == ["checkpoint-2"]  # the cut one deleted
    main(argv)  # space freed: the same command continues
    resumed = final_weights(run)
    for name, tensor in uninterrupted_run.items():
        torch.testing.assert_close(resumed[name], tensor, atol=1e-6, rtol=0, msg=name)


def test_resume_refuses_an_incomplete_checkpoint_or_one_without_its_training_state(corpus, tokenizer_dir, tmp_path,
                                                                                  capsys, caplog):
    from vanilla_transformer.training.checkpoints import mark_complete
    from vanilla_transformer.cli.main import main

    run = tmp_path / "run"
    main(train_command(tmp_path, corpus, tokenizer_dir, run, "--max_steps", "4", "--save_steps", "2"))
    weights = run / "checkpoint-4" / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[:1000])
    err = train_error(["train", "--resume-from-checkpoint", str(run / "checkpoint-4")], capsys)
    assert err == (f"vanilla-transformer train: error: --resume-from-checkpoint {run / 'checkpoint-4'} is incomplete "
                   f"(model.safetensors holds 1,000 bytes, not the {size:,} written); resume from "
                   f"{run / 'checkpoint-2'}, the newest complete one")
    # A complete checkpoint written without the optimizer and generator states (as --save-only-model writes them).
    for name in ("optimizer.pt", "rng_state.pth"):
        (run / "checkpoint-2" / name).unlink()
    mark_complete(run / "checkpoint-2")
    err = train_error(["train", "--resume-from-checkpoint", str(run)], capsys)  # the run folder: its newest
    assert err == (f"vanilla-transformer train: error: --resume-from-checkpoint {run / 'checkpoint-2'} has no "
                   "optimizer state and random generator states: the resumed run would not match an uninterrupted "
                   "one; pass --resume-weights-only to go on with what it holds")
    with caplog.at_level("INFO", logger="vanilla_transformer"):
        main(["train", "--resume-from-checkpoint", "auto", "--output-dir", str(run), "--resume-weights-only",
              "--max_steps", "3", "--disable_tqdm", "true"])
    assert (f"resuming from {run / 'checkpoint-2'}, the newest complete checkpoint of {run} (step 2)") in caplog.text
    assert (f"Resuming from {run / 'checkpoint-2'} without its optimizer state and random generator states "
            "(--resume-weights-only): the run will not match an uninterrupted one") in caplog.text
    assert f"Removing {run / 'checkpoint-4'}, an incomplete checkpoint" in caplog.text
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 3


def test_the_trainer_writes_trainer_state_json_last_in_a_checkpoint(corpus, tokenizer_dir, tmp_path, monkeypatch):
    """What judging an unmarked checkpoint by its trainer_state.json relies on (checkpoints.checkpoint_problem)."""
    from transformers import TrainerState

    from vanilla_transformer.training.checkpoints import COMPLETE
    from vanilla_transformer.cli.main import main
    from vanilla_transformer.train_run.callbacks import TrainingClock

    present = {}
    save_to_json = TrainerState.save_to_json

    def record(state, path):
        present[path] = sorted(path.name for path in Path(path).parent.iterdir())
        save_to_json(state, path)

    monkeypatch.setattr(TrainerState, "save_to_json", record)
    run = tmp_path / "run"
    main(train_command(tmp_path, corpus, tokenizer_dir, run, "--max_steps", "2", "--save_steps", "2"))
    checkpoint = run / "checkpoint-2"
    # Left out: what the package's own callbacks write after the Trainer's save (the training clock, the marker).
    ours = ("trainer_state.json", COMPLETE, TrainingClock.TRAINING_TIME_FILE)
    written = sorted(path.name for path in checkpoint.iterdir() if path.name not in ours)
    assert present[str(checkpoint / "trainer_state.json")] == written


@pytest.mark.slow  # a process of its own
def test_one_train_command_per_output_folder_until_the_holder_dies(corpus, tokenizer_dir, tmp_path, capsys):
    import socket

    from vanilla_transformer.cli.main import main

    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom vanilla_transformer.train_run.run_lock import run_lock\n"
         "with run_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(600)", str(run)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        err = train_error(train_command(tmp_path, corpus, tokenizer_dir, run, "--max_steps", "1"), capsys)
        assert err.startswith(f"vanilla-transformer train: error: {run} is in use by another train command (process "
                              f"{holder.pid} on {socket.gethostname()}, since ")
        assert err.endswith("); wait for it to end, or choose another --output-dir")
        assert sorted(path.name for path in run.iterdir()) == [".train.lock"]  # nothing else written
    finally:
        holder.kill()
        holder.wait()
    # The holder killed, its lock is gone with it: the folder is free.
    main(train_command(tmp_path, corpus, tokenizer_dir, run, "--max_steps", "1", "--save_strategy", "no"))
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 1


def test_the_card_of_a_resumed_run_reports_its_data_languages_whole_training_time_and_hardware(
        corpus, tokenizer_dir, tmp_path):
    """run_arguments.json records the data (file names with their pairs), the hardware and, across resumes, the steps
    and training time; `model-card` on the folder reports them without a results file or TensorBoard logs."""
    from vanilla_transformer.cli.main import main
    from vanilla_transformer.hub.card import model_card

    run = tmp_path / "run"
    main(train_command(tmp_path, corpus, tokenizer_dir, run, "--max_steps", "2", "--save_steps", "2"))
    first = json.loads((run / "run_arguments.json").read_text())["run"]
    assert first["pairs"] == {"train": 600} and first["steps"] == 2 and first["sessions"] == 1
    assert first["hardware"] == [training_hardware()]
    first_seconds = first["training_seconds"]
    assert json.loads((run / "checkpoint-2" / "training_time.json").read_text())["seconds"] <= first_seconds
    main(["train", "--resume_from_checkpoint", str(run / "checkpoint-2"), "--max_steps", "4", "--save_steps", "2",
          "--disable_tqdm", "true"])
    recorded = json.loads((run / "run_arguments.json").read_text())
    assert recorded["max_steps"] == 4 and recorded["run"]["steps"] == 4 and recorded["run"]["sessions"] == 2
    session = json.loads((run / "train_results.json").read_text())["train_runtime"]
    assert recorded["run"]["training_seconds"] > first_seconds > 0 and session < recorded["run"]["training_seconds"]
    card = model_card(run).text
    assert "Data: `pairs.tsv` (600 sentence pairs), en -> fr, for training." in card
    assert "not recorded" not in card
    seconds = recorded["run"]["training_seconds"]
    duration = f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"
    assert f"| training time | {duration}, 2 sessions (resumed) |" in card
    assert f"| hardware | {training_hardware()} |" in card
    assert "| steps | 4 (" in card and "| optimizer (5.3) | Adam, beta1 0.9, beta2 0.98, eps 1e-09" in card


def training_hardware() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"CPU, {cores} cores"


def test_a_resumed_run_refuses_flags_that_contradict_the_run_and_its_checkpoint(corpus, tokenizer_dir, tmp_path,
                                                                              capsys):
    from vanilla_transformer.cli.main import main

    run = tmp_path / "run"
    main(train_command(tmp_path, corpus, tokenizer_dir, run, "--max_steps", "1", "--save_steps", "1"))
    checkpoint = str(run / "checkpoint-1")
    err = train_error(["train", "--resume-from-checkpoint", checkpoint, "--warmup-steps", "8"], capsys)
    assert err == (f"vanilla-transformer train: error: --warmup-steps 8 contradicts the run --resume-from-checkpoint "
                   f"continues, trained with --warmup-steps 4 ({run / 'run_arguments.json'}); leave the flag out to "
                   "continue the run as it was")
    assert "--preset base contradicts" in train_error(["train", "--resume-from-checkpoint", checkpoint, "--preset",
                                                       "base"], capsys)
    # A run that recorded no arguments (an older release's): the checkpoint's config.json still decides the model.
    (run / "run_arguments.json").unlink()
    err = train_error(train_command(tmp_path, corpus, tokenizer_dir, run, "--d-model", "64",
                                    "--resume-from-checkpoint", checkpoint), capsys)
    assert err == (f"vanilla-transformer train: error: --d-model 64 contradicts the checkpoint's model: "
                   f"{run / 'checkpoint-1' / 'config.json'} has d_model 32; leave the flag out to resume the run")
    assert sorted(path.name for path in run.glob("checkpoint-*")) == ["checkpoint-1"]


def test_time_budget_stops_with_a_checkpoint_and_the_same_weights_as_a_run_planned_that_short(
    corpus, tokenizer_dir, tmp_path
):
    from vanilla_transformer.cli.main import main

    # A budget spent by the end of the first step: the run stops there, writes checkpoint-1 although it planned
    # 6 steps and no checkpoint, and (the schedule not depending on max_steps) equals a run planned for 1 step.
    main(train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "cut", "--max_steps", "6", "--save_steps", "100",
                       "--max_train_minutes", "1e-9"))
    assert json.loads((tmp_path / "cut" / "trainer_state.json").read_text())["global_step"] == 1
    main(train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "planned", "--max_steps", "1",
                       "--save_strategy", "no"))
    checkpoint = final_weights(tmp_path / "cut" / "checkpoint-1")
    for name, tensor in final_weights(tmp_path / "planned").items():
        assert torch.equal(checkpoint[name], tensor), name
    # A budget that is not spent leaves the run as planned.
    main(train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "untouched", "--max_steps", "3",
                       "--save_strategy", "no", "--max_train_minutes", "60"))
    assert json.loads((tmp_path / "untouched" / "trainer_state.json").read_text())["global_step"] == 3


def test_bpe_dropout_run_resumed_mid_epoch_ends_with_the_weights_of_an_uninterrupted_one(corpus, tokenizer_dir, tmp_path):
    from vanilla_transformer.cli.main import main

    # ~2,048-token batches: about 7 an epoch, so the 8 steps cross an epoch boundary after the resumption at step 3.
    run = lambda name, *extra: main(train_command(  # noqa: E731
        tmp_path, corpus, tokenizer_dir, tmp_path / name, "--max_tokens", "2048", "--bpe_dropout", "0.1", *extra))
    run("straight", "--max_steps", "8", "--save_strategy", "no")
    state = json.loads((tmp_path / "straight" / "trainer_state.json").read_text())
    assert 1 < state["epoch"] < 2
    run("interrupted", "--max_steps", "3", "--save_steps", "3")
    run("interrupted", "--max_steps", "8", "--save_strategy", "no", "--resume_from_checkpoint",
        str(tmp_path / "interrupted" / "checkpoint-3"))
    straight, resumed = final_weights(tmp_path / "straight"), final_weights(tmp_path / "interrupted")
    for name, tensor in straight.items():
        torch.testing.assert_close(resumed[name], tensor, atol=1e-6, rtol=0, msg=name)
    # The option is not a no-op: without BPE-dropout the same run ends elsewhere.
    main(train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "plain", "--max_tokens", "2048", "--max_steps", "8",
                       "--save_strategy", "no"))
    plain = final_weights(tmp_path / "plain")
    assert not all(torch.equal(plain[name], tensor) for name, tensor in straight.items())


def test_bpe_dropout_needs_token_batches(corpus, tokenizer_dir, tmp_path, capsys):
    from vanilla_transformer.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "run", "--bpe_dropout", "0.1",
                           "--max_tokens", "0", "--max_steps", "1"))
    assert exit_info.value.code == 2 and "--bpe-dropout needs token batches" in capsys.readouterr().err


@pytest.mark.parametrize("minutes", [0, -5.0, float("nan")])
def test_time_budget_refuses_a_budget_that_is_not_a_positive_number_of_minutes(minutes):
    with pytest.raises(ValueError, match="training time budget must be a positive number of minutes"):
        TrainingTimeBudget(minutes)


@pytest.mark.slow
def test_two_process_ddp_equals_one_process_seeing_the_same_global_batches(corpus, tokenizer_dir, tmp_path):
    """torchrun --nproc_per_node 2 (gloo on CPU): each process takes every other token batch. One process with 2
    accumulation steps sees the same global batches, and the Trainer normalises both by the global token count."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    common = ["--max_steps", "4", "--save_strategy", "no", "--dropout", "0.0"]
    # --standalone: torchrun's own rendezvous on a port the OS picks, so no other process can take it in between.
    ddp = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "vanilla_transformer.cli",
           *train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "ddp", *common)]
    result = subprocess.run(ddp, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]

    from vanilla_transformer.cli.main import main

    main(train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "single", *common,
                       "--gradient_accumulation_steps", "2"))
    state = json.loads((tmp_path / "ddp" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    ddp_weights, single_weights = final_weights(tmp_path / "ddp"), final_weights(tmp_path / "single")
    # Every weight, the attention projections bias-free as in section 3.2.2 (a key bias's true gradient is exactly
    # zero, so Adam would turn the two runs' different round-off into full-size steps there).
    assert not any(name.endswith("_proj.bias") for name in single_weights)
    for name, tensor in single_weights.items():
        torch.testing.assert_close(ddp_weights[name], tensor, atol=1e-5, rtol=0, msg=name)
    # Training moved the weights: the comparison is not between two untouched initialisations.
    initial = small_model_like(tmp_path / "single")
    assert all((initial[name] - tensor).abs().max() > 1e-3 for name, tensor in single_weights.items()
               if name.endswith("q_proj.weight"))


@pytest.mark.slow
def test_two_process_run_killed_with_sigterm_resumes_to_the_uninterrupted_runs_weights(corpus, tokenizer_dir, tmp_path):
    """torchrun --nproc_per_node 2 (gloo on CPU), dropout on: SIGTERM to torchrun once a checkpoint in the middle of
    an epoch is complete, then the same command. Each process resumes its own random generators and the epoch's
    batch order, so every later checkpoint and the final weights equal those of the run never interrupted."""
    import signal
    import time

    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}

    def command(name):  # ~1,024-token batches: 5 optimizer steps an epoch over 2 processes
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "-m", "vanilla_transformer.cli",
                *train_command(tmp_path, corpus, tokenizer_dir, tmp_path / name, "--max_tokens", "1024",
                               "--max_steps", "14", "--save_steps", "6")]

    result = subprocess.run(command("straight"), env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    state = json.loads((tmp_path / "straight" / "trainer_state.json").read_text())
    assert state["global_step"] == 14 and 2 < state["epoch"] < 3  # checkpoints 6 and 12 fall inside epochs
    killed = subprocess.Popen(command("killed"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    mark = tmp_path / "killed" / "checkpoint-6" / "checkpoint_complete.json"
    deadline = time.monotonic() + 600
    while not mark.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    killed.send_signal(signal.SIGTERM)
    killed.wait(timeout=120)
    assert not (tmp_path / "killed" / "trainer_state.json").exists()  # stopped before the end
    result = subprocess.run(command("killed"), env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "did not finish: continuing it from" in result.stderr
    for folder in ("checkpoint-12", "."):
        straight, resumed = (final_weights(tmp_path / run / folder) for run in ("straight", "killed"))
        for name, tensor in straight.items():
            assert torch.equal(resumed[name], tensor), f"{folder}: {name}"


def small_model_like(folder):
    """The initial weights of the runs above: the command seeds with --seed 3 before building the model."""
    torch.manual_seed(3)
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_pretrained(folder))
    return model.state_dict()


def test_command_trains_in_bf16_on_cpu_with_the_attention_kernel_asked_for(
    corpus, tokenizer_dir, tmp_path, monkeypatch
):
    """The Multi30k cpu recipe's precision and kernel: --bf16 --use_cpu autocasts the products to bfloat16 (losses
    close to float32's, yet not equal to them), and --attn_implementation reaches the new model and a saved one. On a
    CPU the command keeps the memory a step frees for the next (cpu_training.py, `keep_memory`)."""
    from vanilla_transformer.train_run import build as train
    from vanilla_transformer.train_run.run import main

    kept = []
    monkeypatch.setattr(train, "keep_freed_memory", lambda: kept.append(True) or True)

    def losses(trainer):
        return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]

    steps = ("--max_steps", "4", "--save_strategy", "no")
    fp32 = main(train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "fp32", *steps)[1:])
    bf16 = main(train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "bf16", *steps, "--bf16", "true",
                              "--use_cpu", "true", "--attn_implementation", "eager")[1:])
    assert fp32.model.config._attn_implementation == "sdpa"  # transformers' default
    assert bf16.model.config._attn_implementation == "eager"
    assert len(losses(bf16)) == 4 and losses(bf16) != losses(fp32)
    assert losses(bf16) == pytest.approx(losses(fp32), rel=0.02)
    # Fine-tuning a saved model: the kernel is a loading option, as in from_pretrained.
    tuned = main(train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "tuned", "--max_steps", "1",
                               "--save_strategy", "no", "--model_name_or_path", str(tmp_path / "fp32"),
                               "--attn_implementation", "eager")[1:])
    assert tuned.model.config._attn_implementation == "eager"
    assert len(kept) == 3  # once per run


def test_command_defaults_are_the_papers_recipe_and_the_demo_without_data():
    from vanilla_transformer.cli.train import parse_arguments

    model_args, data_args, recipe_args, args, profile = parse_arguments([])
    assert profile.demo and args.output_dir == "outputs/number-words-en-fr" and model_args.d_model == 128
    assert (args.lr_scheduler_type, args.adam_beta2, args.adam_epsilon, args.label_smoothing_factor) == (
        "inverse_sqrt", 0.98, 1e-9, 0.1)
    _, _, _, args, profile = parse_arguments(["--train_file", "pairs.tsv", "--output_dir", "out", "--bf16", "false"])
    assert not profile.demo and args.warmup_steps == 4000 and args.max_steps == -1
    with pytest.raises(UserError, match="--output-dir is required"):  # own data needs an output folder
        parse_arguments(["--train_file", "pairs.tsv"])


def test_command_defaults_depend_on_the_device_and_flags_given_win(monkeypatch):
    """On a CPU: exact lengths, no compilation, batches collated in the training process. On a CUDA GPU: bucketed
    shapes, a compiled model, two persistent dataloader workers. Fused Adam on both."""
    from vanilla_transformer.train_run import parsing as train

    own_data = ["--train_file", "pairs.tsv", "--output_dir", "out"]
    trains_on_gpu = train.trains_on_gpu

    def settings(argv):
        _, data_args, _, args, _ = train.parse_arguments([*own_data, *argv])
        return (data_args.pad_to_multiple_of, args.torch_compile, args.dataloader_num_workers,
                args.dataloader_persistent_workers, args.optim)

    monkeypatch.setattr(train, "trains_on_gpu", lambda argv, use_cpu: False)
    assert settings([]) == (1, False, 0, False, "adamw_torch_fused")
    monkeypatch.setattr(train, "trains_on_gpu", lambda argv, use_cpu: True)
    assert settings([]) == (8, True, 2, True, "adamw_torch_fused")
    assert settings(["--pad-to-multiple-of", "1", "--torch_compile", "false", "--dataloader_num_workers", "0"])[:3] == (
        1, False, 0)

    # The device: a CUDA GPU where one is available, unless --use-cpu says otherwise.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert trains_on_gpu([], use_cpu=False) and trains_on_gpu(["--use_cpu", "false"], use_cpu=True)
    assert not trains_on_gpu(["--use-cpu"], use_cpu=False)
    assert not trains_on_gpu(["--bf16", "--use_cpu=true"], use_cpu=False)
    assert not trains_on_gpu([], use_cpu=True)  # the demo's default without a GPU, say
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not trains_on_gpu(["--use_cpu", "false"], use_cpu=False)


def test_command_logs_the_model_in_one_short_line_and_no_pin_memory_warning_on_a_cpu(
        corpus, tokenizer_dir, tmp_path, caplog):
    """The model's sizes, parameters and vocabulary in one line, not the whole config; on a machine without an
    accelerator no loader pins memory, so evaluations do not warn."""
    import logging
    import warnings

    from vanilla_transformer.cli.main import main

    if torch.cuda.is_available():
        pytest.skip("pinned memory applies where CUDA is")
    with caplog.at_level(logging.INFO, logger="vanilla_transformer"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "run", "--max_steps", "2", "--save_strategy",
                           "no", "--validation_file", str(tmp_path / "pairs.tsv"), "--max_eval_samples", "4",
                           "--eval_strategy", "steps", "--eval_steps", "1", "--generation_max_length", "4"))
    (line,) = [record.getMessage() for record in caplog.records if record.getMessage().startswith("model: ")]
    assert line.startswith("model: N=2, d_model=32, h=4, d_ff=64, P_drop=0.1, ") and line.endswith(
        f"parameters, vocabulary {len(AutoTokenizer.from_pretrained(tokenizer_dir)):,}")
    assert len(line) < 120
    assert not [warning for warning in caught if "pin_memory" in str(warning.message)]


def test_command_loads_validation_and_test_splits_from_files(corpus, tmp_path):
    from vanilla_transformer.train_run.build import load_data
    from vanilla_transformer.train_run.parsing import parse_arguments

    pairs = write_tsv(corpus, tmp_path / "pairs.tsv")
    sources, targets = tmp_path / "test.en", tmp_path / "test.fr"
    sources.write_text("one\ntwo\n", encoding="utf-8")
    targets.write_text("un\ndeux\n", encoding="utf-8")
    _, data_args, _, args, profile = parse_arguments([
        "--train_file", str(pairs), "--validation_file", str(pairs), "--test_source_file", str(sources),
        "--test_target_file", str(targets), "--target_lang", "fr", "--output_dir", str(tmp_path / "out"),
    ])
    splits = load_data(data_args, profile, args.seed)
    assert sorted(splits) == ["test", "train", "validation"]
    assert len(splits["train"]) == len(splits["validation"]) == 600
    assert splits["test"]["translation"] == [{"en": "one", "fr": "un"}, {"en": "two", "fr": "deux"}]


@pytest.mark.parametrize("with_generate", [True, False])
def test_validation_logs_bleu_with_generate_and_only_its_loss_without(
    with_generate, corpus, tokenizer_dir, tmp_path, capsys
):
    from vanilla_transformer.cli.main import main

    sources, targets = tmp_path / "test.en", tmp_path / "test.fr"
    sources.write_text("one\n", encoding="utf-8")
    targets.write_text("un\n", encoding="utf-8")
    out = tmp_path / "run"
    main(train_command(tmp_path, corpus, tokenizer_dir, out, "--max_steps", "2", "--save_strategy", "no",
                       "--validation_file", str(tmp_path / "pairs.tsv"), "--max_eval_samples", "8",
                       "--eval_strategy", "steps", "--eval_steps", "2", "--test_source_file", str(sources),
                       "--test_target_file", str(targets), "--generation_num_beams", "1",
                       "--generation_max_length", "6", "--predict_with_generate", str(with_generate).lower()))
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    (validation,) = [entry for entry in history if "eval_loss" in entry]
    assert validation["step"] == 2 and math.isfinite(validation["eval_loss"])
    assert ("eval_bleu" in validation) == with_generate
    # Test files are translated and scored either way: --predict-with-generate is about validation. The score is
    # sacreBLEU's on the translation the report prints.
    (hypothesis,) = re.findall(r"^      -> (.*)$", capsys.readouterr().out, flags=re.MULTILINE)
    expected = sacrebleu.corpus_bleu([hypothesis], [["un"]]).score
    assert json.loads((out / "test_results.json").read_text())["test_bleu"] == pytest.approx(expected, abs=1e-4)
    assert (out / "card_results.json").exists() and (out / "README.md").exists()


def test_validation_decodes_greedily_and_the_test_with_the_models_generation_config(tokenizer, tokenized, tmp_path):
    """By default of the command: validation BLEU greedy and at most source + 20 tokens (VALIDATION_DECODING), the test
    set with section 6.1's beam 4 up to source + 50 (the model's generation config)."""
    from vanilla_transformer.training.trainer import VALIDATION_DECODING

    model = small_model(tokenizer)
    calls = []
    generate = model.generate
    model.generate = lambda *args, **kwargs: calls.append(kwargs) or generate(*args, **kwargs)
    args = paper_training_arguments(str(tmp_path), d_model=64, report_to=[], disable_tqdm=True,
                                    per_device_eval_batch_size=16)
    trainer = TokenBatchSeq2SeqTrainer(model=model, args=args, processing_class=tokenizer,
                                       data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
                                       compute_metrics=translation_metrics(tokenizer),
                                       validation_decoding=VALIDATION_DECODING)
    pairs = tokenized["validation"].select(range(2))
    trainer.evaluate(pairs)
    assert calls[-1]["num_beams"] == 1 and calls[-1]["max_length_over_source"] == 20
    trainer.predict(pairs)
    assert "num_beams" not in calls[-1] and "max_length_over_source" not in calls[-1]  # the generation config's
    trainer.args.generation_num_beams = 2  # --generation-num-beams sets both
    trainer.evaluate(pairs)
    assert calls[-1]["num_beams"] == 2 and calls[-1]["max_length_over_source"] == 20


def test_command_reports_test_results_and_writes_a_model_card(corpus, tokenizer_dir, tmp_path):
    from huggingface_hub import ModelCard
    from transformers import pipeline

    from vanilla_transformer.cli.main import main

    sources, targets = tmp_path / "test.en", tmp_path / "test.fr"
    test_pairs = corpus["test"]["translation"][:6]
    sources.write_text("".join(pair["en"] + "\n" for pair in test_pairs), encoding="utf-8")
    targets.write_text("".join(pair["fr"] + "\n" for pair in test_pairs), encoding="utf-8")
    out = tmp_path / "run"
    main(train_command(tmp_path, corpus, tokenizer_dir, out, "--max_steps", "2", "--save_strategy", "no",
                       "--test_source_file", str(sources), "--test_target_file", str(targets),
                       "--generation_num_beams", "1", "--generation_max_length", "12"))
    results = json.loads((out / "test_results.json").read_text())
    assert results["test_bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert results["test_chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0")
    card = ModelCard.load(out / "README.md")
    assert card.data.pipeline_tag == "translation" and card.data.language == ["en", "fr"]
    (bleu,) = [r for r in card.data.eval_results if r.metric_type == "bleu"]
    assert bleu.metric_value == pytest.approx(results["test_bleu"], abs=0.01)
    assert test_pairs[0]["en"] in card.text  # the first sample translation is shown
    assert pipeline("translation_en_to_fr", model=str(out))(test_pairs[0]["en"], max_new_tokens=3)


# --- The command line: an output folder holding a run ----------------------------------------------------------------


def old_run(folder: Path) -> Path:
    """A folder that holds a run: a checkpoint, its tokenizer, TensorBoard logs, results and a model card."""
    for name in ("checkpoint-7/trainer_state.json", "tokenizer/tokenizer.json", "runs/events.out", "train_results.json",
                 "README.md"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("the old run's")
    return folder


def train_error(argv, capsys) -> str:
    """The one line `main(argv)` prints on standard error when it stops with exit status 2."""
    from vanilla_transformer.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.splitlines()[-1]


def test_a_run_is_refused_unless_overwritten_or_resumed(corpus, tokenizer_dir, tmp_path, capsys):
    out = old_run(tmp_path / "out")
    err = train_error(train_command(tmp_path, corpus, tokenizer_dir, out, "--max-steps", "1"), capsys)
    assert err == (f"vanilla-transformer train: error: --output-dir {out} holds a run (checkpoint-7); pass "
                   "--overwrite-output-dir to replace it, --resume-from-checkpoint to continue it, or choose another "
                   "folder")
    err = train_error(train_command(tmp_path, corpus, tokenizer_dir, out, "--resume-from-checkpoint",
                                    str(out / "checkpoint-9")), capsys)
    assert err == f"vanilla-transformer train: error: --resume-from-checkpoint {out / 'checkpoint-9'}: no such folder"
    err = train_error(train_command(tmp_path, corpus, tokenizer_dir, out, "--overwrite-output-dir",
                                    "--resume-from-checkpoint", str(out / "checkpoint-7")), capsys)
    assert "--overwrite-output-dir would delete the run --resume-from-checkpoint continues" in err
    assert all((out / name).exists() for name in ("checkpoint-7", "tokenizer", "runs", "train_results.json"))


def test_every_flag_is_checked_before_the_old_run_or_its_tokenizer_is_touched(corpus, tmp_path, capsys):
    out = old_run(tmp_path / "out")
    # No --tokenizer-name: a new tokenizer would be trained into out/tokenizer.
    argv = ["train", "--train-file", str(write_tsv(corpus, tmp_path / "pairs.tsv")), "--output-dir", str(out),
            "--overwrite-output-dir", "--report-to", "none", "--max-steps", "1"]
    err = train_error([*argv, "--preset", "huge"], capsys)
    assert err == "vanilla-transformer train: error: Unknown preset 'huge'; choose one of ['base', 'big', 'tiny']."
    assert "is not supported" in train_error([*argv, "--preset", "tiny", "--attn-implementation", "fast"], capsys)
    assert "needs validation data" in train_error([*argv, "--preset", "tiny", "--eval-strategy", "steps"], capsys)
    assert "--max-sentences must be positive" in train_error([*argv, "--preset", "tiny", "--max-sentences", "0"], capsys)
    # A vocabulary smaller than the byte alphabet and the special tokens, and step counts that mean nothing.
    assert train_error([*argv, "--preset", "tiny", "--vocab-size", "5"], capsys) == (
        "vanilla-transformer train: error: --vocab-size 5 is too small: the byte alphabet (256) and the special tokens "
        "need 260, and merges come on top")
    for steps in ("-5", "0"):
        assert f"--max-steps must be a positive number of steps (or -1: --num-train-epochs decides), got {steps}" in (
            train_error([*argv[:-2], "--preset", "tiny", "--max-steps", steps], capsys))
    # Checkpoints to average that the run will not save.
    assert train_error([*argv, "--preset", "tiny", "--average-last", "3", "--save-steps", "1"], capsys) == (
        "vanilla-transformer train: error: --average-last 3 needs as many checkpoints, but --max-steps 1 with "
        "--save-steps 1 saves 1")
    assert (out / "tokenizer" / "tokenizer.json").read_text() == "the old run's"
    assert (out / "checkpoint-7").is_dir()


def test_flags_are_checked_before_the_data_is_loaded(tmp_path, capsys, monkeypatch):
    import vanilla_transformer.train_run.run as train

    def load_data(*args, **kwargs):
        pytest.fail("the data was loaded before the flags were checked")

    monkeypatch.setattr(train, "load_data", load_data)
    err = train_error(["train", "--max-tokens", "-3", "--output-dir", str(tmp_path / "out")], capsys)
    assert err.endswith("--max-tokens must be positive (or 0: batches of sentences), got -3")
    assert not (tmp_path / "out").exists()


def test_the_demos_corpus_sizes_are_named_by_their_flags(tmp_path, capsys):
    err = train_error(["train", "--demo-train-size", "2000", "--output-dir", str(tmp_path / "out")], capsys)
    assert err == ("vanilla-transformer train: error: --demo-train-size 2000 with --demo-max-digits 6: 2,000 training "
                   "pairs are fewer than the 11,200 pairs of numbers below 1,000")


def test_resuming_from_a_run_folder_without_a_complete_checkpoint_names_the_incomplete_ones(tmp_path, capsys):
    run = old_run(tmp_path / "run")  # its checkpoint-7's trainer_state.json is not JSON
    for name in ("trainer_state.json", "config.json"):  # a trained run's folder holds them too
        (run / name).write_text("{}")
    err = train_error(["train", "--resume-from-checkpoint", str(run)], capsys)
    assert err == (f"vanilla-transformer train: error: --resume-from-checkpoint {run} holds no complete "
                   "checkpoint-<step> folder (incomplete: checkpoint-7)")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run"]  # nothing written beside it


def test_a_bad_data_line_is_one_line_without_a_traceback(corpus, tokenizer_dir, tmp_path, capsys):
    pairs = tmp_path / "bad.tsv"
    pairs.write_text("one\tun\ntwo deux\n", encoding="utf-8")
    argv = train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "out")
    argv[argv.index("--train_file") + 1] = str(pairs)
    assert train_error(argv, capsys) == f"vanilla-transformer train: error: {pairs}, line 2: expected one tab, found 0"
    assert not (tmp_path / "out").exists()


def test_overwrite_output_dir_replaces_the_old_run(corpus, tokenizer_dir, tmp_path):
    from vanilla_transformer.cli.main import main

    out = old_run(tmp_path / "out")
    main(train_command(tmp_path, corpus, tokenizer_dir, out, "--max_steps", "1", "--save_steps", "1",
                       "--overwrite_output_dir"))  # transformers 4's spelling
    assert sorted(path.name for path in out.glob("checkpoint-*")) == ["checkpoint-1"]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 1
    assert not (out / "runs").exists() and (out / "train_results.json").read_text() != "the old run's"
    assert (out / "README.md").read_text() == "the old run's"  # not a file of the run: kept


def test_patience_stops_after_that_many_validations_without_a_lower_loss(corpus, tokenizer_dir, tmp_path):
    from vanilla_transformer.cli.main import main

    validation = tmp_path / "validation.tsv"
    validation.write_text("".join(f"{pair['en']}\t{pair['fr']}\n" for pair in corpus["validation"]["translation"]))
    # A rate far too high: the validation loss soon stops falling.
    main(train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "run", "--max_steps", "60", "--save_steps", "1",
                       "--validation_file", str(validation), "--eval_strategy", "steps", "--eval_steps", "1",
                       "--learning_rate", "1.0", "--patience", "2"))
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    losses = [entry["eval_loss"] for entry in state["log_history"] if "eval_loss" in entry]
    assert state["global_step"] < 60 and len(losses) == state["global_step"]
    # Stopped at the second validation in a row no lower than the best before it, and not earlier.
    assert min(losses[-2:]) >= min(losses[:-2])
    streaks = [all(loss >= min(losses[:k]) for loss in losses[k:k + 2]) for k in range(1, len(losses) - 2)]
    assert not any(streaks)
    assert state["stateful_callbacks"]["Patience"]["attributes"]["early_stopping_patience_counter"] == 2


@pytest.mark.parametrize("flags, message", [
    (["--patience", "3"], "--patience counts validations without a better loss: it needs a positive number and "
                          "validation (--eval-strategy steps or epoch), got 3 and --eval-strategy no"),
    (["--patience", "0", "--eval_strategy", "steps"], "got 0 and --eval-strategy steps"),
])
def test_patience_needs_validation(flags, message, corpus, tokenizer_dir, tmp_path, capsys):
    from vanilla_transformer.cli.main import main

    with pytest.raises(SystemExit) as exit:
        main(train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "run", *flags))
    assert exit.value.code == 2 and message in capsys.readouterr().err


# --- What stops a run: a diverging loss, changed data, an output folder that cannot be written ------------------------


def run_train(how: str, argv: list[str], capsys) -> tuple[int, str]:
    """The exit status and standard error of `train` run `how`: "console script", the installed command in a process of
    its own (skipped where it is not installed beside this Python), or "main", the same entry point in this process
    (a few seconds where the process takes tens, importing torch and transformers on 2 busy cores)."""
    from vanilla_transformer.cli.main import main

    if how == "main":
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        return exit_info.value.code, capsys.readouterr().err
    command = Path(sys.executable).with_name("vanilla-transformer")
    if not command.exists():
        pytest.skip("the console script is not installed next to this Python")
    result = subprocess.run([str(command), *argv], capture_output=True, text=True, timeout=600)
    return result.returncode, result.stderr


BOTH_WAYS = pytest.mark.parametrize("how", ["main", pytest.param("console script", marks=pytest.mark.slow)])


@BOTH_WAYS
def test_a_diverging_run_stops_in_one_line_naming_the_step_and_its_last_finite_checkpoint(how, corpus, tokenizer_dir,
                                                                                         tmp_path, capsys):
    """A rate of 1e6 makes the loss NaN from step 3: the command stops there (exit status 3), names the step and
    checkpoint-2, and leaves no checkpoint or model of non-finite weights."""
    from vanilla_transformer.training.checkpoints import COMPLETE

    run = tmp_path / "run"
    argv = train_command(tmp_path, corpus, tokenizer_dir, run, "--max_steps", "8", "--save_steps", "2",
                         "--learning_rate", "1e6", "--warmup_steps", "1")
    status, err = run_train(how, argv, capsys)
    assert status == 3, err[-3000:]
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (
        "vanilla-transformer train: error: training diverged and stopped at step 3: the training loss logged at step 3 "
        f"is nan (finite when last logged, at step 2); {run / 'checkpoint-2'} is the newest checkpoint, with finite "
        "weights")
    assert sorted(path.name for path in run.glob("checkpoint-*")) == ["checkpoint-2"]
    assert (run / "checkpoint-2" / COMPLETE).is_file() and not (run / "model.safetensors").exists()
    assert all(tensor.isfinite().all() for tensor in final_weights(run / "checkpoint-2").values())


def test_between_logs_the_weights_are_checked_before_each_checkpoint(corpus, tokenizer_dir, tmp_path, capsys):
    """Logging every 50 steps, the loss is not read before step 50; the weights are, before each checkpoint: the one
    due at step 3, after the first update from a NaN loss, is not written, and the run stops there."""
    from vanilla_transformer.training.checkpoints import COMPLETE

    run = tmp_path / "run"
    argv = train_command(tmp_path, corpus, tokenizer_dir, run, "--max_steps", "8", "--save_steps", "1",
                         "--learning_rate", "1e6", "--warmup_steps", "1", "--logging_steps", "50")
    status, err = run_train("main", argv, capsys)
    assert status == 3 and err.splitlines()[-1] == (
        "vanilla-transformer train: error: training diverged and stopped at step 3: the weights are not finite at "
        f"step 3; {run / 'checkpoint-2'} is the newest checkpoint, with finite weights")
    assert sorted(path.name for path in run.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert all((run / name / COMPLETE).is_file() for name in ("checkpoint-1", "checkpoint-2"))


@BOTH_WAYS
def test_a_resume_over_changed_training_data_is_refused_unless_asked_for(how, corpus, tokenizer_dir, tmp_path, capsys,
                                                                        caplog):
    """The run records each training file's size, lines and first MiB; resuming after the file grew is refused in
    one line naming it (`how`: the command that refuses), --resume-on-changed-data continues (and records the data it
    now trains on), and a run recorded before fingerprints were (no `data_fingerprints`) resumes as it did."""
    from vanilla_transformer.cli.main import main

    run = tmp_path / "run"
    main(train_command(tmp_path, corpus, tokenizer_dir, run, "--max_steps", "4", "--save_steps", "2"))
    pairs, record = tmp_path / "pairs.tsv", run / "run_arguments.json"
    assert json.loads(record.read_text())["data_fingerprints"][str(pairs)]["lines"] == 600
    with pairs.open("a", encoding="utf-8") as file:
        file.write("".join(f"{pair['en']}\t{pair['fr']}\n" for pair in corpus["train"]["translation"][:40]))
    recorded = record.read_text()
    resume = ["train", "--resume_from_checkpoint", str(run / "checkpoint-2"), "--max_steps", "6", "--disable_tqdm",
              "true"]
    status, err = run_train(how, resume, capsys)
    assert status == 2 and err.splitlines()[-1] == (
        f"vanilla-transformer train: error: {pairs} changed since the run trained on it (600 -> 640 lines): exact "
        "resume is impossible on other data; pass --resume-on-changed-data to continue anyway")
    assert record.read_text() == recorded  # nothing written

    with caplog.at_level("WARNING", logger="vanilla_transformer"):
        main([*resume, "--resume-on-changed-data"])
    assert f"{pairs} changed since the run trained on it (600 -> 640 lines): --resume-on-changed-data" in caplog.text
    assert json.loads(record.read_text())["data_fingerprints"][str(pairs)]["lines"] == 640
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 6

    # A record without fingerprints, as runs trained before them have: resumed as before, the data unchecked.
    pairs.write_text(pairs.read_text(encoding="utf-8") * 2, encoding="utf-8")
    record.write_text(json.dumps({name: value for name, value in json.loads(recorded).items()
                                  if name != "data_fingerprints"}))
    main(["train", "--resume_from_checkpoint", str(run / "checkpoint-6"), "--max_steps", "7", "--save_steps", "7",
          "--disable_tqdm", "true"])
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 7


def read_only_command(folder: Path, command: list[str]) -> list[str]:
    """`command` run where `folder` cannot be written. Not root: `folder` made 0o555. Root, whom permission bits do
    not stop: `folder` bind-mounted read-only over itself in a mount namespace of the command's own (`unshare -m`;
    the mount goes when the command ends); the test is skipped where that is not allowed."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return command
    make_read_only = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" || exit 97; shift; exec "$@"'
    wrapped = ["unshare", "--mount", "sh", "-c", make_read_only, "sh", str(folder)]
    probe = subprocess.run([*wrapped, "sh", "-c", f"! touch {folder}/probe 2>/dev/null"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no read-only bind mount here (unshare and mount: {probe.stderr.decode()[-200:]!r})")
    return [*wrapped, *command]


@pytest.mark.slow  # a process of its own
@BOTH_WAYS
def test_an_output_folder_that_cannot_be_written_is_one_line_before_any_work(how, corpus, tokenizer_dir, tmp_path,
                                                                              capsys, monkeypatch):
    """`train --output-dir ro/run` with ro/ read-only: one line naming the folder, status 2, nothing written. The
    console script meets a real read-only folder (`read_only_command`); in this process, ro/ is 0o555 and os.access
    answers for it as it answers any user but root, whom permission bits do not stop."""
    import vanilla_transformer.train_run.output_folder as output_folder

    read_only = tmp_path / "ro"
    read_only.mkdir()
    argv = train_command(tmp_path, corpus, tokenizer_dir, read_only / "run", "--max_steps", "2")
    if how == "main":
        read_only.chmod(0o555)
        access = os.access
        monkeypatch.setattr(output_folder.os, "access", lambda path, mode: Path(path) != read_only and access(
            path, mode))
        status, err = run_train(how, argv, capsys)
        why = "is not writable (permission denied)"
    else:
        command = read_only_command(read_only, [str(Path(sys.executable).with_name("vanilla-transformer")), *argv])
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        status, err = result.returncode, result.stderr
        why = "is not writable (permission denied)" if os.geteuid() else "is on a read-only file system"
    assert status == 2 and "Traceback" not in err, err[-3000:]
    assert err.splitlines()[-1] == (
        f"vanilla-transformer train: error: --output-dir {read_only / 'run'} cannot be written: {read_only} {why}")
    assert list(read_only.iterdir()) == []


def test_a_write_the_output_folder_refuses_after_the_checks_is_one_line(corpus, tokenizer_dir, tmp_path, capsys,
                                                                        monkeypatch):
    """A folder that passes the check but refuses the first write (a network file system's rules, a mount made
    read-only since): simulated by making the output folder's creation fail with EROFS, as a read-only mount does."""
    import errno
    import pathlib

    run = tmp_path / "run"
    mkdir = pathlib.Path.mkdir

    def read_only_mkdir(self, *args, **kwargs):
        if self == run:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", read_only_mkdir)
    status, err = run_train("main", train_command(tmp_path, corpus, tokenizer_dir, run, "--max_steps", "2"), capsys)
    assert status == 2 and err.splitlines()[-1] == (
        f"vanilla-transformer train: error: --output-dir {run} cannot be written: {run}: read-only file system")


@pytest.mark.slow  # the console script
def test_a_full_datasets_cache_is_one_line_naming_the_cache(corpus, tokenizer_dir, tmp_path):
    """HF_DATASETS_CACHE on a full disk (a 8 KiB tmpfs in a mount namespace of the command's own): one line naming
    the cache folder and its free space, not the run's folder or a bare errno."""
    cache = tmp_path / "cache"
    cache.mkdir()
    argv = train_command(tmp_path, corpus, tokenizer_dir, tmp_path / "run", "--max_steps", "2")
    mount_tmpfs = 'mount -t tmpfs -o size=8k tmpfs "$1" || exit 97; shift; exec "$@"'
    command = ["unshare", "--mount", "sh", "-c", mount_tmpfs, "sh", str(cache),
               str(Path(sys.executable).with_name("vanilla-transformer")), *argv]
    if os.geteuid() != 0 or subprocess.run(command[:7] + ["true"], capture_output=True).returncode != 0:
        pytest.skip("no tmpfs mount in a mount namespace here (unshare and mount need root)")
    result = subprocess.run(command, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "HF_DATASETS_CACHE": str(cache)})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.splitlines()[-1] == (
        f"vanilla-transformer train: error: cannot write in {cache}: no space left on its device (0.0 MiB free)")
