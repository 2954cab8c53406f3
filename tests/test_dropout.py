"""Section 5.4's dropout kernels (dropout.py): the CPU kernel's rate, scale, gradient and independence, and how the
model chooses a kernel (`config.dropout_implementation`, torch's by default)."""

import inspect

import pytest
import torch

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer import dropout as dropout_kernels
from vanilla_transformer import modeling_vanilla_transformer
from vanilla_transformer.dropout import cpu_16bit_dropout

# The CPU kernel draws 16 random bits per element, four elements per 64-bit draw, and keeps an element by the low 15.

DROPOUT_ELEMENTS = 400_003  # not a multiple of 4: the last draw is only partly used


def dropout_mask(p, seed=0):
    torch.manual_seed(seed)
    return cpu_16bit_dropout(torch.ones(DROPOUT_ELEMENTS), p, training=True) != 0


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_cpu_dropout_drops_each_element_with_probability_p_and_keeps_the_expectation(p):
    x = torch.ones(DROPOUT_ELEMENTS, requires_grad=True)
    y = cpu_16bit_dropout(x, p, training=True)
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
    one_call, next_call = cpu_16bit_dropout(x, p, True) != 0, cpu_16bit_dropout(x, p, True) != 0
    tolerance = 6 * (p * (1 - p) / DROPOUT_ELEMENTS) ** 0.5
    # Independent elements: neighbours (within a 64-bit draw and across draws) and the next call's mask are both
    # dropped with probability p^2.
    draws = one_call[: DROPOUT_ELEMENTS // 4 * 4].view(-1, 4)  # one row per 64-bit draw
    for left, right in [(one_call[:-1], one_call[1:]), (draws[:-1, 3], draws[1:, 0]), (one_call, next_call)]:
        assert abs((~left & ~right).double().mean().item() - p * p) < tolerance
    assert not torch.equal(dropout_mask(p, seed=1), first)


def test_cpu_dropout_is_the_identity_when_off_and_keeps_dtype_and_shape():
    x = torch.randn(3, 5, 7, dtype=torch.bfloat16)
    assert cpu_16bit_dropout(x, 0.1, training=False) is x
    assert cpu_16bit_dropout(x, 0.0, training=True) is x
    y = cpu_16bit_dropout(x, 0.1, training=True)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    kept = y != 0
    torch.testing.assert_close(y[kept], (x * (32768 / (32768 - 3277)))[kept], rtol=0, atol=0)


@pytest.mark.parametrize("implementation", ["torch", "cpu_16bit"])
def test_the_config_chooses_the_kernel_every_dropout_site_calls(implementation, monkeypatch):
    calls = {name: 0 for name in dropout_kernels.DROPOUT_FUNCTIONS}

    def counting(name, kernel):
        def counted(x, p, training):
            calls[name] += 1
            return kernel(x, p, training)

        return counted

    for name, kernel in list(dropout_kernels.DROPOUT_FUNCTIONS.items()):
        monkeypatch.setitem(dropout_kernels.DROPOUT_FUNCTIONS, name, counting(name, kernel))
    config = VanillaTransformerConfig.from_preset(
        "tiny", attention_dropout=0.1, activation_dropout=0.1, dropout_implementation=implementation
    )
    config._attn_implementation = "eager"  # the eager kernel applies attention dropout through the package
    model = VanillaTransformerForConditionalGeneration(config).train()
    model(input_ids=torch.tensor([[5, 6, 7, 2]]), decoder_input_ids=torch.tensor([[1, 9, 10]]))
    # 2 embeddings; per encoder layer 2 residuals + attention + ReLU; per decoder layer 3 residuals + 2 attentions + ReLU
    assert calls[implementation] == 2 + 2 * 4 + 2 * 6
    assert sum(calls.values()) == calls[implementation]


def test_a_default_config_uses_torchs_dropout_and_the_modeling_file_has_no_device_specific_code():
    assert VanillaTransformerConfig().dropout_implementation == "torch"
    source = inspect.getsource(modeling_vanilla_transformer)
    for device_specific in ("cuda", "\"cpu\"", "device.type", "random_("):
        assert device_specific not in source, device_specific


def test_both_kernels_give_the_same_model_in_eval_mode(tiny_config, batch):
    outputs = []
    for implementation in ["torch", "cpu_16bit"]:
        torch.manual_seed(0)
        config = VanillaTransformerConfig.from_preset("tiny", dropout_implementation=implementation)
        outputs.append(VanillaTransformerForConditionalGeneration(config).eval()(**batch).logits)
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)
