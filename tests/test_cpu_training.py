"""The train command's CPU speed-ups (cpu_training.py): each computes what it replaces (the 16-bit dropout's rate,
scale, gradient and independence; the chunked loss against torch's; malloc's reuse of freed memory), and none of them
changes the model, its config or its saved folder."""

import json
import os
import platform
import subprocess
import sys

import pytest
import torch
from transformers import DataCollatorForSeq2Seq

import vanilla_transformer.training.cpu_speedups as cpu_training
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.training.cpu_speedups import (
    CPU16BitDropout,
    CPUSeq2SeqTrainer,
    ChunkedLabelSmoothedCrossEntropy,
    cpu_16bit_dropout,
)
from vanilla_transformer.training.trainer import paper_training_arguments

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")


def small_model(tokenizer, seed=0):
    torch.manual_seed(seed)
    config = VanillaTransformerConfig.from_preset(
        "tiny", vocab_size=len(tokenizer), d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128
    )
    return VanillaTransformerForConditionalGeneration(config)


# --- dropout16 ------------------------------------------------------------------------------------------------------

# The CPU kernel draws 16 random bits per element, four elements per 64-bit draw, and keeps an element by the low 15.

DROPOUT_ELEMENTS = 400_003  # not a multiple of 4: the last draw is only partly used


def dropout_mask(p, seed=0):
    torch.manual_seed(seed)
    return cpu_16bit_dropout(torch.ones(DROPOUT_ELEMENTS), p) != 0


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_cpu_dropout_drops_each_element_with_probability_p_and_keeps_the_expectation(p):
    x = torch.ones(DROPOUT_ELEMENTS, requires_grad=True)
    y = cpu_16bit_dropout(x, p)
    kept = y.detach() != 0
    # 6 standard deviations of a binomial: a wrong rate fails, chance does not (p is rounded to 1/32,768).
    tolerance = 6 * (p * (1 - p) / DROPOUT_ELEMENTS) ** 0.5
    assert abs((1 - kept.double().mean().item()) - p) < tolerance
    # Each of the four 16-bit parts of a 64-bit draw drops at rate p (a sign bit that is never set would not).
    for offset in range(4):
        assert abs((1 - kept[offset::4].double().mean().item()) - p) < 2 * tolerance
    scale = 32768 / (32768 - round(p * 32768))
    # The scale of the rounded p (32,768 / 29,491 for 0.1, not 1 / 0.9), exactly.
    torch.testing.assert_close(y.detach()[kept], torch.full((int(kept.sum()),), scale), rtol=0, atol=0)
    assert abs(y.detach().double().mean().item() - 1) < tolerance / (1 - p)
    y.sum().backward()  # the gradient goes through the kept elements only, with the same scale
    torch.testing.assert_close(x.grad, torch.where(kept, scale, 0.0), rtol=0, atol=0)


def test_cpu_dropout_masks_are_independent_and_follow_the_seed():
    p = 0.3
    first, second = dropout_mask(p), dropout_mask(p)
    assert torch.equal(first, second)  # same seed, same mask: runs are reproducible
    torch.manual_seed(0)
    x = torch.ones(DROPOUT_ELEMENTS)
    one_call, next_call = cpu_16bit_dropout(x, p) != 0, cpu_16bit_dropout(x, p) != 0
    tolerance = 6 * (p * (1 - p) / DROPOUT_ELEMENTS) ** 0.5
    # Independent elements: neighbours (within a 64-bit draw and across draws) and the next call's mask are both
    # dropped with probability p^2.
    draws = one_call[: DROPOUT_ELEMENTS // 4 * 4].view(-1, 4)  # one row per 64-bit draw
    for left, right in [(one_call[:-1], one_call[1:]), (draws[:-1, 3], draws[1:, 0]), (one_call, next_call)]:
        assert abs((~left & ~right).double().mean().item() - p * p) < tolerance
    assert not torch.equal(dropout_mask(p, seed=1), first)


def count_kernel_calls(monkeypatch):
    calls = []
    kernel = cpu_training.cpu_16bit_dropout
    monkeypatch.setattr(cpu_training, "cpu_16bit_dropout", lambda x, p: calls.append(p) or kernel(x, p))
    return calls


def test_the_mode_sends_every_dropout_site_of_the_model_in_training_to_the_16_bit_kernel(monkeypatch):
    calls = count_kernel_calls(monkeypatch)
    config = VanillaTransformerConfig.from_preset("tiny", attention_dropout=0.1, activation_dropout=0.2)
    config._attn_implementation = "eager"  # the eager kernel applies attention dropout with torch's function
    model = VanillaTransformerForConditionalGeneration(config).train()
    inputs = dict(input_ids=torch.tensor([[5, 6, 7, 2]]), decoder_input_ids=torch.tensor([[1, 9, 10]]))
    model(**inputs)
    assert calls == []  # outside the mode: torch's dropout
    with CPU16BitDropout():
        model(**inputs)
        model.eval()(**inputs)  # no dropout in eval mode
    # 2 embeddings; per encoder layer 2 residuals + attention + ReLU; per decoder layer 3 residuals + 2 attentions + ReLU
    assert sorted(calls) == sorted([0.1] * (2 + 2 * 2 + 2 * 3) + [0.1] * (2 * 1 + 2 * 2) + [0.2] * (2 + 2))


def test_the_mode_leaves_other_dropout_calls_to_torch(monkeypatch):
    calls = count_kernel_calls(monkeypatch)
    x = torch.ones(1000)
    with CPU16BitDropout():
        assert torch.nn.functional.dropout(x, p=0.1, training=False) is x
        torch.nn.functional.dropout(x, p=0.0, training=True)
        torch.nn.functional.dropout(x.clone(), p=0.1, training=True, inplace=True)
        y = torch.nn.functional.dropout(x, 0.5)  # positional p, training by default
    assert calls == [0.5]
    assert set(y.unique().tolist()) <= {0.0, 2.0}


def test_cpu_dropout_keeps_dtype_and_shape():
    x = torch.randn(3, 5, 7, dtype=torch.bfloat16)
    y = cpu_16bit_dropout(x, 0.1)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    kept = y != 0
    torch.testing.assert_close(y[kept], (x * (32768 / (32768 - 3277)))[kept], rtol=0, atol=0)


# --- chunked_loss ---------------------------------------------------------------------------------------------------


def ignored_rows_labels(rows: int, vocab_size: int) -> torch.Tensor:
    labels = torch.randint(0, vocab_size, (rows,))
    labels[::5] = -100
    labels[-1] = vocab_size - 1  # the last class, at the last row
    return labels


def test_chunked_loss_equals_torch_cross_entropy_across_chunk_boundaries(monkeypatch):
    """Value and gradient against torch's own label-smoothed cross-entropy (float64), with chunks of 4 rows of which
    the last is partial, ignored rows, and an upstream gradient other than 1."""
    monkeypatch.setattr(cpu_training, "LOSS_CHUNK_ELEMENTS", 4 * 11)
    torch.manual_seed(0)
    logits = (3 * torch.randn(23, 11, dtype=torch.float64)).requires_grad_()
    labels = ignored_rows_labels(23, 11)
    ours = ChunkedLabelSmoothedCrossEntropy.apply(logits, labels, 0.1, -100)
    (ours_grad,) = torch.autograd.grad(2.5 * ours, logits)
    theirs = torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=0.1, reduction="sum")
    (theirs_grad,) = torch.autograd.grad(2.5 * theirs, logits)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(ours_grad, theirs_grad)
    assert ours_grad[::5].abs().sum() == 0  # ignored rows get no gradient
    assert torch.autograd.gradcheck(
        lambda x: ChunkedLabelSmoothedCrossEntropy.apply(x, labels, 0.1, -100), (logits.detach().requires_grad_(),)
    )


def test_chunked_loss_on_bfloat16_logits_is_autocasts_float32_loss_with_a_bfloat16_gradient():
    torch.manual_seed(0)
    logits = (4 * torch.randn(70, 300)).to(torch.bfloat16)
    labels = ignored_rows_labels(70, 300)
    ours_input, float32_input = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ours = ChunkedLabelSmoothedCrossEntropy.apply(ours_input, labels, 0.1, -100)
    ours.backward()
    theirs = torch.nn.functional.cross_entropy(
        float32_input.float(), labels, ignore_index=-100, label_smoothing=0.1, reduction="sum"
    )
    theirs.backward()
    assert ours.dtype == torch.float32 and ours_input.grad.dtype == torch.bfloat16
    torch.testing.assert_close(ours, theirs)
    # The same float32 gradient rounded once to bfloat16: equal up to one bfloat16 step.
    torch.testing.assert_close(ours_input.grad.float(), float32_input.grad.float(), rtol=2**-7, atol=1e-6)
    # A float32 input is read, never overwritten, by the backward.
    float32_logits = logits.float().requires_grad_()
    before = float32_logits.detach().clone()
    ChunkedLabelSmoothedCrossEntropy.apply(float32_logits, labels, 0.1, -100).backward()
    assert torch.equal(float32_logits.detach(), before)


def test_bf16_training_on_cpu_hands_the_loss_bfloat16_logits(tokenizer, tokenized, tmp_path):
    """Under --bf16 the loss reads the logits autocast made (accelerate's float32 copy skipped; the model's forward is
    restored after every step): the guard of the accelerate wrapper `bf16_logits` relies on (docs/internals.md)."""
    if torch.cuda.is_available():
        pytest.skip("the CPU bf16 path")
    model = small_model(tokenizer)
    args = paper_training_arguments(
        str(tmp_path), d_model=64, warmup_steps=4, max_steps=6, logging_steps=2, bf16=True, use_cpu=True,
        report_to=[], save_strategy="no",
    )
    trainer = CPUSeq2SeqTrainer(
        model=model, args=args, data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        train_dataset=tokenized["train"], max_tokens=512,
    )
    seen_dtypes, fused_loss = [], trainer.compute_loss_func

    def spy_loss(outputs, labels, num_items_in_batch=None):
        seen_dtypes.append(outputs["logits"].dtype)
        return fused_loss(outputs, labels, num_items_in_batch)

    trainer.compute_loss_func = spy_loss
    trainer.train()
    assert seen_dtypes == [torch.bfloat16] * 6
    wrapper = getattr(model.forward, "__func__", model.forward).__wrapped__
    assert type(wrapper).__name__ == "ConvertOutputsToFp32"  # accelerate's own forward is back in place
    # Without the speed-up, the loss gets accelerate's float32 copy.
    trainer = CPUSeq2SeqTrainer(
        model=model, args=args, data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        train_dataset=tokenized["train"], max_tokens=512, speedups=("chunked_loss",),
    )
    fused_loss, seen_dtypes = trainer.compute_loss_func, []
    trainer.compute_loss_func = spy_loss
    trainer.args.max_steps = 1
    trainer.train()
    assert seen_dtypes == [torch.float32]


@pytest.mark.slow
def test_a_compiled_model_trains_with_the_other_speedups_and_torchs_dropout(tokenizer, tokenized, tmp_path):
    """Under --torch-compile the 16-bit dropout is left out: a compiled graph keeps torch's dropout, and dynamo does
    not trace the model correctly under the function mode. The other speed-ups stay."""
    if torch.cuda.is_available():
        pytest.skip("the CPU path")
    args = paper_training_arguments(
        str(tmp_path), d_model=64, warmup_steps=4, max_steps=2, bf16=True, use_cpu=True, torch_compile_backend="eager",
        report_to=[], save_strategy="no",
    )
    model = small_model(tokenizer)
    trainer = CPUSeq2SeqTrainer(
        model=model, args=args, data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        train_dataset=tokenized["train"], max_tokens=512,
    )
    assert trainer.speedups == ("keep_memory", "chunked_loss", "bf16_logits")
    trainer.train()
    assert trainer.state.global_step == 2


# --- keep_memory ----------------------------------------------------------------------------------------------------

# Three 12 MiB blocks made and freed together, as a step's activations are: the page faults of each repetition, once
# glibc's thresholds have adjusted to the block size.
CHURN = """
import resource, sys, torch
if sys.argv[1] == "keep":
    from vanilla_transformer.training.cpu_speedups import keep_freed_memory
    print(keep_freed_memory())
else:
    print(None)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    blocks = [torch.ones(3 * 2**20) for _ in range(3)]
    del blocks
start = faults()
for _ in range(10):
    blocks = [torch.ones(3 * 2**20) for _ in range(3)]
    del blocks
print((faults() - start) / 10)
"""
MIB_PAGES = 2**20 // os.sysconf("SC_PAGE_SIZE")


def churn(mode: str, **environment) -> tuple[str, float]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("MALLOC_")}
    run = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, check=True,
                         env={**env, **environment})
    applied, faults = run.stdout.split()
    return applied, float(faults)


@pytest.mark.slow
@glibc_only
def test_freed_memory_is_reused_without_page_faults():
    _, default_faults = churn("default")
    applied, kept_faults = churn("keep")
    assert applied == "True"
    assert default_faults >= MIB_PAGES  # glibc as it is hands memory back and takes it again: at least 1 MiB a time
    assert kept_faults <= 0.01 * default_faults


@pytest.mark.slow
@glibc_only
def test_the_users_own_malloc_settings_are_kept():
    applied, faults = churn("keep", MALLOC_TRIM_THRESHOLD_="1000000")
    assert applied == "False"
    assert faults >= MIB_PAGES  # their trim threshold (1 MB) still hands the blocks back


# --- None of them is the model's ------------------------------------------------------------------------------------


def test_a_model_trained_with_or_without_the_speedups_saves_the_same_files_and_config(tokenizer, tokenized, tmp_path):
    saved = {}
    for name, speedups in [("without", ()), ("with", cpu_training.CPU_SPEEDUPS)]:
        model = small_model(tokenizer)
        args = paper_training_arguments(str(tmp_path / name), d_model=64, warmup_steps=2, max_steps=2, bf16=True,
                                        use_cpu=True, report_to=[], save_strategy="no")
        trainer = CPUSeq2SeqTrainer(model=model, args=args, train_dataset=tokenized["train"], max_tokens=512,
                                    data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
                                    processing_class=tokenizer, speedups=speedups)
        trainer.train()
        trainer.save_model(tmp_path / name / "model")
        folder = tmp_path / name / "model"
        saved[name] = ({path.name for path in folder.iterdir()}, json.loads((folder / "config.json").read_text()))
    assert saved["with"] == saved["without"]
    files, config = saved["with"]
    model_code = {f"{part}_vanilla_transformer.py" for part in ("configuration", "generation", "decoding", "modeling",
                                                                   "pipeline")}
    assert model_code | {"config.json", "generation_config.json", "model.safetensors"} <= files
    assert not {name for name in files if name.endswith(".py")} - model_code
    assert "dropout_implementation" not in config
