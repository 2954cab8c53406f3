"""The `train` command's data path at WMT scale, simulated: a parallel corpus of up to 4.5M pairs (WMT14 En-De's size,
section 5.1) goes through loading, tokenizer training, tokenization with the length filter, token batching and one training
step, each stage timed, with the peak memory (resident set of the process and its workers) reached during it.

The corpus is Multi30k train resampled: each pair joins one to three Multi30k pairs (so that sentences are about as
long as WMT's, ~25 words) and carries a running number on both sides, so that no two pairs are alike. It is written to
a temporary folder as two gzip files and removed afterwards; nothing is committed. Each size runs in a fresh process,
so its memory is its own, with the `datasets` cache in that folder.

    python benchmarks/data_path.py                              # 0.5M, 1.5M and 4.5M pairs
    python benchmarks/data_path.py --pairs 500000 --num-proc 2  # tokenization in two processes
    python benchmarks/data_path.py --smoke                      # seconds: checks that the script works
"""

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from common import DEFAULT_DATA_DIR, environment, environment_lines, markdown_table, read_lines


STAGES = ("load", "tokenizer", "tokenize", "batch", "step")
STAGE_NAMES = {
    "load": "read the files into Arrow (`load_parallel_corpus`)",
    "tokenizer": "train the shared BPE (`train_tokenizer`)",
    "tokenize": "tokenize both sides, dropping over-long pairs (`datasets.map`)",
    "batch": "an epoch's token batches (`TokenBatchSampler`)",
    "step": "collate one batch, one training step",
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", default="500000,1500000,4500000", help="corpus sizes, comma-separated")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="Multi30k (train.{en,de}.gz)")
    parser.add_argument("--vocab-size", type=int, default=37000, help="BPE vocabulary (section 5.1: ~37,000)")
    parser.add_argument("--max-tokens", type=int, default=25000, help="tokens per batch (section 5.1: ~25,000)")
    parser.add_argument("--num-proc", type=int, default=None,
                        help="processes for tokenization and filtering (default: the train command's, one per core "
                        "from 100,000 pairs)")
    parser.add_argument("--tokenizer-train-pairs", type=int, default=1_000_000,
                        help="pairs the vocabulary is learnt from, at most (the train command's default; 0: all)")
    parser.add_argument("--step-preset", default="base", help="model of the training step (default: base)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    parser.add_argument("--smoke", action="store_true", help="2,000 pairs, a tiny vocabulary: checks the script")
    parser.add_argument("--run-one", type=int, default=None, help=argparse.SUPPRESS)  # a child process: one size
    parser.add_argument("--work-dir", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.pairs, args.vocab_size, args.max_tokens, args.step_preset = "2000", 500, 2000, "tiny"
    if args.run_one is not None:
        print(json.dumps(run_one(args)))
        return

    sizes = [int(size) for size in args.pairs.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="data_path_") as work_dir:
        for size in sizes:
            print(f"{size:,} pairs ...", file=sys.stderr, flush=True)
            command = [sys.executable, __file__, "--run-one", str(size), "--work-dir", work_dir,
                       "--data-dir", str(args.data_dir), "--vocab-size", str(args.vocab_size),
                       "--max-tokens", str(args.max_tokens), "--step-preset", args.step_preset,
                       "--tokenizer-train-pairs", str(args.tokenizer_train_pairs)]
            if args.num_proc:
                command += ["--num-proc", str(args.num_proc)]
            child = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
            results.append(json.loads(child.stdout.strip().splitlines()[-1]))
    report = dict(environment=environment(), vocab_size=args.vocab_size, max_tokens=args.max_tokens,
                  num_proc=args.num_proc, step_preset=args.step_preset, results=results)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


def print_report(report: dict) -> None:
    results = report["results"]
    header = ["stage"] + [f"{result['pairs']:,} pairs: s, peak GiB" for result in results]
    rows = [[STAGE_NAMES[stage]] + [f"{result['stages'][stage]['seconds']:,.1f} s, "
                                    f"{result['stages'][stage]['peak_rss_gib']:.2f}" for result in results]
            for stage in STAGES]
    rows.append(["**the data path (all but the step)**"] + [
        f"**{result['data_seconds']:,.1f} s, {result['data_peak_rss_gib']:.2f}**" for result in results])
    print(markdown_table(header, rows))
    print()
    for result in results:
        print(f"- {result['pairs']:,} pairs: {result['kept_pairs']:,} kept by the length filter, "
              f"{result['source_tokens']:,} + {result['target_tokens']:,} tokens, {result['batches']:,} batches of "
              f"~{report['max_tokens']:,} tokens; vocabulary learnt from {result['tokenizer_pairs']:,} pairs; "
              f"{result['num_proc']} process(es) tokenizing; corpus written in {result['write_seconds']:.1f} s (not "
              "counted)")
    print(f"- vocabulary {report['vocab_size']:,}; the step: "
          f"the {report['step_preset']} preset on a quarter of the epoch's first batch, Adam")
    for line in environment_lines(report["environment"]):
        print(line)


# --- One size, in its own process ----------------------------------------------------------------------------------


def simulated_pairs(num_multi30k_pairs: int, pairs: int) -> Iterator[list[int]]:
    """The corpus's pairs, each as the indices of the one to three Multi30k pairs it joins; pair k (from 1) is
    numbered k. The same every time (`batch_shapes.py` counts the batches of this corpus)."""
    rng = random.Random(0)
    for _ in range(pairs):
        yield rng.choices(range(num_multi30k_pairs), k=rng.choices((1, 2, 3), weights=(3, 4, 3))[0])


def write_corpus(data_dir: Path, pairs: int, folder: Path) -> tuple[Path, Path]:
    """`pairs` pairs of one to three joined Multi30k pairs, numbered, as train.en.gz / train.de.gz in `folder`."""
    english, german = read_lines(data_dir / "train.en.gz"), read_lines(data_dir / "train.de.gz")
    paths = folder / "train.en.gz", folder / "train.de.gz"
    with gzip.open(paths[0], "wt", encoding="utf-8", compresslevel=1) as source, \
            gzip.open(paths[1], "wt", encoding="utf-8", compresslevel=1) as target:
        for number, picked in enumerate(simulated_pairs(len(english), pairs), start=1):
            source.write(f"{number}. " + " ".join(english[index] for index in picked) + "\n")
            target.write(f"{number}. " + " ".join(german[index] for index in picked) + "\n")
    return paths


class PeakMemory:
    """The largest resident set of this process and its children (the `datasets` workers) while a stage runs,
    sampled every 20 ms from /proc."""

    def __init__(self):
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def resident_bytes(pid: int) -> int:
        total = 0
        try:
            with open(f"/proc/{pid}/statm") as statm:
                total += int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as children:
                    total += sum(PeakMemory.resident_bytes(int(child)) for child in children.read().split())
        except (FileNotFoundError, ProcessLookupError):
            pass
        return total

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.resident_bytes(os.getpid()))
            self._stop.wait(0.02)

    def __enter__(self):
        self.peak = self.resident_bytes(os.getpid())
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.resident_bytes(os.getpid()))


def run_one(args) -> dict:
    work_dir = args.work_dir / f"pairs-{args.run_one}"
    work_dir.mkdir()
    os.environ["HF_DATASETS_CACHE"] = str(work_dir / "datasets-cache")  # before datasets is imported

    import torch
    from transformers import DataCollatorForSeq2Seq

    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
    from vanilla_transformer.training.batch_samplers import TokenBatchSampler
    from vanilla_transformer.training.data import (
        default_num_proc, load_parallel_corpus, pair_texts, sample_pairs, single_threaded_tokenizers
    )
    from vanilla_transformer.training.tokenization import train_tokenizer
    from vanilla_transformer.training.trainer import tokenize_pairs

    started = time.perf_counter()
    source_file, target_file = write_corpus(args.data_dir, args.run_one, work_dir)
    write_seconds = time.perf_counter() - started

    stages, state = {}, {}

    def stage(name, function):
        with PeakMemory() as memory:
            started = time.perf_counter()
            state[name] = function()
            seconds = time.perf_counter() - started
        stages[name] = dict(seconds=seconds, peak_rss_gib=memory.peak / 2**30)
        print(f"  {name}: {seconds:,.1f} s, peak {memory.peak / 2**30:.2f} GiB", file=sys.stderr, flush=True)

    stage("load", lambda: load_parallel_corpus("en", "de", source_file=source_file, target_file=target_file))
    pairs = state["load"]
    sample = sample_pairs(pairs, args.tokenizer_train_pairs)  # as the train command does
    stage("tokenizer", lambda: train_tokenizer(pair_texts(sample, "en", "de"), vocab_size=args.vocab_size,
                                               show_progress=False))
    tokenizer = state["tokenizer"]
    num_proc = args.num_proc or default_num_proc(len(pairs))
    # As the train command does: pairs over 256 tokens on either side are dropped as they are tokenized.
    def tokenize():
        with single_threaded_tokenizers(num_proc):  # as the train command does
            return pairs.map(tokenize_pairs(tokenizer, "en", "de", 256, 256), batched=True, num_proc=num_proc,
                             remove_columns=["translation"], desc="tokenizing")

    stage("tokenize", tokenize)
    kept = state["tokenize"]

    def batches():
        sampler = TokenBatchSampler.from_dataset(kept, args.max_tokens, shuffle=True, seed=0)
        sampler.set_epoch(0)
        return list(sampler)

    stage("batch", batches)

    def training_step():
        # A model (the paper's base size by default) on the epoch's first batch: the batches reach a training step.
        config = VanillaTransformerConfig.from_preset(args.step_preset, vocab_size=len(tokenizer))
        model = VanillaTransformerForConditionalGeneration(config).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        first = state["batch"][0]
        step_tokens = args.max_tokens // 4  # a quarter batch keeps a CPU step's memory and time small
        rows = kept.select(first[: max(1, len(first) * step_tokens // args.max_tokens)])
        batch = DataCollatorForSeq2Seq(tokenizer, model=model)([dict(row) for row in rows])
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        return loss.item()

    stage("step", training_step)
    import pyarrow.compute as pc  # installed with datasets

    columns = kept.with_format("arrow")
    return dict(
        pairs=args.run_one,
        kept_pairs=len(kept),
        source_tokens=int(pc.sum(pc.list_value_length(columns["input_ids"])).as_py()),
        target_tokens=int(pc.sum(pc.list_value_length(columns["labels"])).as_py()),
        batches=len(state["batch"]),
        write_seconds=write_seconds,
        num_proc=num_proc or 1,
        tokenizer_pairs=len(sample),
        stages=stages,
        data_seconds=sum(stage["seconds"] for name, stage in stages.items() if name != "step"),
        data_peak_rss_gib=max(stage["peak_rss_gib"] for name, stage in stages.items() if name != "step"),
    )


if __name__ == "__main__":
    main()
