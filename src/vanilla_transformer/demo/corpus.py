"""A parallel corpus the project makes itself: English number words -> French (or German) number words.

It lets the main job train and evaluate a real translation model offline. Every number below 1,000 is evaluated, each
magnitude on its own: the numbers below 100 are all in training (each is a word to learn), so they are reported as
seen in training; the numbers 100-999 are split between training and a held-out part; numbers of 1,000 and more are
held out at random. Exact match on the held-out numbers measures generalisation, not memorisation.
"""

import random
from collections import Counter

from ..extras import require


datasets = require("datasets", extra="train")
num2words = require("num2words", extra="train").num2words


def magnitude(number: int) -> str:
    """The range of the numbers with as many digits as `number`: "0-9", "10-99", ..., "100,000-999,999"."""
    digits = len(str(number))
    return f"{0 if digits == 1 else 10 ** (digits - 1):,}-{10**digits - 1:,}"


def sample_numbers(
    count: int,
    rng: random.Random,
    min_digits: int,
    max_digits: int,
    exclude: set[int],
    zero_probability: float = 0.1,
    weight_by_digits: bool = False,
) -> list[int]:
    """Distinct numbers: the digit count drawn first, uniformly so that smaller numbers are not drowned out (or, with
    `weight_by_digits`, in proportion to the count: a longer number has more words to get right), then the first digit
    uniformly from 1-9 and each other digit 0 with `zero_probability`, else uniformly from 1-9 (at 0.1 every number of
    that many digits is equally likely)."""
    digit_counts = list(range(min_digits, max_digits + 1))
    numbers: list[int] = []
    seen = set(exclude)
    while len(numbers) < count:
        number = rng.randint(1, 9)
        if weight_by_digits:
            digits = rng.choices(digit_counts, weights=digit_counts)[0]
        else:
            digits = rng.randint(min_digits, max_digits)
        for _ in range(digits - 1):
            number = 10 * number + (0 if rng.random() < zero_probability else rng.randint(1, 9))
        if number not in seen:
            seen.add(number)
            numbers.append(number)
    return numbers


def number_words_corpus(
    target_lang: str = "fr",
    train_size: int = 60000,
    validation_size: int = 300,
    test_size: int = 500,
    max_digits: int = 6,
    held_out_hundreds: int = 450,
    repeats_below_10: int = 200,
    repeats_short: int = 50,
    repeats_hundreds: int = 10,
    zero_probability: float = 0.3,
    seed: int = 0,
) -> datasets.DatasetDict:
    """Splits of `{"translation": {"en": ..., target_lang: ...}, "number": n, "magnitude": "100-999"}` rows:

    - `test`, numbers never in training: `held_out_hundreds` random numbers 100-999 and `test_size` numbers from
      1,000 up to 10**max_digits - 1, the digit count drawn uniformly first, so that each magnitude has its share;
    - `validation`: `validation_size` other numbers of 1,000 and more;
    - `train`: `train_size` pairs: every number below 10 `repeats_below_10` times, the others below 100 and the round
      hundreds not held out `repeats_short` times, the other numbers 100-999 not held out `repeats_hundreds` times,
      then distinct numbers of 1,000 and more, none of them in `test` or `validation`, drawn as the test ones except
      that the digit count is drawn in proportion to itself (a six-digit number has more words to get right than a
      four-digit one) and each digit after the first is 0 with `zero_probability`; shuffled. Token batches put the
      pairs of one length together, so the copies of a short number fall into the few batches of short pairs of an
      epoch: it takes many copies for it to be learnt in many steps. Round forms, which French writes apart ("deux
      cents" but "deux cent un", "quatre-vingts"), are rare among uniformly drawn numbers: more zeros make them common
      enough to learn;
    - `seen`: every number below 1,000 that is in `train`, once, to check that the model knows them too.

    `test` and `seen` are in increasing order; together they hold every number below 1,000.
    """
    if not 4 <= max_digits <= 15:
        raise ValueError(f"max_digits must be 4 to 15 (numbers of 1,000 and more are needed), got {max_digits}.")
    if not 0 <= held_out_hundreds <= 900:
        raise ValueError(f"held_out_hundreds must be 0 to 900 (there are 900 numbers 100-999), got {held_out_hundreds}.")
    rng = random.Random(seed)
    held_out = sorted(rng.sample(range(100, 1000), held_out_hundreds))
    seen = sorted(set(range(1000)) - set(held_out))
    repeats = {n: repeats_below_10 if n < 10 else repeats_short if n < 100 or n % 100 == 0 else repeats_hundreds
               for n in seen}
    small_train = [n for n in seen for _ in range(repeats[n])]
    large_train_size = train_size - len(small_train)
    if large_train_size < 0:
        raise ValueError(f"{train_size:,} training pairs are fewer than the {len(small_train):,} pairs of numbers "
                         "below 1,000")
    if large_train_size + validation_size + test_size > 0.9 * (10**max_digits - 1000):
        raise ValueError(f"Asked for more numbers of 1,000 and more than {max_digits} digits hold without repeats.")
    large_test = sorted(sample_numbers(test_size, rng, 4, max_digits, exclude=set()))
    validation = sample_numbers(validation_size, rng, 4, max_digits, exclude=set(large_test))
    train = small_train + sample_numbers(
        large_train_size, rng, 4, max_digits, exclude=set(large_test + validation), zero_probability=zero_probability,
        weight_by_digits=True,
    )
    rng.shuffle(train)
    return number_words_splits(target_lang, train=train, validation=validation, test=held_out + large_test, seen=seen)


def number_words_splits(target_lang: str, **splits: list[int]) -> datasets.DatasetDict:
    """Each list of numbers as a split of `{"translation": {"en": ..., target_lang: ...}, "number": n, "magnitude":
    "100-999"}` rows, in its order. Each number is written in words once: the numbers below 1,000 repeat in training."""
    words = {
        n: {"en": num2words(n, lang="en"), target_lang: num2words(n, lang=target_lang)}
        for n in set().union(*splits.values())
    }
    return datasets.DatasetDict({
        name: datasets.Dataset.from_dict(
            {"translation": [words[n] for n in numbers], "number": numbers,
             "magnitude": [magnitude(n) for n in numbers]}
        )
        for name, numbers in splits.items()
    })


def describe_training(train: datasets.Dataset) -> str:
    """What a `train` split of `number_words_corpus` holds, in a sentence (the model card's training data)."""
    counts = Counter(train["number"])
    round_hundreds = [number for number in counts if number < 1000 and number % 100 == 0 and number]
    hundreds = [number for number in counts if 100 <= number < 1000 and number % 100]
    large = [str(number) for number in counts if number >= 1000]
    later_digits = "".join(number[1:] for number in large)
    digit_counts = Counter(map(len, large))
    by_digits = ", ".join(f"{digit_counts[digits]:,} of {digits} digits" for digits in sorted(digit_counts))
    return (
        f"{len(train):,} pairs of number words written by `num2words`: every number below 10, {counts[0]} times each, "
        f"the others below 100 and {len(round_hundreds)} of the 9 round hundreds, {counts[10]} times each, "
        f"{len(hundreds)} of the other numbers "
        f"100-999, {counts[min(hundreds)] if hundreds else 0} times each, and {len(large):,} numbers from 1,000 to "
        f"{10 ** max(map(len, large)) - 1:,}, once each ({by_digits}), "
        f"{later_digits.count('0') / len(later_digits):.0%} of their "
        "digits after the first being 0. The other numbers 100-999 and the test numbers of 1,000 and more are held out."
    )
