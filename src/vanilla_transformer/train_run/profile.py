"""What kind of run `train` makes: a profile holds the defaults it sets over the paper's recipe and what it does
differently from a run on the user's data, so that the command's code has one path for every kind.

`PAPER_PROFILE` is the run of the paper's recipe on the data the flags give. The number-words demo (demo/profile.py)
is the other kind, which the `train` command chooses when it is given no data flag (cli/train.py).
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any



@dataclass(frozen=True)
class RunProfile:
    """A run of the paper's recipe on the user's data; subclasses change what their kind of run does differently.

    `defaults`: flag defaults over the recipe's (`arguments.PAPER_DEFAULTS`); `no_cuda_defaults`: over those, on a
    machine without CUDA; `output_dir`: where the run trains without `--output-dir` (None: the flag is required);
    `demo`: what `run_arguments.json` records of the run under that name. A profile is true for the demo, false
    for the paper's recipe on the user's data."""

    name: str = "paper"
    defaults: Mapping[str, Any] = field(default_factory=dict)
    no_cuda_defaults: Mapping[str, Any] = field(default_factory=dict)
    output_dir: str | None = None
    demo: bool = False

    def has_validation(self, data_args) -> bool:
        """Whether the run has validation pairs to evaluate on: validation files given."""
        return bool(data_args.validation_source_file or data_args.validation_file)

    def load_data(self, data_args, seed: int) -> dict:
        """The `train` split and optional `validation` / `test` splits, as `translation` pair datasets: the files or
        Hub dataset the data flags give."""
        from ..training.data import load_parallel_corpus  # datasets: imported when a run loads its data, not for --help

        languages = dict(source_lang=data_args.source_lang, target_lang=data_args.target_lang)
        splits = {
            "train": load_parallel_corpus(
                source_file=data_args.source_file,
                target_file=data_args.target_file,
                pairs_file=data_args.train_file,
                dataset_name=data_args.dataset_name,
                dataset_config_name=data_args.dataset_config_name,
                **languages,
            )
        }
        for split in ["validation", "test"]:
            source_file, target_file, pairs_file = (
                getattr(data_args, f"{split}_{kind}") for kind in ("source_file", "target_file", "file")
            )
            if source_file or pairs_file:
                splits[split] = load_parallel_corpus(
                    source_file=source_file, target_file=target_file, pairs_file=pairs_file, **languages
                )
        return splits

    def test_splits(self) -> tuple[str, ...]:
        """The splits translated and scored after training, each under its own metric prefix."""
        return ("test",)

    def test_metrics(self, splits, hypotheses: dict[str, list[str]], target_lang: str) -> dict[str, float]:
        """Metrics beyond each split's scores, from its translations."""
        return {}

    def sample_indices(self, pairs, count: int) -> list[int]:
        """The pairs a report shows: the first `count`."""
        return list(range(min(count, len(pairs))))

    def print_test_results(self, splits, hypotheses, metrics: dict, source_lang: str, target_lang: str) -> None:
        """What the test report prints after the held-out scores: nothing more."""

    def card_evaluations(self, metrics: dict, data_args) -> list[tuple[str, str, dict]]:
        """The card's evaluations as `(metric prefix, split, data)`: the test split, named by its Hub dataset or its
        file."""
        if data_args.dataset_name:
            return [("test", "test", dict(dataset=data_args.dataset_name, dataset_id=data_args.dataset_name))]
        return [("test", "test", dict(dataset=Path(data_args.test_source_file or data_args.test_file).name))]

    def card_extras(self, splits, hypotheses: dict[str, list[str]], target_lang: str) -> dict:
        """What card_results.json adds to the test results: nothing."""
        return {}


PAPER_PROFILE = RunProfile()


def print_pair(pair: dict, hypothesis: str, source_lang: str, target_lang: str) -> None:
    """One translation of a report, every kind's: under its source and above its reference, marked `ok` when it
    matches the reference exactly."""
    mark = "ok " if hypothesis == pair[target_lang] else "ERR"
    print(f"  {mark} {pair[source_lang]}\n      -> {hypothesis}\n  (ref) {pair[target_lang]}")


__all__ = ["PAPER_PROFILE", "RunProfile", "print_pair"]
