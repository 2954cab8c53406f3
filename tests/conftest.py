import contextlib
import os
from pathlib import Path

# Under pytest-xdist (`-n N`, as `make test` runs the suite) each worker gets its share of the cores for torch's
# threads, set before torch is imported: N workers each running as many threads as there are cores would thrash. The
# processes the tests start inherit it.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cores // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.training.tokenization import train_tokenizer


# Multi30k (gzip, one sentence a line: train, val and test_2016_flickr in en, de and fr) sits beside the checkout, in
# ../shared/data/multi30k, here and in CI; never copied into the repository. The scripts of benchmarks/ and examples/
# cannot import this file and name the same default folder themselves.
MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
MULTI30K_MISSING = f"Multi30k not found at {MULTI30K} (../shared/data/multi30k beside the checkout)"
requires_multi30k = pytest.mark.skipif(not MULTI30K.is_dir(), reason=MULTI30K_MISSING)


@contextlib.contextmanager
def ctrl_c_at_step(step: int):
    """Inside the block, Ctrl-C (a `KeyboardInterrupt`) comes as the Trainer begins optimizer step `step`: the run
    stops after step `step` - 1, as a user's Ctrl-C stops it."""
    from transformers import Trainer

    training_step = Trainer.training_step

    def interrupted(self, *args, **kwargs):
        if self.state.global_step + 1 == step:
            raise KeyboardInterrupt
        return training_step(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "training_step", interrupted)
        yield


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


@pytest.fixture(scope="session")
def multi30k():
    """The Multi30k folder (`MULTI30K`); a test that asks for it is skipped, saying where it looked, without it."""
    if not MULTI30K.is_dir():
        pytest.skip(MULTI30K_MISSING)
    return MULTI30K


@pytest.fixture(scope="session")
def corpus():
    """English -> French number words (the demo's task), small: 600 training pairs (the 550 numbers below 1,000 that
    are not held out, once each, and 50 of 4 digits), 50 validation pairs of 4 digits, and the 450 held-out numbers
    100-999 and 50 of 4 digits as the test split. The `tokenizer_dir` and `tokenizer` fixtures learn their BPE from it.
    Shared by every test module: read it, never change it."""
    from vanilla_transformer.demo.corpus import number_words_corpus  # optional packages: num2words, datasets

    return number_words_corpus("fr", train_size=600, validation_size=50, test_size=50, max_digits=4,
                               repeats_below_10=1, repeats_short=1, repeats_hundreds=1, seed=0)


@pytest.fixture(scope="session")
def tokenizer_dir(corpus, tmp_path_factory):
    """A saved BPE of 300 tokens learnt from both sides of the `corpus` fixture's training pairs (shared: load it,
    never write into it)."""
    texts = (text for pair in corpus["train"]["translation"] for text in pair.values())
    folder = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(texts, vocab_size=300, show_progress=False).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    """The `tokenizer_dir` BPE loaded, a fresh object for each test module. test_tokenization.py and
    test_ctranslate2.py define their own `tokenizer`, learnt from their own sentences."""
    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="module")
def tokenized(corpus, tokenizer):
    """Every split of `corpus` tokenized by `tokenizer` (English -> French): {"train": Dataset, "validation": ...}
    of `input_ids`, `attention_mask` and `labels`."""
    from vanilla_transformer.training.trainer import tokenize_pairs

    tokenize = tokenize_pairs(tokenizer, "en", "fr")
    return {name: split.map(tokenize, batched=True, remove_columns=split.column_names) for name, split in corpus.items()}


@pytest.fixture(scope="session")
def number_words_model_dir(corpus, tokenizer_dir, tmp_path_factory):
    """A small model trained with the package's recipe on the `corpus` fixture until its translations are mostly
    right, saved with the `tokenizer_dir` BPE and the paper's decoding settings (shared: load it, never write into it).
    Trained weights make peaked, length-dependent scores, where beam search's choices and early ends differ from a
    random model's. 400 steps get 367 of the 500 held-out numbers right in greedy search (300 steps, only 221).
    Minutes on 2 CPU cores: for `slow` tests only."""
    from transformers import DataCollatorForSeq2Seq

    from vanilla_transformer.training.trainer import TokenBatchSeq2SeqTrainer, paper_training_arguments, tokenize_pairs

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    train = corpus["train"].map(tokenize_pairs(tokenizer, "en", "fr"), batched=True,
                                remove_columns=corpus["train"].column_names)
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=len(tokenizer), d_model=64, dropout=0.0,
                                                  encoder_ffn_dim=128, decoder_ffn_dim=128)
    model = VanillaTransformerForConditionalGeneration(config)
    root = tmp_path_factory.mktemp("number-words-model")
    args = paper_training_arguments(
        str(root / "run"), d_model=64, warmup_steps=30, lr_scale=0.5, max_steps=400,
        report_to=[], save_strategy="no", disable_tqdm=True, predict_with_generate=False,
    )
    TokenBatchSeq2SeqTrainer(model=model, args=args, train_dataset=train, max_tokens=1024,
                             data_collator=DataCollatorForSeq2Seq(tokenizer, model=model)).train()
    model.eval().save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return root / "model"
