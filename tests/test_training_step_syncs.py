"""The training step waits for the device only on the steps that log: the package's code reads no tensor back to the
host (`.item()`, `int()`, `float()`, `bool()`, `.tolist()`, `.cpu()`, `.numpy()`) on any other step of the `train`
command's Trainer. Token ids are checked on the CPU where batches are collated instead, and the collation can run in
worker processes."""

import sys
from pathlib import Path

import pytest
import torch
from transformers import DataCollatorForSeq2Seq, TrainerCallback

import vanilla_transformer
import vanilla_transformer.train_run.build as train_build
import vanilla_transformer.train_run.run as train_command
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.training.cpu_speedups import CPU_SPEEDUPS, CPUSeq2SeqTrainer
from vanilla_transformer.training.trainer import (
    BPEDropoutDataset,
    TokenBatchSeq2SeqTrainer,
    TokenIdCheckingCollator,
    paper_training_arguments,
)


PACKAGE = str(Path(vanilla_transformer.__file__).resolve().parent)
# Tensor methods that read a tensor's values on the host: on a GPU each waits for all the work queued before it.
HOST_READS = ("item", "__int__", "__float__", "__bool__", "tolist", "cpu", "numpy")


@pytest.fixture(scope="module")
def tokenized(tokenized):
    """Here only the training split of conftest's `tokenized`: these tests train on one dataset."""
    return tokenized["train"]


class HostReads:
    """Records every call of a `HOST_READS` method made from the package's own files, with the phase of training it
    happened in: ("step", k) from the start of step k to its end, ("after", k) from there to the next step's start
    (step k's logging and saving, the next batch's loading)."""

    def __init__(self, monkeypatch):
        self.phase = ("setup", 0)
        self.calls = []
        for name in HOST_READS:
            monkeypatch.setattr(torch.Tensor, name, self._recording(name, getattr(torch.Tensor, name)))

    def _recording(self, name, method):
        def recorded(tensor, *args, **kwargs):
            caller = sys._getframe(1)
            # A torch function mode (the 16-bit dropout's) passes every call on: the caller was recorded already.
            if caller.f_code.co_filename.startswith(PACKAGE) and caller.f_code.co_name != "__torch_function__":
                where = f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno}"
                self.calls.append((self.phase, f"{name} in {where}"))
            return method(tensor, *args, **kwargs)

        return recorded

    def callback(self):
        reads = self

        class Phases(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                reads.phase = ("step", state.global_step + 1)

            def on_step_end(self, args, state, control, **kwargs):
                reads.phase = ("after", state.global_step)

            def on_train_end(self, args, state, control, **kwargs):
                reads.phase = ("end", state.global_step)

        return Phases()


def test_the_train_commands_steps_read_nothing_back_from_the_device_except_to_log(
    corpus, tokenizer_dir, tmp_path, monkeypatch
):
    """The Multi30k cpu recipe's settings (bf16 autocast, eager attention, attention and ReLU dropout, the 16-bit
    dropout kernel, the time budget's callback), a tiny model, logging every 3 steps."""
    reads = HostReads(monkeypatch)

    class ObservedTrainer(CPUSeq2SeqTrainer):
        def __init__(self, *args, callbacks=None, **kwargs):
            super().__init__(*args, callbacks=[*(callbacks or []), reads.callback()], **kwargs)

    monkeypatch.setattr(train_build, "CPUSeq2SeqTrainer", ObservedTrainer)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{p['en']}\t{p['fr']}\n" for p in corpus["train"]["translation"]), encoding="utf-8")
    trainer = train_command.main([
        "--train_file", str(pairs), "--source_lang", "en", "--target_lang", "fr", "--tokenizer_name",
        str(tokenizer_dir), "--preset", "tiny", "--max_tokens", "256", "--warmup_steps", "4", "--max_steps", "7",
        "--logging_steps", "3", "--max_train_minutes", "60", "--save_strategy", "no", "--predict_with_generate",
        "false", "--bf16", "true", "--use_cpu", "true", "--attn_implementation", "eager", "--attention_dropout", "0.1",
        "--activation_dropout", "0.1", "--output_dir", str(tmp_path / "run"), "--report_to", "none",
        "--disable_tqdm", "true",
    ])
    assert trainer.state.global_step == 7 and isinstance(trainer, ObservedTrainer)
    assert trainer.speedups == CPU_SPEEDUPS  # every CPU speed-up, the 16-bit dropout kernel included
    assert [entry["step"] for entry in trainer.state.log_history if "loss" in entry] == [3, 6]
    logging_steps = {3, 6}
    in_steps = [(phase, call) for phase, call in reads.calls if phase[0] in ("step", "after")]
    assert not sorted({call for phase, call in in_steps if phase[1] not in logging_steps})

    # The same instruments see generate()'s token-id check, which reads the ids once a call.
    reads.phase = ("inference", 0)
    trainer.model.eval().generate(input_ids=torch.tensor([[5, 6, 2]]), max_new_tokens=2)
    inference = [call for phase, call in reads.calls if phase[0] == "inference"]
    assert any("generation_vanilla_transformer.py" in call for call in inference)


# --- Token ids, checked on the CPU --------------------------------------------------------------------------------


def tiny_model(tokenizer):
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=len(tokenizer), dropout=0.0)
    return VanillaTransformerForConditionalGeneration(config)


@pytest.mark.parametrize(
    "name, ids, bad",
    [("input_ids", [5, 300], 300), ("input_ids", [-1, 5], -1), ("labels", [5, 301, -100], 301),
     ("labels", [-100, -7], -7), ("decoder_input_ids", [1, 999], 999)],
)
def test_the_collator_refuses_token_ids_outside_the_vocabulary_naming_the_id(name, ids, bad):
    collated = []
    collator = TokenIdCheckingCollator(collated.append, vocab_size=300)
    good = {"input_ids": [4, 5, 2], "labels": [6, 2, -100]}
    with pytest.raises(ValueError, match=rf"`{name}` of a training example contains token id {bad}, outside the "
                                         r"model's vocabulary \[0, 300\)"):
        collator([good, {**good, name: ids}])
    assert not collated
    collator([good, {"input_ids": torch.tensor([299, 0]), "labels": [-100, -100]}])  # arrays and ignored labels pass
    assert len(collated) == 1


@pytest.mark.parametrize("max_tokens", [256, None])
def test_training_batches_of_another_vocabulary_are_refused_before_the_model_sees_them(
    tokenizer, tokenized, tmp_path, max_tokens
):
    """Token batches and the Trainer's own batches of sentences: both collate through the check."""
    small = VanillaTransformerForConditionalGeneration(
        VanillaTransformerConfig.from_preset("tiny", vocab_size=100, dropout=0.0)
    )
    args = paper_training_arguments(str(tmp_path), d_model=32, warmup_steps=4, max_steps=2, report_to=[],
                                    save_strategy="no", use_cpu=True, per_device_train_batch_size=8)
    trainer = TokenBatchSeq2SeqTrainer(model=small, args=args, train_dataset=tokenized, max_tokens=max_tokens,
                                       data_collator=DataCollatorForSeq2Seq(tokenizer, model=small))
    with pytest.raises(ValueError, match=r"contains token id \d+, outside the model's vocabulary \[0, 100\)"):
        trainer.train()


# --- Batches collated off the training loop -----------------------------------------------------------------------


def training_loader(tokenizer, dataset, tmp_path, **loading):
    args = paper_training_arguments(str(tmp_path), d_model=32, warmup_steps=4, report_to=[], use_cpu=True, **loading)
    model = tiny_model(tokenizer)
    trainer = TokenBatchSeq2SeqTrainer(model=model, args=args, train_dataset=dataset, max_tokens=256,
                                       data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))
    return trainer.get_train_dataloader()


def epoch_batches(loader, epoch: int) -> list[dict]:
    """The batches of `epoch`, the epoch set as the Trainer sets it."""
    loader.set_epoch(epoch)
    sampler = getattr(loader.batch_sampler, "batch_sampler", loader.batch_sampler)
    sampler.set_epoch(epoch)
    return [{name: tensor.clone() for name, tensor in batch.items()} for batch in loader]


def assert_same_batches(batches, expected):
    assert len(batches) == len(expected) > 1
    for batch, expected_batch in zip(batches, expected):
        assert batch.keys() == expected_batch.keys()
        for name in expected_batch:
            torch.testing.assert_close(batch[name], expected_batch[name], rtol=0, atol=0)


def test_token_batches_collated_in_worker_processes_are_the_main_processes_batches(tokenizer, tokenized, tmp_path):
    """`dataloader_num_workers`, `dataloader_persistent_workers` and `dataloader_prefetch_factor` reach the loader;
    memory is pinned only for an accelerator."""
    loader = training_loader(tokenizer, tokenized, tmp_path, dataloader_num_workers=2,
                             dataloader_persistent_workers=True, dataloader_prefetch_factor=3)
    assert (loader.num_workers, loader.persistent_workers, loader.prefetch_factor, loader.pin_memory) == (2, True, 3,
                                                                                                        False)
    assert_same_batches(epoch_batches(loader, 0), epoch_batches(training_loader(tokenizer, tokenized, tmp_path), 0))


def test_bpe_dropout_batches_collated_in_workers_follow_each_epochs_segmentation(corpus, tokenizer, tmp_path):
    """The segmentation of an epoch lives in the dataset: its workers start anew every epoch, persistent or not."""
    def dataset():
        return BPEDropoutDataset.from_translations(corpus["train"], "en", "fr", tokenizer, p=0.1, seed=5)

    in_workers = training_loader(tokenizer, dataset(), tmp_path, dataloader_num_workers=2,
                                 dataloader_persistent_workers=True)
    in_main = training_loader(tokenizer, dataset(), tmp_path)
    assert not in_workers.persistent_workers
    for epoch in (0, 1):
        assert_same_batches(epoch_batches(in_workers, epoch), epoch_batches(in_main, epoch))
