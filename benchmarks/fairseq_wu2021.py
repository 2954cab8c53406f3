"""fairseq on Wu et al.'s (2021) Multi30k recipe, on the files of a `examples/multi30k/run.py --size wu2021` run:
the same prepared text and the run's own subwords, so that between that run and this one only the toolkit changes.

    python benchmarks/fairseq_wu2021.py prepare --run runs/wu2021/seed-0 --work runs/fairseq-wu2021
    python benchmarks/fairseq_wu2021.py train --work runs/fairseq-wu2021 --seed 0 [-- FAIRSEQ-TRAIN FLAGS]
    python benchmarks/fairseq_wu2021.py score --work runs/fairseq-wu2021 --seed 0
    python benchmarks/fairseq_wu2021.py curves --work runs/fairseq-wu2021 --seed 0 --ours runs/wu2021/seed-0 \
        runs/wu2021/seed-1 --plot docs/images/wu2021_validation_loss.png

`prepare` writes the run's prepared splits as the run's tokenizer splits them (its pieces, space-separated) and
binarizes them with `fairseq-preprocess --joined-dictionary`. `train` is their README-baseline.md run with the tiny
settings both toolkits share (`fairseq_side_by_side.TINY`, ~8,192-token batches): a validation and a checkpoint every
epoch, stopped after 10 epochs without a better validation loss (`--patience 10`) or at 8,000 updates; run again,
it continues from the run's last checkpoint. `score` does what their evaluate.sh does: the last 10 epoch checkpoints
averaged, beam 5, at most 200 tokens; the length penalty (fairseq's `--lenpen`, score / length ** alpha) is chosen on
the validation set among the recipe's candidates, as our runs choose theirs, and the test set is also decoded with
fairseq's default 1.0, theirs. BLEU: fairseq's on the tokenized, lowercased text as it is, sacreBLEU and the
lowercased Moses-tokenized BLEU, written to the run's results.md and results.json. `curves` sets the validation loss
of each epoch beside our runs' (a table, and a plot with --plot): both label-smoothed, fairseq's in nats, not bits.

fairseq runs from its own venv (`benchmarks/fairseq_install.sh`); it is never a dependency of the package.
"""

import argparse
import importlib.util
import json
import math
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]


def module(name: str, path: Path):
    """A script of this repository as a module (benchmarks/ and examples/ are no packages)."""
    spec = importlib.util.spec_from_file_location(name, path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


side_by_side = module("fairseq_side_by_side", ROOT / "benchmarks" / "fairseq_side_by_side.py")
recipe = module("multi30k_run", ROOT / "examples" / "multi30k" / "run.py")

PATIENCE, MAX_UPDATES, AVERAGE_LAST, BEAM, MAX_LENGTH = 10, 8000, 10, 5, 200


def prepare(args) -> None:
    """The run's tokenizer and prepared text, as pieces and as fairseq's binarized data, in --work."""
    run_dir, work = Path(args.run), Path(args.work)
    if not (run_dir / "tokenizer" / "tokenizer.json").is_file() or not (run_dir / "prepared").is_dir():
        sys.exit(f"{run_dir} holds no tokenizer/ and prepared/: run examples/multi30k/run.py --size wu2021 first")
    work.mkdir(parents=True, exist_ok=True)
    shutil.copytree(run_dir / "tokenizer", work / "tokenizer", dirs_exist_ok=True)
    (work / "prepared_from.json").write_text(json.dumps(dict(prepared=str(run_dir / "prepared"))) + "\n")
    side_by_side.prepare(SimpleNamespace(work=work, data_dir=run_dir / "prepared", vocab_size=None,
                                         fairseq_venv=args.fairseq_venv))


def run_folder(args) -> Path:
    """The fairseq run of seed --seed in --work."""
    return Path(args.work) / f"fairseq-s{args.seed}"


def train_command(args) -> list:
    """fairseq-train as Wu et al. ran it, with the tiny settings both toolkits share; flags after `--` last."""
    return [*side_by_side.fairseq_train_tiny(args, Path(args.work) / "fairseq-bin", run_folder(args)),
            "--max-update", MAX_UPDATES, "--patience", PATIENCE, "--keep-last-epochs", AVERAGE_LAST, *args.extra]


def train(args) -> None:
    out = run_folder(args)
    out.mkdir(parents=True, exist_ok=True)
    # fairseq continues from OUT/checkpoint_last.pt when it is there: the same command resumes a stopped run (its
    # patience counts anew from there: fairseq keeps the best loss in the checkpoint, not the epochs since).
    side_by_side.run(train_command(args), log=out / "train.log", append=True)


def epoch_checkpoints(run_dir: Path, count: int) -> list[Path]:
    """The last `count` epoch checkpoints (checkpointN.pt) of a fairseq run, oldest first, as fairseq's
    `average_checkpoints.py --num-epoch-checkpoints` picks them."""
    epochs = {int(path.stem[len("checkpoint"):]): path for path in run_dir.glob("checkpoint*.pt")
              if path.stem[len("checkpoint"):].isdigit()}
    if not epochs:
        sys.exit(f"{run_dir} holds no epoch checkpoints (checkpointN.pt): train first")
    return [epochs[epoch] for epoch in sorted(epochs)[-count:]]


def scores(hypotheses: list[str], references: list[str]) -> dict:
    from vanilla_transformer.inference.metrics import score_translations

    result = score_translations(hypotheses, references, moses_lang=side_by_side.TARGET)
    return dict(bleu_tokenized=recipe.tokenized_bleu(hypotheses, references),
                **{key: result[key] for key in ("bleu", "bleu_bp", "bleu_lc_moses", "chrf")})


def score(args) -> None:
    work, run_dir = Path(args.work), run_folder(args)
    checkpoints = epoch_checkpoints(run_dir, AVERAGE_LAST)
    averaged = side_by_side.average_fairseq_checkpoints(args, checkpoints, run_dir / "checkpoint_last10_avg.pt")
    prepared = Path(args.prepared or json.loads((work / "prepared_from.json").read_text())["prepared"])
    references = {split: side_by_side.read_gzip_lines(prepared / f"{name}.{side_by_side.TARGET}.gz")
                  for split, name in (("valid", "val"), ("test", "test_2016_flickr"))}

    def decode(split: str, lenpen: float) -> dict:
        hypotheses = side_by_side.fairseq_translations(args, work, averaged, subset=split, beam=BEAM, lenpen=lenpen,
                                                       max_len=(0, MAX_LENGTH))
        result = scores(hypotheses, references[split])
        print(f"{split}, beam {BEAM}, lenpen {lenpen:g}: BLEU {result['bleu']:.2f}, on the text as it is "
              f"{result['bleu_tokenized']:.2f}, brevity penalty {result['bleu_bp']:.3f}", flush=True)
        return dict(lenpen=lenpen, **result)

    # As our runs choose alpha: sacreBLEU on the whole validation set, the first of equals.
    trials = [decode("valid", lenpen) for lenpen in recipe.LENGTH_PENALTIES]
    chosen = max(trials, key=lambda trial: trial["bleu"])["lenpen"]
    tests = [decode("test", lenpen) for lenpen in dict.fromkeys([chosen, 1.0])]
    names = [path.name for path in checkpoints]
    results = dict(checkpoints=names, beam=BEAM, chosen_lenpen=chosen, validation=trials, test=tests)
    (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    table = [f"test_2016_flickr, fairseq, the average of {names[0]}-{names[-1]}, beam {BEAM}:", "",
             "| lenpen | BLEU (the tokenized text as it is, fairseq's) | sacreBLEU "
             "| BLEU (lowercased, Moses-tokenized) | chrF | brevity penalty |", "| --- | --- | --- | --- | --- | --- |"]
    table += [f"| {test['lenpen']:g}{' (chosen on validation)' if test['lenpen'] == chosen else ''} | "
              f"{test['bleu_tokenized']:.2f} | {test['bleu']:.2f} | {test['bleu_lc_moses']:.2f} | {test['chrf']:.2f} | "
              f"{test['bleu_bp']:.3f} |" for test in tests]
    (run_dir / "results.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


def fairseq_validation_losses(run_dir: Path) -> dict[int, float]:
    """Each epoch's validation loss (label-smoothed) in a fairseq run's log, in nats, the last record of an epoch kept
    (a resumed run validates an epoch again)."""
    return {int(record["epoch"]): float(record["valid_loss"]) * math.log(2)
            for record in side_by_side.fairseq_log_records(run_dir) if "valid_loss" in record}


def our_validation_losses(run_dir: Path) -> dict[int, float]:
    """Each epoch's validation loss of one of our runs (its trainer_state.json), in nats."""
    state = json.loads((run_dir / "trainer_state.json").read_text())
    return {round(entry["epoch"]): entry["eval_loss"] for entry in state["log_history"] if "eval_loss" in entry}


def curves(args) -> None:
    runs = {f"fairseq, seed {args.seed}": fairseq_validation_losses(run_folder(args))}
    for folder in map(Path, args.ours):
        runs[f"ours, {folder.name.replace('-', ' ')}"] = our_validation_losses(folder)
    epochs = sorted(set().union(*runs.values()))
    print("| epoch | " + " | ".join(runs) + " |\n|" + " --- |" * (len(runs) + 1))
    for epoch in epochs:
        print(f"| {epoch} | " + " | ".join(f"{losses[epoch]:.3f}" if epoch in losses else "-"
                                           for losses in runs.values()) + " |")
    if args.plot:
        figure, axes = recipe.plt.subplots(figsize=(7, 4), layout="constrained")
        for name, losses in runs.items():
            axes.plot(sorted(losses), [losses[epoch] for epoch in sorted(losses)], label=name)
            best = min(losses, key=losses.get)
            axes.plot([best], [losses[best]], marker="o", color=axes.lines[-1].get_color())
        axes.set(xlabel="epoch", ylabel="validation loss (label-smoothed, nats)", ylim=(2.6, 4.0),
                 title="Wu et al.'s recipe on their prepared text: fairseq and ours (dots: best epoch)")
        axes.grid(alpha=0.3)
        axes.legend()
        figure.savefig(args.plot, dpi=110)
        recipe.plt.close(figure)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["prepare", "train", "score", "curves"])
    parser.add_argument("--work", required=True, help="Folder of the pieces, fairseq's data and its runs.")
    parser.add_argument("--run", help="prepare: the examples/multi30k/run.py --size wu2021 run (its tokenizer/ and "
                                      "prepared/).")
    parser.add_argument("--prepared", help="score: the prepared text's folder (default: WORK's source, as prepare "
                                           "recorded it).")
    parser.add_argument("--fairseq-venv", default=".venv-fairseq")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ours", nargs="*", default=[], help="curves: our runs' folders (examples/multi30k/run.py "
                                                            "--size wu2021) to set beside fairseq's.")
    parser.add_argument("--plot", help="curves: the image to draw them in.")
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.extra = extra
    {"prepare": prepare, "train": train, "score": score, "curves": curves}[args.command](args)


if __name__ == "__main__":
    main()
