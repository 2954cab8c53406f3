"""Training steps per second of a Multi30k recipe's `train` command (`cpu` by default, `base` for a GPU), for one or
more source trees of this project side by side: rounds alternate between the trees, so machine noise hits all alike.
It is how a change to the model or the training code is checked for a slower training step (docs/speed.md).

Each round runs `vanilla-transformer train` with the recipe's flags (examples/multi30k/run.py) for `--steps` steps in a
fresh process whose `vanilla_transformer` is the tree's `src/`, without evaluation or checkpoints, and reads the
Trainer's `train_steps_per_second` (the whole run, its first steps included) and the steady state: steps/s from step
`--steady-from` to the last, the device synchronised at both ends. Flags this script does not know go to `train`
after the recipe's (the later wins).

In the same process, after the command, the bare step: the command's own model (compiled if the command compiled
it), loss and fused Adam, run forward, backward, optimizer step and zero_grad on the batches the command trained on
in its steady state, in the same order, with nothing of the Trainer around them (no data loader, callbacks,
scheduler or logging). For both: real (not padding) target tokens per second, and the model FLOPs utilisation (MFU),
the model's FLOPs per second (`training_flops`) as a share of the device's peak: the dense bfloat16 peak of
`PEAK_BF16_TFLOPS` on a GPU it names, or `--peak-tflops` (on a CPU, MFU only with `--peak-tflops`).

    git worktree add ../before HEAD~1
    python benchmarks/recipe_speed.py --trees ../before . --steps 300 --rounds 2
    python benchmarks/recipe_speed.py --recipe base --device cuda --trees ../before . --steps 200 --rounds 1  # a GPU
    python benchmarks/recipe_speed.py --recipe base --steps 200 --dataloader_num_workers 2        # flags for train
    python benchmarks/recipe_speed.py --recipe tiny --steps 150 --variant all= \
        --variant no-dropout16="--cpu_speedups keep_memory chunked_loss"                  # train flags compared too
    python benchmarks/recipe_speed.py --trees . --smoke
"""

import argparse
import gzip
import importlib.util
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = (REPO / ".." / "shared" / "data" / "multi30k").resolve()
# The subprocess: `train` with a callback that times the steady state, given to whichever Trainer `train` builds.
RUN = """
import json, sys, time
from contextlib import nullcontext
import torch
import vanilla_transformer
import vanilla_transformer.train_run.run as command
import transformers
from transformers import TrainerCallback
print(vanilla_transformer.__file__)
steady_from, bare, out = int(sys.argv[1]), sys.argv[2] == "bare", sys.argv[3]
times, batches = {}, []
def synchronize():
    if torch.cuda.is_available():
        torch.cuda.synchronize()
class SteadyClock(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in (steady_from, state.max_steps):
            synchronize()
            times[state.global_step] = time.perf_counter()
trainer_init, training_step = transformers.Trainer.__init__, transformers.Trainer.training_step
def observed_init(self, *args, callbacks=None, **kwargs):
    trainer_init(self, *args, callbacks=[*(callbacks or []), SteadyClock()], **kwargs)
def recorded_step(self, model, inputs, *args, **kwargs):
    if self.state.global_step >= steady_from:  # a step of the steady state: its batch, kept for the bare step
        batches.append(dict(inputs))
    return training_step(self, model, inputs, *args, **kwargs)
transformers.Trainer.__init__ = observed_init
transformers.Trainer.training_step = recorded_step
trainer = command.main(sys.argv[4:])
last = trainer.state.global_step
steady = (last - steady_from) / (times[last] - times[steady_from]) if last > steady_from else None
result = dict(steady_steps_per_second=steady, steady_steps=len(batches), bare_steps_per_second=None)
if bare and batches:
    model, optimizer = trainer.model_wrapped, trainer.optimizer
    speedups = getattr(trainer, "speedups", ())
    dropout = nullcontext
    if "dropout16" in speedups:  # the Trainer's steps run the 16-bit CPU dropout
        from vanilla_transformer.training.cpu_speedups import CPU16BitDropout as dropout
    def bare_step(batch):
        with dropout():
            loss = trainer.compute_loss(model, dict(batch), num_items_in_batch=(batch["labels"] != -100).sum())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.train()
    for batch in batches[:3]:  # warm-up: the shapes are compiled already, the optimizer's state exists
        bare_step(batch)
    synchronize()
    start = time.perf_counter()
    for batch in batches:
        bare_step(batch)
    synchronize()
    result["bare_steps_per_second"] = len(batches) / (time.perf_counter() - start)
# Real lengths of every pair of the steady state's batches: what the FLOPs and tokens are counted from.
sums = dict(source=0, target=0, source_squared=0, target_squared=0, source_target=0)
for batch in batches:
    source = batch["attention_mask"].sum(1).double()
    target = (batch["labels"] != -100).sum(1).double()
    for name, values in dict(source=source, target=target, source_squared=source**2, target_squared=target**2,
                             source_target=source * target).items():
        sums[name] += float(values.sum())
config = trainer.model.config
result.update(sums=sums, device=torch.cuda.get_device_name() if trainer.args.device.type == "cuda" else "cpu",
              bf16=bool(trainer.args.bf16), torch_compile=bool(trainer.args.torch_compile),
              pad_to_multiple_of=getattr(trainer.data_collator, "pad_to_multiple_of", None),
              config={name: getattr(config, name) for name in ("d_model", "encoder_layers", "decoder_layers",
                                                                "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size")})
json.dump(result, open(out, "w"))
"""

# Dense bfloat16 matrix-product peaks in TFLOP/s, by a part of `torch.cuda.get_device_name()`, the first that
# matches (the vendors' datasheets, without sparsity). Measured products reach less; MFU is conventionally stated
# against the datasheet's peak.
PEAK_BF16_TFLOPS = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4), ("H200", 989.4),
                    ("A100", 312.0), ("L40S", 362.1), ("L4", 121.0)]


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU named `device_name`, None for one (or a CPU) not in `PEAK_BF16_TFLOPS`."""
    return next((peak for part, peak in PEAK_BF16_TFLOPS if part in device_name), None)


def training_flops(config: dict, sums: dict) -> float:
    """Model FLOPs of forward and backward (3 x the forward's matrix products, 2 FLOPs a multiply-add) over pairs
    whose real lengths s (source) and t (target) give `sums`: s, t, s^2, t^2 and s * t, each summed over the pairs.
    Padding is not counted: it is compute the model does not need. With d = d_model, f = d_ff and V the vocabulary:

    - the "6 x parameters x tokens" part: per encoder layer 6 (4 d^2 + 2 d f) per source token (Q, K, V, output
      projections, the FFN); per decoder layer 6 (6 d^2 + 2 d f) per target token (self-attention's four projections,
      cross-attention's query and output, the FFN) and 6 x 2 d^2 per source token (cross-attention's keys and values,
      projected from the encoder output); the output projection, 6 d V per target token (its matrix is the embedding
      matrix, but it is a product all the same; the embedding lookups are not);
    - the attention term, Q K^T and the weights times V: 12 d s^2 per encoder layer and pair, 12 d (t^2 + s t) per
      decoder layer and pair; the decoder's causal self-attention counted whole, as PaLM's MFU counts it.
    """
    d, vocab = config["d_model"], config["vocab_size"]
    encoder = config["encoder_layers"] * (
        sums["source"] * 2 * (4 * d * d + 2 * d * config["encoder_ffn_dim"]) + 4 * d * sums["source_squared"])
    decoder = config["decoder_layers"] * (
        sums["target"] * 2 * (6 * d * d + 2 * d * config["decoder_ffn_dim"]) + sums["source"] * 2 * 2 * d * d
        + 4 * d * (sums["target_squared"] + sums["source_target"]))
    return 3 * (encoder + decoder + sums["target"] * 2 * d * vocab)


def recipe_flags(recipe: str = "cpu") -> list[str]:
    """A recipe's flags, as examples/multi30k/run.py gives them to `train`."""
    spec = importlib.util.spec_from_file_location("multi30k_run", REPO / "examples" / "multi30k" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.SIZES[recipe])


def run_once(tree: Path, flags: list[str], output_dir: Path, steady_from: int, bare: bool) -> dict:
    """One round of `train` in a fresh process: the run's `train_steps_per_second` (`whole`), its steady-state steps/s
    and, with `bare`, the bare step's, with what tokens and FLOPs are counted from."""
    steady_file = output_dir.with_suffix(".steady.json")
    result = subprocess.run(
        [sys.executable, "-c", RUN, str(steady_from), "bare" if bare else "command", str(steady_file), *flags,
         "--output_dir", str(output_dir)],
        # The tree's package first; anything already on PYTHONPATH (packages installed beside the interpreter's) after.
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tree / "src"), os.environ.get("PYTHONPATH")]))),
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        sys.exit(f"{tree}: train failed:\n{result.stderr[-3000:]}")
    loaded_from = Path(result.stdout.splitlines()[0]).resolve()
    if (tree / "src").resolve() not in loaded_from.parents:
        sys.exit(f"{tree}: the subprocess imported vanilla_transformer from {loaded_from}, not from the tree")
    whole = json.loads((output_dir / "train_results.json").read_text())["train_steps_per_second"]
    return dict(json.loads(steady_file.read_text()), whole_steps_per_second=whole)


def rates(run: dict, peak: float | None) -> dict:
    """A round's target tokens/s and MFU, in the steady state and for the bare step (None where not measured)."""
    steps = run["steady_steps"]
    tokens_per_step = run["sums"]["target"] / steps if steps else None
    flops_per_step = training_flops(run["config"], run["sums"]) / steps if steps else None
    out = {}
    for mode in ("steady", "bare"):
        steps_per_second = run[f"{mode}_steps_per_second"]
        measured = steps_per_second is not None and steps
        out[f"{mode}_target_tokens_per_second"] = tokens_per_step * steps_per_second if measured else None
        out[f"{mode}_mfu"] = flops_per_step * steps_per_second / (peak * 1e12) if measured and peak else None
    return out


def median_of(values: list, form: str = "{:.3f}") -> str:
    values = [value for value in values if value is not None]
    return form.format(statistics.median(values)) if values else "-"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", type=Path, nargs="+", default=[REPO], help="source trees to compare (default: this)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="Multi30k folder (train.{en,de}.gz)")
    parser.add_argument("--steps", type=int, default=300, help="training steps per round (300)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per tree, alternating (2)")
    parser.add_argument("--recipe", default="cpu", choices=["cpu", "tiny", "base"],
                        help="Multi30k recipe size (default cpu)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None,
                        help="train on this device (--use_cpu for train); default: the recipe's (cpu and tiny: the "
                             "CPU, base: a GPU where there is one)")
    parser.add_argument("--steady-from", type=int, default=20, help="the steady state starts after this step (20)")
    parser.add_argument("--bare", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the bare step on the steady state's batches (default: yes)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's peak in TFLOP/s, for MFU (default: the dense bf16 peak of a GPU named in "
                             "PEAK_BF16_TFLOPS; on a CPU, no MFU)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                        help="compare `train` flags too: each tree runs once a round with each variant's flags "
                             "(after the others; repeat the option; FLAGS may be empty)")
    parser.add_argument("--json", type=Path, default=None, help="also write every round's measurements to this file")
    parser.add_argument("--smoke", action="store_true", help="tiny model, a few steps: checks the script only")
    args, train_flags = parser.parse_known_args(argv)
    variants = dict(variant.split("=", 1) for variant in args.variant) or {"": ""}

    flags = recipe_flags(args.recipe)
    if args.device is not None:
        flags += ["--use_cpu", str(args.device == "cpu").lower()]
    scratch = Path(tempfile.mkdtemp(prefix="recipe_speed-"))
    data = args.data_dir
    if args.smoke:  # a tiny model on the first 200 pairs
        flags += ["--preset", "tiny", "--d_model", "32", "--heads", "4", "--ffn_dim", "64", "--layers", "1",
                  "--vocab_size", "300"]
        args.steps, args.rounds, args.steady_from, data = 4, 1, 1, scratch / "data"
        data.mkdir()
        for lang in ("en", "de"):
            lines = gzip.open(args.data_dir / f"train.{lang}.gz", "rt", encoding="utf-8").readlines()[:200]
            with gzip.open(data / f"train.{lang}.gz", "wt", encoding="utf-8") as file:
                file.writelines(lines)
    flags += [
        "--source_file", str(data / "train.en.gz"), "--target_file", str(data / "train.de.gz"),
        "--source_lang", "en", "--target_lang", "de", "--max_steps", str(args.steps),
        "--save_strategy", "no", "--eval_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
    ]
    if not args.smoke:
        flags += ["--vocab_size", "8000"]
    flags += train_flags
    runs = [(tree, name) for tree in args.trees for name in variants]
    rounds = {run: [] for run in runs}

    def save(complete: bool) -> None:
        """The rounds so far, in --json: a run cut short still leaves the rounds it finished."""
        if args.json is None:
            return
        results = [dict(tree=str(tree), variant=name, rounds=rounds[tree, name]) for tree, name in runs]
        args.json.write_text(json.dumps(dict(recipe=args.recipe, steps=args.steps, steady_from=args.steady_from,
                                             peak_tflops=peak, train_flags=train_flags, variants=variants,
                                             complete=complete, results=results), indent=2) + "\n")

    peak = args.peak_tflops
    try:
        with tqdm(total=args.rounds * len(runs), desc="rounds") as bar:
            for round_index in range(args.rounds):
                order = runs if round_index % 2 == 0 else runs[::-1]
                for run_index, (tree, name) in enumerate(order):
                    output_dir = scratch / f"run-{round_index}-{run_index}"
                    run_flags = flags + shlex.split(variants[name])
                    run = run_once(tree, run_flags, output_dir, args.steady_from, args.bare)
                    peak = peak or peak_tflops(run["device"])
                    rounds[tree, name].append(dict(run, **rates(run, peak)))
                    save(complete=False)
                    bar.update()
    finally:
        shutil.rmtree(scratch)
    save(complete=True)
    print(report(args, train_flags, runs, rounds, peak))


def report(args, train_flags: list[str], runs: list, rounds: dict, peak: float | None) -> str:
    first_round = rounds[runs[0]][0]
    extra = f", train flags {' '.join(train_flags)}" if train_flags else ""
    if peak:
        mfu = f"MFU: model FLOPs (`training_flops`) per second over a peak of {peak:g} TFLOP/s"
    else:
        mfu = "no MFU (no peak known for this device: --peak-tflops)"
    settings = (f"Multi30k {args.recipe} recipe{extra}, {args.steps} steps a round, {args.rounds} rounds per run, "
                f"alternating; steady state from step {args.steady_from}; device: {first_round['device']}; {mfu}")
    lines = [settings, ""]
    header = ["tree", "variant", "steps/s, whole run, each round", "median", "steady steps/s, each round", "median",
              "bare steps/s, median", "steady / bare", "target tok/s, steady", "target tok/s, bare", "MFU, steady",
              "MFU, bare"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for tree, name in runs:
        column = {key: [run[key] for run in rounds[tree, name] if run[key] is not None] for key in rounds[tree, name][0]}
        steady, bare = (statistics.median(column[key]) if column[key] else None
                        for key in ("steady_steps_per_second", "bare_steps_per_second"))
        cells = [
            os.path.relpath(tree), name or "-", ", ".join(f"{value:.3f}" for value in column["whole_steps_per_second"]),
            median_of(column["whole_steps_per_second"]),
            ", ".join(f"{value:.3f}" for value in column["steady_steps_per_second"]), median_of([steady]),
            median_of([bare]), f"{steady / bare:.3f}" if steady and bare else "-",
            median_of(column["steady_target_tokens_per_second"], "{:,.0f}"),
            median_of(column["bare_target_tokens_per_second"], "{:,.0f}"),
            median_of([100 * value for value in column["steady_mfu"]], "{:.1f}%"),
            median_of([100 * value for value in column["bare_mfu"]], "{:.1f}%"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if len(runs) > 1:
        def medians(run, key):
            return statistics.median([value for value in (r[key] for r in rounds[run]) if value is not None] or [0])

        for run in runs[1:]:
            label = " ".join(part for part in (os.path.relpath(run[0]), run[1]) if part)
            reference = " ".join(part for part in (os.path.relpath(runs[0][0]), runs[0][1]) if part)
            whole = medians(run, "whole_steps_per_second") / medians(runs[0], "whole_steps_per_second")
            steady_reference = medians(runs[0], "steady_steps_per_second")
            steady = f", {medians(run, 'steady_steps_per_second') / steady_reference:.3f}x (steady)" if (
                steady_reference) else ""
            lines.append(f"{label} / {reference}: {whole:.3f}x (whole run){steady}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
