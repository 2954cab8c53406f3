"""How long the command line takes to start: `--help`, `train --help`, one line and 1,000 lines with each backend.

    python benchmarks/startup_speed.py --model outputs/number-words-en-fr
    python benchmarks/startup_speed.py --model outputs/number-words-en-fr --before path/to/older/checkout/src

Every command runs in a new process, as a user types it, `--repeats` times; the table gives the fastest (wall seconds,
so run it on an otherwise idle machine). With `--before`, the same commands also run on another checkout's package
(put first on PYTHONPATH, entered as its `python -m vanilla_transformer.cli`), alternating with this one, so the two
columns are measured side by side. The model is the demo's (`make demo`): its CTranslate2 and ONNX exports are made
once, in a temporary folder, by this checkout. The 1,000 lines are English number words, the demo's own kind of input.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINES = 1000


def command_line(before: Path | None) -> tuple[list[str], dict]:
    """How to run `vanilla-transformer`: this checkout's console entry, or an older checkout's package."""
    env = dict(os.environ)
    if before is None:
        return [sys.executable, "-c", "from vanilla_transformer_cli import main; main()"], env
    env["PYTHONPATH"] = os.pathsep.join([str(before), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return [sys.executable, "-m", "vanilla_transformer.cli"], env


def seconds(command: list[str], env: dict, stdin: str | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, input=stdin, text=True, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def english_number_words(count: int) -> list[str]:
    from num2words import num2words

    return [num2words(number) for number in range(1, 1_000_000, 1_000_000 // count)][:count]


def exports(model: Path, work: Path) -> dict[str, Path]:
    """The model as each backend loads it."""
    folders = {"torch": model, "ct2": work / "ct2", "onnx": work / "onnx"}
    entry, env = command_line(None)
    for backend in ("ct2", "onnx"):
        subprocess.run([*entry, f"export-{backend}", "--model", str(model), "--out", str(folders[backend])], env=env,
                       check=True, stdout=subprocess.DEVNULL)
    return folders


def cases(folders: dict[str, Path], lines_file: Path) -> list[tuple[str, list[str], str | None]]:
    """(what, arguments, standard input) for each measurement."""
    rows = [("`vanilla-transformer --help`", ["--help"], None), ("`train --help`", ["train", "--help"], None)]
    for backend, folder in folders.items():
        translate = ["translate", "--model", str(folder), "--backend", backend]
        rows.append((f"one line, `--backend {backend}`", translate, "three hundred and twelve\n"))
        rows.append((f"{LINES:,} lines, `--backend {backend}`", [*translate, "--input", str(lines_file)], None))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=REPO / "outputs" / "number-words-en-fr")
    parser.add_argument("--before", type=Path, help="Another checkout's src/ folder, measured alongside.")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    versions = {"this checkout": None, **({"before": args.before.resolve()} if args.before else {})}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        lines_file = work / "lines.en"
        lines_file.write_text("\n".join(english_number_words(LINES)) + "\n")
        rows = cases(exports(args.model.resolve(), work), lines_file)
        best = {}
        for what, arguments, stdin in rows:
            for _ in range(args.repeats):
                for name, before in versions.items():  # alternating: both see the same machine
                    entry, env = command_line(before)
                    took = seconds([*entry, *arguments], env, stdin)
                    best[what, name] = min(best.get((what, name), took), took)
            print(f"{what}: " + ", ".join(f"{name} {best[what, name]:.2f} s" for name in versions), file=sys.stderr)
    names = list(versions)[::-1]
    print("| command | " + " | ".join(f"{name} (s)" for name in names) + " |")
    print("| --- |" + " --- |" * len(names))
    for what, _, _ in rows:
        print(f"| {what} | " + " | ".join(f"{best[what, name]:.2f}" for name in names) + " |")


if __name__ == "__main__":
    main()
