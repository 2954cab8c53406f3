"""Section 5.4's label-smoothed cross-entropy as the Trainer computes it, forward and backward, on the logits of real
Multi30k token batches: the package's `ChunkedLabelSmoothedCrossEntropy` against torch's `cross_entropy(label_smoothing=
0.1)`, the loss `TokenBatchSeq2SeqTrainer` used before (and still uses on a GPU).

Two settings, each timed on the same logits for both losses, in alternating rounds in one process:
- bf16: logits as autocast's bfloat16 matmul leaves them. Before, accelerate copied the model's outputs to float32 and
  torch's loss read that copy; the copy and its backward are part of the old path's time. The chunked loss reads the
  bfloat16 logits and writes a bfloat16 gradient.
- fp32: float32 logits (training without --bf16), the same loss on both sides, no copy.
The logits are random (their values do not change the work); their shapes and the ignored (padding) labels are those
of the first `--steps` batches of ~`--max-tokens` tokens of a shuffled epoch, as in `train_throughput.py`.

    python benchmarks/loss_speed.py --max-tokens 2048      # the Multi30k cpu recipe's batches
    python benchmarks/loss_speed.py --smoke
"""

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

from common import add_common_arguments, environment, environment_lines, load_tokenizer, markdown_table
from train_throughput import LABEL_SMOOTHING, SMOKE_PAIRS, training_batches
from vanilla_transformer.training.cpu_speedups import ChunkedLabelSmoothedCrossEntropy


def torch_loss(logits: torch.Tensor, labels: torch.Tensor, copy_to_float32: bool) -> torch.Tensor:
    logits = logits.float() if copy_to_float32 else logits  # accelerate's `convert_outputs_to_fp32`
    return F.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=LABEL_SMOOTHING, reduction="sum")


def chunked_loss(logits: torch.Tensor, labels: torch.Tensor, copy_to_float32: bool) -> torch.Tensor:
    return ChunkedLabelSmoothedCrossEntropy.apply(logits, labels, LABEL_SMOOTHING, -100)


LOSSES = {"torch cross_entropy": torch_loss, "chunked (package)": chunked_loss}
SETTINGS = {"bf16": torch.bfloat16, "fp32": torch.float32}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)  # --repeats is the number of rounds per loss
    parser.add_argument("--max-tokens", type=int, default=2048, help="tokens per batch, padding included (2048)")
    parser.add_argument("--steps", type=int, default=10, help="batches per round (10)")
    parser.add_argument("--pairs", type=int, default=None, help="bucket only the first PAIRS training pairs")
    args = parser.parse_args(argv)
    args.repeats = max(args.repeats, 2)
    if args.smoke:
        args.max_tokens, args.steps, args.repeats = 1024, 2, 2
        args.pairs, args.threads = args.pairs or SMOKE_PAIRS, args.threads or 1
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args)
    labels = [torch.from_numpy(batch["labels"]).flatten() for batch in training_batches(args, tokenizer)]
    generator = torch.Generator().manual_seed(args.seed)
    logits = {setting: [torch.randn(len(row), len(tokenizer), generator=generator).to(dtype) for row in labels]
              for setting, dtype in SETTINGS.items()}

    times_ms = {setting: {name: [] for name in LOSSES} for setting in SETTINGS}
    checks = {}
    progress = tqdm(total=len(SETTINGS) * len(LOSSES) * (args.repeats + 1), desc="rounds", file=sys.stderr)
    for setting in SETTINGS:
        for round_index in range(args.repeats + 1):  # round 0 warms up
            order = list(LOSSES) if round_index % 2 == 0 else list(LOSSES)[::-1]
            for name in order:
                start = time.perf_counter()
                for batch_logits, batch_labels in zip(logits[setting], labels):
                    batch_logits = batch_logits.detach().requires_grad_()
                    LOSSES[name](batch_logits, batch_labels, copy_to_float32=setting == "bf16").backward()
                if round_index:
                    times_ms[setting][name].append((time.perf_counter() - start) / len(labels) * 1e3)
                progress.update()
        # Both losses agree on the first batch: the benchmark times the same computation.
        values = [LOSSES[name](logits[setting][0], labels[0], setting == "bf16").item() for name in LOSSES]
        checks[setting] = dict(zip(LOSSES, values))
        if not math.isclose(*values, rel_tol=1e-4):
            raise SystemExit(f"{setting}: the losses differ ({values}); nothing to compare")
    progress.close()

    medians = {s: {n: statistics.median(t) for n, t in per_loss.items()} for s, per_loss in times_ms.items()}
    speedups = {s: medians[s]["torch cross_entropy"] / medians[s]["chunked (package)"] for s in SETTINGS}
    rows = [[setting, name, f"{medians[setting][name]:.1f} ({min(t):.1f}-{max(t):.1f})",
             f"{speedups[setting]:.2f}x" if name == "chunked (package)" else ""]
            for setting in SETTINGS for name, t in times_ms[setting].items()]
    mean_rows = statistics.mean(len(row) for row in labels)
    env = environment()
    print("## Label-smoothed cross-entropy (0.1), forward and backward, as the Trainer computes it\n")
    print("\n".join(environment_lines(env)))
    print(f"- {len(labels)} batches of <= {args.max_tokens:,} tokens ({mean_rows:,.0f} target positions on average, "
          f"padding included) x vocabulary {len(tokenizer):,}; {args.repeats} rounds per loss, alternating\n")
    print(markdown_table(["logits", "loss", "ms per batch, median (min-max)", "speed-up"], rows))
    if args.json is not None:
        settings = dict(max_tokens=args.max_tokens, steps=args.steps, rounds=args.repeats, vocab_size=len(tokenizer),
                        mean_rows=mean_rows, smoke=args.smoke)
        args.json.write_text(json.dumps(dict(environment=env, settings=settings, times_ms=times_ms,
                                             speedups=speedups, first_batch_losses=checks), indent=2) + "\n")


if __name__ == "__main__":
    main()
