"""How many distinct batch shapes an epoch of the `train` command's token batches holds, with each batch padded to its
longest pair (`--pad_to_multiple_of 1`) or with lengths rounded up to a multiple (bucketed shapes,
docs/training.md#bucketed-shapes): for Multi30k train and for the simulated WMT-sized corpus of `data_path.py`. A
count, not a timing: a compiled training step meets one graph (or one set of kernel plans) per distinct shape.

For each rounding: the batches of an epoch, the distinct padded source and target lengths, the distinct shapes
(pairs, padded source length, padded target length) of the first epoch, the shapes of the second epoch that the first
did not have, and the share of padding in the source and target tensors.

- Multi30k: the recipe's tokenizer (a joint BPE of 8,000 tokens learnt from Multi30k train), every pair tokenized.
- The simulated corpus: `data_path.py`'s pairs (one to three Multi30k pairs joined, numbered), a BPE of 37,000 tokens
  learnt from at most a million of them, as the `train` command learns it. The byte-level pre-tokenizer splits at
  spaces and merges never cross a split, so a pair's length is the sum of its parts' lengths: its number, then each
  Multi30k sentence after a space, then `</s>`. Each Multi30k sentence is tokenized once, not millions of times; the
  report says how many of a sample of pairs tokenized whole give exactly the summed length. Pairs over 256 tokens
  on a side are dropped, as the `train` command drops them.

    python benchmarks/batch_shapes.py                                   # Multi30k and 4.5M pairs, ~25,000 tokens
    python benchmarks/batch_shapes.py --simulated-pairs 0 --max-tokens 8192
    python benchmarks/batch_shapes.py --smoke                           # seconds: checks that the script works
"""

import argparse
import json
import sys
from array import array
from pathlib import Path

import numpy as np

from common import DEFAULT_DATA_DIR, markdown_table, read_lines
from data_path import simulated_pairs
from vanilla_transformer.training.batch_samplers import TokenBatchSampler
from vanilla_transformer.training.tokenization import train_tokenizer

SMOKE_PAIRS = 2000
CHECKED_PAIRS = 2000


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="Multi30k (train.{en,de}.gz)")
    parser.add_argument("--max-tokens", type=int, default=25000, help="tokens per batch (25,000: section 5.1)")
    parser.add_argument("--multiples", default="1,8,16,32,64",
                        help="roundings to count, comma-separated; 1 pads each batch to its longest pair")
    parser.add_argument("--simulated-pairs", type=int, default=4_500_000,
                        help="pairs of the simulated corpus (4,500,000: WMT14 En-De's size; 0: Multi30k only)")
    parser.add_argument("--vocab-size", type=int, default=8000, help="Multi30k's vocabulary (the recipe's, 8,000)")
    parser.add_argument("--simulated-vocab-size", type=int, default=37000,
                        help="the simulated corpus's vocabulary (section 5.1: ~37,000)")
    parser.add_argument("--tokenizer-train-pairs", type=int, default=1_000_000,
                        help="simulated pairs the vocabulary is learnt from, at most (the train command's default)")
    parser.add_argument("--max-length", type=int, default=256, help="longer pairs are dropped (the train command's)")
    parser.add_argument("--json", type=Path, default=None, help="also write the counts to this JSON file")
    parser.add_argument("--smoke", action="store_true", help="a small simulated corpus, tiny vocabularies")
    args = parser.parse_args(argv)
    args.multiples = [int(multiple) for multiple in args.multiples.split(",")]
    if args.smoke:
        args.simulated_pairs, args.vocab_size, args.simulated_vocab_size = SMOKE_PAIRS, 500, 500
        args.tokenizer_train_pairs = min(args.tokenizer_train_pairs, SMOKE_PAIRS)
    return args


def round_up(lengths: np.ndarray, multiple: int) -> np.ndarray:
    return -(-lengths // multiple) * multiple


def epoch_counts(source: np.ndarray, target: np.ndarray, max_tokens: int, multiple: int) -> dict:
    """The batches of epochs 0 and 1 of the `train` command's sampler with the collator's rounding `multiple`."""
    sampler = TokenBatchSampler(source, target, max_tokens, seed=0, pad_to_multiple_of=multiple)
    shapes, padding = [], []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        epoch_shapes = [(len(batch), int(round_up(source[batch].max(), multiple)),
                         int(round_up(target[batch].max(), multiple))) for batch in batches]
        shapes.append(epoch_shapes)
        positions = sum(pairs * (source_length + target_length) for pairs, source_length, target_length in epoch_shapes)
        padding.append(1 - (source.sum() + target.sum()) / positions)
    first, second = set(shapes[0]), set(shapes[1])
    return dict(
        multiple=multiple,
        batches=len(sampler),
        source_lengths=len({shape[1] for shape in first}),
        target_lengths=len({shape[2] for shape in first}),
        shapes=len(first),
        new_shapes_in_second_epoch=len(second - first),
        padding_share=float(padding[0]),
    )


def lengths_of(tokenizer, sources: list[str], targets: list[str]) -> tuple[np.ndarray, np.ndarray]:
    encoded = tokenizer(sources, text_target=targets, return_attention_mask=False)
    return (np.array([len(ids) for ids in encoded["input_ids"]]), np.array([len(ids) for ids in encoded["labels"]]))


def token_counts(tokenizer, texts: list[str], chunk: int = 100_000) -> np.ndarray:
    """Tokens of each text, without `</s>`."""
    counts = []
    for start in range(0, len(texts), chunk):
        encodings = tokenizer.backend_tokenizer.encode_batch(texts[start : start + chunk], add_special_tokens=False)
        counts.extend(len(encoding.ids) for encoding in encodings)
    return np.array(counts)


def simulated_corpus(args, english: list[str], german: list[str]) -> dict:
    """The lengths of the simulated corpus's pairs, summed from its parts' lengths, and how they were checked."""
    print(f"simulated corpus: {args.simulated_pairs:,} pairs ...", file=sys.stderr, flush=True)
    # The Multi30k indices of every pair one after the other, and where each pair's begin.
    flat, sizes = array("l"), array("l")
    for indices in simulated_pairs(len(english), args.simulated_pairs):
        flat.extend(indices)
        sizes.append(len(indices))
    flat, starts = np.frombuffer(flat, dtype=np.int64), np.concatenate([[0], np.cumsum(sizes)[:-1]])

    def text(number: int, side: list[str]) -> str:  # pair `number`, from 0
        indices = flat[starts[number] : starts[number] + sizes[number]]
        return f"{number + 1}. " + " ".join(side[index] for index in indices)

    rng = np.random.default_rng(0)
    sample = np.arange(args.simulated_pairs)
    if args.tokenizer_train_pairs and args.simulated_pairs > args.tokenizer_train_pairs:
        sample = np.sort(rng.choice(args.simulated_pairs, size=args.tokenizer_train_pairs, replace=False))
    texts = (line for number in sample for line in (text(number, english), text(number, german)))
    tokenizer = train_tokenizer(texts, vocab_size=args.simulated_vocab_size, show_progress=False)

    numbers = token_counts(tokenizer, [f"{number}." for number in range(1, args.simulated_pairs + 1)])
    parts = [token_counts(tokenizer, [" " + sentence for sentence in side]) for side in (english, german)]
    part_lengths = [np.add.reduceat(side[flat], starts) for side in parts]
    source, target = (numbers + lengths + 1 for lengths in part_lengths)  # + </s>

    checked = rng.choice(args.simulated_pairs, size=min(CHECKED_PAIRS, args.simulated_pairs), replace=False)
    whole = lengths_of(tokenizer, [text(n, english) for n in checked], [text(n, german) for n in checked])
    exact = int(((whole[0] == source[checked]) & (whole[1] == target[checked])).sum())
    kept = (source <= args.max_length) & (target <= args.max_length)
    return dict(name=f"simulated, {args.simulated_pairs:,} pairs", pairs=int(kept.sum()),
                dropped=int((~kept).sum()), vocab_size=len(tokenizer), source=source[kept], target=target[kept],
                checked=len(checked), exact=exact)


def main(argv=None):
    args = parse_args(argv)
    english, german = read_lines(args.data_dir / "train.en.gz"), read_lines(args.data_dir / "train.de.gz")
    print("Multi30k ...", file=sys.stderr, flush=True)
    files = [args.data_dir / "train.en.gz", args.data_dir / "train.de.gz"]
    tokenizer = train_tokenizer(files, vocab_size=args.vocab_size, show_progress=False)
    source, target = lengths_of(tokenizer, english, german)
    corpora = [dict(name="Multi30k train", pairs=len(source), dropped=0, vocab_size=len(tokenizer), source=source,
                    target=target)]
    if args.simulated_pairs:
        corpora.append(simulated_corpus(args, english, german))

    results = []
    for corpus in corpora:
        counts = [epoch_counts(corpus["source"], corpus["target"], args.max_tokens, multiple)
                  for multiple in args.multiples]
        results.append(dict({key: value for key, value in corpus.items() if key not in ("source", "target")},
                            mean_source=float(corpus["source"].mean()), mean_target=float(corpus["target"].mean()),
                            longest=int(max(corpus["source"].max(), corpus["target"].max())), counts=counts))
    print(report(args, results))
    if args.json:
        args.json.write_text(json.dumps(dict(max_tokens=args.max_tokens, results=results), indent=2) + "\n")


def report(args, results: list[dict]) -> str:
    lines = [f"Token batches of <= {args.max_tokens:,} tokens, the `train` command's sampler (seed 0), epochs 0 and 1"
             + (" (smoke run)" if args.smoke else ""), ""]
    for result in results:
        lines.append(f"- {result['name']}: {result['pairs']:,} pairs ({result['dropped']:,} over {args.max_length} "
                     f"tokens dropped), vocabulary {result['vocab_size']:,}, {result['mean_source']:.1f} source and "
                     f"{result['mean_target']:.1f} target tokens on average, the longest {result['longest']}")
        if "checked" in result:
            lines.append(f"  - lengths summed from the parts; {result['exact']:,} of {result['checked']:,} pairs "
                         "tokenized whole have exactly that length")
    rows = [[result["name"], "exact (1)" if count["multiple"] == 1 else str(count["multiple"]), f"{count['batches']:,}",
             f"{count['source_lengths']} / {count['target_lengths']}", f"{count['shapes']:,}",
             str(count["new_shapes_in_second_epoch"]), f"{100 * count['padding_share']:.1f}%"]
            for result in results for count in result["counts"]]
    lines += ["", markdown_table(["corpus", "lengths rounded to a multiple of", "batches an epoch",
                                  "distinct padded lengths, source / target", "distinct shapes, first epoch",
                                  "new shapes in the second epoch", "padding in the tensors"], rows)]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
