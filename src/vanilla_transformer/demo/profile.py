"""The number-words demo as a kind of `train` run: its defaults, its output folder, its corpus, the samples it shows
and what its report adds (exact match per magnitude, the numbers seen in training). The `train` command runs it when
it is given no data flag (`train_command.py`). The corpus (`datasets`, `num2words`) is imported when the run
uses it, so that `train --help` does not pay for it."""

from dataclasses import dataclass, field
from typing import Any

from ..train_run.profile import RunProfile
from ..errors import UserError
from . import report


DEMO_OUTPUT_DIR = "outputs/number-words-en-fr"

# A small model sized to train on the number-words corpus in minutes on 2 CPU cores. Half the section 5.3 rate: at
# d_model 128 the formula's peak is 3 times base's, and the held-out accuracy swings from one checkpoint to the next
# (docs/training.md, the demo).
DEMO_DEFAULTS = dict(
    d_model=128,
    layers=3,
    heads=4,
    ffn_dim=512,
    vocab_size=1000,
    max_tokens=2048,
    max_sentences=256,
    bf16=True,  # with eager attention, the fastest CPU training step where the CPU computes bfloat16 (docs/speed.md)
    attn_implementation="eager",
    warmup_steps=300,
    lr_scale=0.5,
    max_steps=1200,
    save_steps=50,
    average_last=10,
    logging_steps=100,
    per_device_eval_batch_size=64,
    output_dir=DEMO_OUTPUT_DIR,
)


@dataclass(frozen=True)
class DemoProfile(RunProfile):
    """The number-words demo: English -> French number words the package generates (corpus.py), validated on
    held-out numbers, tested on those and on the numbers below 1,000 seen in training (`seen`), each scored per
    magnitude (report.py)."""

    name: str = "demo"
    defaults: dict[str, Any] = field(default_factory=lambda: dict(DEMO_DEFAULTS))
    no_cuda_defaults: dict[str, Any] = field(default_factory=lambda: dict(use_cpu=True))  # the Trainer's bf16 on a CPU
    output_dir: str | None = DEMO_OUTPUT_DIR
    demo: bool = True

    def has_validation(self, data_args) -> bool:
        return True

    def load_data(self, data_args, seed: int) -> dict:
        from .corpus import number_words_corpus

        try:
            return dict(number_words_corpus(
                data_args.target_lang, data_args.demo_train_size, max_digits=data_args.demo_max_digits, seed=seed
            ))
        except ValueError as error:  # the corpus names its own arguments: the flags here
            raise UserError(f"--demo-train-size {data_args.demo_train_size} with --demo-max-digits "
                            f"{data_args.demo_max_digits}: {error}") from error

    def test_splits(self) -> tuple[str, ...]:
        return ("test", "seen")

    def test_metrics(self, splits, hypotheses, target_lang):
        return report.magnitude_metrics(splits, hypotheses, target_lang)

    def sample_indices(self, pairs, count):
        """The first pair of each magnitude."""
        return report.sample_indices(pairs)

    def print_test_results(self, splits, hypotheses, metrics, source_lang, target_lang):
        report.print_results(splits, hypotheses, metrics, source_lang, target_lang)

    def card_evaluations(self, metrics, data_args):
        return report.card_evaluations(metrics)

    def card_extras(self, splits, hypotheses, target_lang):
        return report.card_extras(splits, hypotheses, target_lang)


DEMO_PROFILE = DemoProfile()


__all__ = ["DEMO_DEFAULTS", "DEMO_OUTPUT_DIR", "DEMO_PROFILE", "DemoProfile"]
