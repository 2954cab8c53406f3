"""Back-translation on Multi30k (Sennrich et al., 2016), synthetic sources sampled (Edunov et al., 2018): does German
text without its English help an English -> German model? Half of the training pairs stand for the parallel corpus,
the other half's German for target-side monolingual text.

    python examples/multi30k/back_translation.py --data-dir path/to/multi30k --output-dir runs/back-translation \\
        --seeds 0 --size tiny --max_tokens 2048 --warmup_steps 800 --max_steps 3000

The steps, each a command a user can run on their own data (docs/decoding.md#back-translation):

1. data/real-half: the first half of the training pairs, the validation and test sets as they are;
   monolingual.de.gz: the second half's German.
2. backward/: a German -> English model trained on real-half (run.py --source-lang de --target-lang en).
3. synthetic.en: monolingual.de translated by the backward model with sampling
   (`vanilla-transformer translate --sampling --top-k 10 --seed S`), one line per German line.
4. data/with-synthetic: real-half's pairs and the synthetic pairs (synthetic English, real German).
5. real-half/seed-N and with-synthetic/seed-N: English -> German models trained with the same flags, the same number
   of updates, then averaged, their length penalty chosen on validation and scored on test_2016_flickr (run.py).
6. back_translation.md: both runs' test scores side by side.

Options not listed here are run.py's and the train command's, given to every training (the backward one too). A step
whose output exists is not done again, so a stopped run continues where it stopped.
"""

import argparse
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as recipe  # noqa: E402  (examples/multi30k/run.py, beside this file)

SOURCE, TARGET = "en", "de"
# Edunov et al. (2018) draw synthetic sources by sampling; the top 10 tokens keep a weak backward model's samples from
# its long tail (their "top10" variant).
SAMPLING = ["--sampling", "--top-k", "10"]


def write_lines(path: Path, lines: list[str]):
    """`lines` as the gzip file `path`, unless it exists (a continued run keeps the files its trainings read)."""
    if path.exists():
        return
    partial = path.with_name(path.name + ".partial")
    with gzip.GzipFile(partial, "wb", mtime=0) as file:  # the same lines, the same bytes
        file.write("".join(line + "\n" for line in lines).encode("utf-8"))
    partial.replace(path)


def split_corpus(data: Path, out: Path, limit: int | None) -> tuple[Path, Path]:
    """data/real-half (first half of train; val and test as they are) and monolingual.de.gz (the second half's
    German), under `out`."""
    real_half = out / "data" / "real-half"
    real_half.mkdir(parents=True, exist_ok=True)
    train = {lang: recipe.read_lines(data / f"train.{lang}.gz", limit) for lang in (SOURCE, TARGET)}
    half = len(train[SOURCE]) // 2
    for lang in (SOURCE, TARGET):
        write_lines(real_half / f"train.{lang}.gz", train[lang][:half])
        for split in recipe.SPLITS[1:]:
            write_lines(real_half / f"{split}.{lang}.gz", recipe.read_lines(data / f"{split}.{lang}.gz", limit))
    monolingual = out / "monolingual.de.gz"
    write_lines(monolingual, train[TARGET][half:])
    return real_half, monolingual


def back_translate(model: Path, monolingual: Path, out: Path, seed: int) -> Path:
    """The German of `monolingual` translated into English by `model` with sampling, through the installed command."""
    synthetic = out / "synthetic.en"
    beside = Path(sys.executable).with_name("vanilla-transformer")  # this environment's, else the one on PATH
    command = str(beside) if beside.is_file() else shutil.which("vanilla-transformer")
    if command is None:
        sys.exit("back_translation.py: the vanilla-transformer command is neither beside this Python nor on PATH")
    partial = synthetic.with_suffix(".partial")
    subprocess.run([command, "translate", "--model", str(model), "--input", str(monolingual), "--output",
                    str(partial), "--batch-size", "64", *SAMPLING, "--seed", str(seed)], check=True)
    partial.replace(synthetic)
    return synthetic


def with_synthetic(real_half: Path, synthetic: Path, monolingual: Path, out: Path) -> Path:
    """real-half with the synthetic pairs added to its training pairs, but those whose sample is empty (a pair with
    one empty side is no training pair: the train command refuses it)."""
    folder = out / "data" / "with-synthetic"
    folder.mkdir(parents=True, exist_ok=True)
    synthetic_sources = synthetic.read_text(encoding="utf-8").splitlines()
    targets = recipe.read_lines(monolingual)
    assert len(synthetic_sources) == len(targets), (len(synthetic_sources), len(targets))
    pairs = [(source, target) for source, target in zip(synthetic_sources, targets) if source.strip()]
    added = dict(zip((SOURCE, TARGET), map(list, zip(*pairs))))
    for lang in (SOURCE, TARGET):
        write_lines(folder / f"train.{lang}.gz", recipe.read_lines(real_half / f"train.{lang}.gz") + added[lang])
        for split in recipe.SPLITS[1:]:
            if not (folder / f"{split}.{lang}.gz").exists():
                shutil.copyfile(real_half / f"{split}.{lang}.gz", folder / f"{split}.{lang}.gz")
    return folder


def train_and_score(data: Path, out: Path, seed: int, flags: list[str], langs=(SOURCE, TARGET)):
    """run.py on `data` into `out` (train, average, choose the length penalty, score), unless it already has."""
    if not (out / "results.json").is_file():
        recipe.main(["--data-dir", str(data), "--output-dir", str(out), "--seed", str(seed),
                     "--source-lang", langs[0], "--target-lang", langs[1], *flags])
    return json.loads((out / "results.json").read_text())[0]


def summary(rows: dict[str, list[dict]], sizes: dict[str, int]) -> str:
    """The test scores of both corpora's runs, each seed and their mean, as Markdown."""
    lines = ["| training pairs | seed | updates | decoding (alpha chosen on validation) | sacreBLEU | chrF | "
             "BLEU (lowercased, Moses-tokenized) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, results in rows.items():
        for result in results:
            lines.append(f"| {name} ({sizes[name]:,}) | {result['seed']} | {result['updates']:,} | "
                         f"{result['decoding']} | {result['bleu']:.2f} | {result['chrf']:.2f} | "
                         f"{result['bleu_lc_moses']:.2f} |")
    means = {name: sum(result["bleu"] for result in results) / len(results) for name, results in rows.items()}
    real, synthetic = means.values()
    lines += ["", f"sacreBLEU, mean over seeds: {real:.2f} without, {synthetic:.2f} with the synthetic pairs "
              f"({synthetic - real:+.2f})."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                     epilog="Any other option is run.py's or the train command's, for every training.")
    parser.add_argument("--data-dir", type=Path, required=True, help="The Multi30k folder (read, never copied).")
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--seeds", type=lambda text: [int(seed) for seed in text.split(",")], default=[0],
                        metavar="0,1", help="The English -> German runs' seeds (the backward model's is the first).")
    args, flags = parser.parse_known_args(argv)
    out = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    limit = 40 if recipe.flag_value(flags, "--size") == "smoke" else None
    real_half, monolingual = split_corpus(args.data_dir, out, limit)
    train_and_score(real_half, out / "backward", args.seeds[0], flags, langs=(TARGET, SOURCE))
    synthetic = out / "synthetic.en"
    if not synthetic.is_file():
        back_translate(out / "backward" / "averaged", monolingual, out, args.seeds[0])
    corpora = {"real-half": real_half, "with-synthetic": with_synthetic(real_half, synthetic, monolingual, out)}
    rows = {name: [] for name in corpora}
    for seed in args.seeds:
        for name, data in corpora.items():
            result = train_and_score(data, out / name / f"seed-{seed}", seed, flags)
            state = json.loads((out / name / f"seed-{seed}" / "trainer_state.json").read_text())
            rows[name].append(dict(result, seed=seed, updates=state["global_step"]))
    sizes = {name: len(recipe.read_lines(data / "train.de.gz")) for name, data in corpora.items()}
    table = summary(rows, sizes)
    (out / "back_translation.md").write_text(table)
    print(table, end="")


if __name__ == "__main__":
    main(sys.argv[1:])
