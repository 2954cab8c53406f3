import pytest
import torch
from transformers import AutoTokenizer

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.tokenization import train_tokenizer


def make_tiny_config(**overrides) -> VanillaTransformerConfig:
    """The shared tiny configuration: the "tiny" preset (d_model 32, 2+2 layers, 4 heads, d_ff 64, vocabulary 128)
    with every dropout off, so outputs are deterministic; `overrides` win."""
    return VanillaTransformerConfig.from_preset(
        "tiny", **{"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0, **overrides}
    )


def tiny_config_for(tokenizer, **overrides):
    """The shared tiny configuration sized and numbered for `tokenizer`'s vocabulary and special tokens."""
    return make_tiny_config(
        **{
            "vocab_size": len(tokenizer),
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "decoder_start_token_id": tokenizer.bos_token_id,
            **overrides,
        },
    )


@pytest.fixture
def tiny_config():
    return make_tiny_config()


@pytest.fixture
def tiny_model(tiny_config):
    torch.manual_seed(0)
    return VanillaTransformerForConditionalGeneration(tiny_config).eval()


@pytest.fixture
def batch():
    """Two source sentences (the second padded after 4 tokens) and two target prefixes (the second after 3)."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(4, 128, (2, 7), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 4:] = 0
    input_ids[1, 4:] = 0
    decoder_input_ids = torch.randint(4, 128, (2, 6), generator=generator)
    decoder_input_ids[:, 0] = 1
    decoder_attention_mask = torch.ones_like(decoder_input_ids)
    decoder_attention_mask[1, 3:] = 0
    decoder_input_ids[1, 3:] = 0
    return dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
        decoder_attention_mask=decoder_attention_mask,
    )


@pytest.fixture(scope="module")
def tokenizer_dir(corpus, tmp_path_factory):
    """A saved BPE of 300 tokens learnt from both sides of the `corpus` fixture's training pairs (each test module
    that uses it defines `corpus`)."""
    texts = (text for pair in corpus["train"]["translation"] for text in pair.values())
    folder = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(texts, vocab_size=300, show_progress=False).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)
