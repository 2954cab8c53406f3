"""A parallel corpus the project makes itself: English number words -> French (or German) number words.

It lets the main job train and evaluate a real translation model offline: the test numbers are never seen in
training, so exact-match accuracy on them measures generalisation, not memorisation.
"""

import random

from .extras import require


datasets = require("datasets", extra="train")
num2words = require("num2words", extra="train").num2words


def sample_numbers(count: int, rng: random.Random, max_digits: int, exclude: set[int]) -> list[int]:
    """Distinct numbers, the digit count drawn uniformly first so that small numbers are not drowned out."""
    numbers: list[int] = []
    seen = set(exclude)
    while len(numbers) < count:
        digits = rng.randint(1, max_digits)
        number = rng.randrange(0 if digits == 1 else 10 ** (digits - 1), 10**digits)
        if number not in seen:
            seen.add(number)
            numbers.append(number)
    return numbers


def number_words_corpus(
    target_lang: str = "fr",
    train_size: int = 20000,
    validation_size: int = 300,
    test_size: int = 500,
    max_digits: int = 6,
    seed: int = 0,
) -> datasets.DatasetDict:
    """`train`, `validation` and `test` splits of `{"translation": {"en": ..., target_lang: ...}}` pairs over
    disjoint sets of numbers below 10**max_digits."""
    if train_size + validation_size + test_size > 0.9 * 10**max_digits:
        raise ValueError(f"Asked for more numbers than {max_digits} digits hold without repeats.")
    rng = random.Random(seed)
    splits, used = {}, set()
    for split, size in [("train", train_size), ("validation", validation_size), ("test", test_size)]:
        numbers = sample_numbers(size, rng, max_digits, exclude=used)
        used.update(numbers)
        pairs = [{"en": num2words(n, lang="en"), target_lang: num2words(n, lang=target_lang)} for n in numbers]
        splits[split] = datasets.Dataset.from_dict({"translation": pairs, "number": numbers})
    return datasets.DatasetDict(splits)
