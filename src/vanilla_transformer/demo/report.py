"""What the number-words demo reports beyond any run's test scores (`corpus.py` makes its corpus): exact match per
magnitude, the numbers below 1,000 seen in training (the `seen` split) scored apart, the wrong translations, and the
same in the model card's results. The demo's profile (`profile.py`) adds these to the `train` command's test report."""

from ..train_run.profile import print_pair


def exact_match_by_magnitude(pairs, hypotheses: list[str], target_lang: str) -> dict[str, tuple[int, float]]:
    """`{magnitude: (number of pairs, exact match in %)}` in the pairs' order."""
    right: dict[str, list[bool]] = {}
    for magnitude, pair, hypothesis in zip(pairs["magnitude"], pairs["translation"], hypotheses):
        right.setdefault(magnitude, []).append(hypothesis == pair[target_lang])
    return {magnitude: (len(marks), 100.0 * sum(marks) / len(marks)) for magnitude, marks in right.items()}


def magnitude_metrics(splits, hypotheses: dict[str, list[str]], target_lang: str) -> dict[str, float]:
    """Exact match per magnitude of each split translated, as metrics: `test_exact_match_1000-9999`, ..."""
    return {
        f"{name}_exact_match_{magnitude.replace(',', '')}": exact_match
        for name in hypotheses
        for magnitude, (_, exact_match) in exact_match_by_magnitude(splits[name], hypotheses[name], target_lang).items()
    }


def sample_indices(pairs) -> list[int]:
    """The first pair of each magnitude: the samples the demo shows."""
    first: dict[str, int] = {}
    for index, magnitude in enumerate(pairs["magnitude"]):
        first.setdefault(magnitude, index)
    return list(first.values())


def print_results(splits, hypotheses: dict[str, list[str]], metrics: dict, source_lang: str, target_lang: str) -> None:
    """After the held-out scores: their exact match per magnitude, the `seen` split's, and the first 20 wrong
    translations of both."""

    def print_magnitudes(name):
        for magnitude, (count, exact_match) in exact_match_by_magnitude(splits[name], hypotheses[name],
                                                                        target_lang).items():
            print(f"  {magnitude:>15}: {count:5,} pairs, exact match {exact_match:5.1f}%")

    print_magnitudes("test")
    print(f"Seen in training (the {len(splits['seen'])} numbers below 1,000 of the training set): "
          f"exact match {metrics['seen_exact_match']:.1f}%")
    print_magnitudes("seen")
    wrong = [(pair, hypothesis) for name in hypotheses
             for pair, hypothesis in zip(splits[name]["translation"], hypotheses[name])
             if hypothesis != pair[target_lang]]
    if wrong:
        print(f"Wrong translations ({len(wrong)}{', the first 20' if len(wrong) > 20 else ''}):")
        for pair, hypothesis in wrong[:20]:
            print_pair(pair, hypothesis, source_lang, target_lang)


def card_evaluations(metrics: dict) -> list[tuple[str, str, dict]]:
    """The card's evaluations as `(metric prefix, split, data)`: the held-out numbers, and those below 1,000 seen in
    training, each with its exact match (a number's translation is right or wrong)."""
    return [
        ("test", "test", dict(dataset="number words (num2words), held-out numbers",
                              exact_match=metrics["test_exact_match"])),
        ("seen", "train", dict(dataset="number words (num2words) below 1,000, seen in training",
                               exact_match=metrics["seen_exact_match"])),
    ]


def card_extras(splits, hypotheses: dict[str, list[str]], target_lang: str) -> dict:
    """What card_results.json adds for the demo: its training data in words, and exact match per magnitude."""
    from .corpus import describe_training  # datasets and num2words: not for `train --help`

    return dict(
        training_data=describe_training(splits["train"]),
        exact_match_by_magnitude={
            name: {magnitude: dict(pairs=count, exact_match=exact_match) for magnitude, (count, exact_match)
                   in exact_match_by_magnitude(splits[name], hypotheses[name], target_lang).items()}
            for name in hypotheses
        },
    )
