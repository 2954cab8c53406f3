"""Training steps per second of a Multi30k recipe's `train` command (`cpu` by default, `base` for a GPU), for one or
more source trees of this project side by side: rounds alternate between the trees, so machine noise hits all alike.
It is how a change to the model or the training code is checked for a slower training step (docs/speed.md).

Each round runs `vanilla-transformer train` with the recipe's flags (examples/multi30k/run.py) for `--steps` steps in a
fresh process whose `vanilla_transformer` is the tree's `src/`, without evaluation or checkpoints, and reads the
Trainer's `train_steps_per_second` (the whole run, its first steps included) and the steady state: steps/s from step
`--steady-from` to the last, the device synchronised at both ends. Flags this script does not know go to `train`
after the recipe's (the later wins).

    git worktree add ../before HEAD~1
    python benchmarks/recipe_speed.py --trees ../before . --steps 300 --rounds 2
    python benchmarks/recipe_speed.py --recipe base --trees ../before . --steps 200 --rounds 1   # a GPU
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
import torch
import vanilla_transformer
import vanilla_transformer.train as command
import transformers
from transformers import TrainerCallback
print(vanilla_transformer.__file__)
steady_from, out = int(sys.argv[1]), sys.argv[2]
times = {}
class SteadyClock(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in (steady_from, state.max_steps):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[state.global_step] = time.perf_counter()
trainer_init = transformers.Trainer.__init__
def observed_init(self, *args, callbacks=None, **kwargs):
    trainer_init(self, *args, callbacks=[*(callbacks or []), SteadyClock()], **kwargs)
transformers.Trainer.__init__ = observed_init
trainer = command.main(sys.argv[3:])
last = trainer.state.global_step
steady = (last - steady_from) / (times[last] - times[steady_from]) if last > steady_from else None
json.dump(dict(steady_steps_per_second=steady), open(out, "w"))
"""


def recipe_flags(recipe: str = "cpu") -> list[str]:
    """A recipe's flags, as examples/multi30k/run.py gives them to `train`."""
    spec = importlib.util.spec_from_file_location("multi30k_run", REPO / "examples" / "multi30k" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.SIZES[recipe])


def steps_per_second(tree: Path, flags: list[str], output_dir: Path, steady_from: int) -> tuple[float, float | None]:
    """The run's `train_steps_per_second` and its steady-state steps/s."""
    steady_file = output_dir.with_suffix(".steady.json")
    result = subprocess.run(
        [sys.executable, "-c", RUN, str(steady_from), str(steady_file), *flags, "--output_dir", str(output_dir)],
        env=dict(os.environ, PYTHONPATH=str(tree / "src")),
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        sys.exit(f"{tree}: train failed:\n{result.stderr[-3000:]}")
    loaded_from = Path(result.stdout.splitlines()[0]).resolve()
    if (tree / "src").resolve() not in loaded_from.parents:
        sys.exit(f"{tree}: the subprocess imported vanilla_transformer from {loaded_from}, not from the tree")
    whole = json.loads((output_dir / "train_results.json").read_text())["train_steps_per_second"]
    return whole, json.loads(steady_file.read_text())["steady_steps_per_second"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", type=Path, nargs="+", default=[REPO], help="source trees to compare (default: this)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="Multi30k folder (train.{en,de}.gz)")
    parser.add_argument("--steps", type=int, default=300, help="training steps per round (300)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per tree, alternating (2)")
    parser.add_argument("--recipe", default="cpu", choices=["cpu", "tiny", "base"],
                        help="Multi30k recipe size (default cpu)")
    parser.add_argument("--steady-from", type=int, default=20, help="the steady state starts after this step (20)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                        help="compare `train` flags too: each tree runs once a round with each variant's flags "
                             "(after the others; repeat the option; FLAGS may be empty)")
    parser.add_argument("--smoke", action="store_true", help="tiny model, a few steps: checks the script only")
    args, train_flags = parser.parse_known_args(argv)
    variants = dict(variant.split("=", 1) for variant in args.variant) or {"": ""}

    flags = recipe_flags(args.recipe)
    scratch = Path(tempfile.mkdtemp(prefix="recipe_speed-"))
    data = args.data_dir
    if args.smoke:  # a tiny model on the first 200 pairs
        flags += ["--preset", "tiny", "--d_model", "32", "--heads", "4", "--ffn_dim", "64", "--layers", "1",
                  "--vocab_size", "300"]
        args.steps, args.rounds, args.steady_from, data = 3, 1, 1, scratch / "data"
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
    speeds = {run: [] for run in runs}
    steady = {run: [] for run in runs}
    try:
        with tqdm(total=args.rounds * len(runs), desc="rounds") as bar:
            for round_index in range(args.rounds):
                order = runs if round_index % 2 == 0 else runs[::-1]
                for run_index, (tree, name) in enumerate(order):
                    output_dir = scratch / f"run-{round_index}-{run_index}"
                    run_flags = flags + shlex.split(variants[name])
                    whole, steady_state = steps_per_second(tree, run_flags, output_dir, args.steady_from)
                    speeds[tree, name].append(whole)
                    steady[tree, name].append(steady_state)
                    bar.update()
    finally:
        shutil.rmtree(scratch)
    extra = f", train flags {' '.join(train_flags)}" if train_flags else ""
    print(f"Multi30k {args.recipe} recipe{extra}, {args.steps} steps a round, {args.rounds} rounds per run, "
          f"alternating; steady state from step {args.steady_from}\n")
    print("| tree | variant | steps/s, whole run, each round | median | steady steps/s, each round | median |")
    print("|---|---|---|---|---|---|")
    for (tree, name), values in speeds.items():
        steadies = [value for value in steady[tree, name] if value is not None]
        steady_median = f"{statistics.median(steadies):.3f}" if steadies else "-"
        print(f"| {os.path.relpath(tree)} | {name or '-'} | "
              f"{', '.join(f'{v:.3f}' for v in values)} | {statistics.median(values):.3f} "
              f"| {', '.join(f'{v:.3f}' for v in steadies)} | {steady_median} |")
    if len(runs) > 1:
        first = statistics.median(speeds[runs[0]])
        for run in runs[1:]:
            label = " ".join(part for part in (os.path.relpath(run[0]), run[1]) if part)
            reference = " ".join(part for part in (os.path.relpath(runs[0][0]), runs[0][1]) if part)
            print(f"{label} / {reference}: {statistics.median(speeds[run]) / first:.3f}x (whole run)")


if __name__ == "__main__":
    main()
