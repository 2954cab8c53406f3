"""The `vanilla-transformer` command: one function per subcommand, listed with its one-line summary in `COMMANDS`.

`vanilla-transformer --help` lists the commands, `vanilla-transformer COMMAND --help` gives a command's options. Options
are spelled with dashes (`--max-new-tokens`); `train` also takes transformers' underscores (`--max_steps`).

A mistake in what a command is given (a missing folder, a bad value, a file with a bad line) is a `UserError`; `main`
prints it, or a `MissingExtraError`, as one line, `vanilla-transformer COMMAND: error: ...`, and exits with status 2.
Paths are checked before any work, and outputs are written whole or not at all (`text_files.output_file`). So is a Hub
that cannot be reached, found by one quick request before anything is fetched from or sent to it
(`user_errors.hub_unreachable`), and a push that the Hub refuses or the network drops (`user_errors.hub_errors`). Any
other exception is a bug and keeps its traceback.
"""

import argparse
import contextlib
import functools
import json
import sys
from pathlib import Path

from ..extras import MissingExtraError, require
from ..user_errors import (
    CommandParser,
    Preempted,
    UserError,
    check_input_file,
    check_model,
    check_output_file,
    check_output_folder,
    check_tokenizer_fits,
    describe,
    hub_errors,
    hub_unreachable,
    no_such_folder,
    user_errors,
    write_errors,
)


def average_command(argv: list[str]) -> None:
    from ..training.averaging import average_checkpoints, find_checkpoints
    from ..training.checkpoints import complete_checkpoints

    parser = CommandParser(
        prog="vanilla-transformer average",
        description="Average the weights of the last N checkpoints of a run (section 6.1: 5 for base, 20 for big).",
    )
    parser.add_argument("--run", required=True, help="A Trainer output folder holding checkpoint-<step> folders.")
    parser.add_argument("--last", type=_positive_int, default=5, help="How many of the latest checkpoints to average.")
    parser.add_argument("--out", required=True, help="Folder for the averaged model (loads with from_pretrained).")
    parser.add_argument("--force", action="store_true", help="Replace the model --out already holds.")
    args = parser.parse_args(argv)
    check_output_folder(args.out)
    with user_errors(ValueError, OSError):
        checkpoints = find_checkpoints(args.run, args.last)
        for path, problem in complete_checkpoints(args.run, to_resume=False)[1].items():
            print(f"skipped {path}, an incomplete checkpoint: {problem}", file=sys.stderr)
        with write_errors(args.out, needed=_folder_size(checkpoints[-1], "model.safetensors", "*.json", "*.py")):
            average_checkpoints(checkpoints, args.out, force=args.force)
    print(f"averaged {len(checkpoints)} checkpoints ({', '.join(str(c) for c in checkpoints)}) into {args.out}")


def train_command(argv: list[str]) -> None:
    from ..training.run import main

    main(argv)


def _card_arguments(parser: argparse.ArgumentParser, results_flag: str) -> None:
    parser.add_argument("--model", required=True, help="A saved model folder (from train, average or save_pretrained).")
    parser.add_argument(
        results_flag,
        metavar="FILE",
        help="JSON with the evaluation results and card facts (see vanilla_transformer.hub; `evaluate --json` writes "
        "one); default: the run's card_results.json (written by train), else its test_results.json, else "
        "eval_results.json.",
    )
    parser.add_argument("--run", help="The training run folder, for the recipe and results (default: --model).")
    parser.add_argument("--license", default="apache-2.0", help="License of the model on the Hub.")


def _check_card_arguments(args: argparse.Namespace, results: str | None, weights: bool, tokenizer: bool) -> dict:
    """The card facts (`hub.read_card_facts`), after checking the folders and the results file they come from."""
    from ..hub.card import read_card_facts

    check_model(args.model, weights=weights, tokenizer=tokenizer, hub=False)
    if tokenizer:  # a folder shared with its tokenizer: the two must fit
        check_tokenizer_fits(args.model)
    if args.run is not None and not Path(args.run).is_dir():
        raise UserError(f"{args.run} is a file, not a folder" if Path(args.run).exists() else no_such_folder(args.run))
    if results is not None and not Path(results).is_file():
        raise UserError(f"{results} is a folder, not a file" if Path(results).is_dir() else f"no such file: {results}")
    with user_errors(ValueError, OSError):  # read and checked before the model is loaded
        return read_card_facts(results, args.run or args.model)


def model_card_command(argv: list[str]) -> None:
    from ..hub.card import write_model_card

    parser = CommandParser(
        prog="vanilla-transformer model-card",
        description="Generate the Hub model card (README.md) of a saved model from its config and results.",
    )
    _card_arguments(parser, "--results")
    parser.add_argument("--repo-id", help="USER/NAME used in the card's usage examples.")
    parser.add_argument(
        "--out", required=True, help="Where to write the card, e.g. model_cards/NAME/README.md (its figures go beside it)."
    )
    args = parser.parse_args(argv)
    facts = _check_card_arguments(args, args.results, weights=False, tokenizer=False)
    check_output_file(args.out, new_folders=True)  # a card is often a new folder, its figures beside it
    with user_errors(ValueError, OSError), write_errors(Path(args.out).parent):
        write_model_card(args.model, args.out, facts, run_dir=args.run, repo_id=args.repo_id, license=args.license)
    print(f"model card written to {args.out}")


def push_command(argv: list[str]) -> None:
    from ..hub.card import push_to_hub

    parser = CommandParser(
        prog="vanilla-transformer push",
        description="Upload a saved model, its tokenizer, code and a generated model card to the Hub in one commit.",
    )
    _card_arguments(parser, "--card-results")
    parser.add_argument("--repo-id", required=True, help="USER/NAME of the Hub repository (created if missing).")
    parser.add_argument("--private", action="store_true", help="Create the repository as private.")
    parser.add_argument("--commit-message", default="Upload vanilla-transformer model")
    parser.add_argument("--token", help="A Hub token with write access (default: the one of `hf auth login`).")
    parser.add_argument(
        "--dry-run",
        metavar="OUT",
        help="Write the folder that would be uploaded (model, tokenizer, code, card and its figures) into OUT instead, "
        "without any network access.",
    )
    parser.add_argument("--force", action="store_true", help="With --dry-run: replace what OUT holds.")
    args = parser.parse_args(argv)
    if args.force and args.dry_run is None:
        raise UserError("--force replaces the folder of --dry-run; without --dry-run there is nothing to replace")
    require("jinja2", extra="train")  # the card's, before the Hub is asked anything
    facts = _check_card_arguments(args, args.card_results, weights=True, tokenizer=True)
    _check_repo_id(args.repo_id)
    if args.dry_run is not None:
        _dry_run(args, facts)
        return
    _check_hub_for_push()
    with hub_errors(f"push to {args.repo_id}"):
        commit = push_to_hub(
            args.model,
            args.repo_id,
            private=args.private,
            results=facts,
            run_dir=args.run,
            license=args.license,
            commit_message=args.commit_message,
            token=args.token,
        )
    print(f"pushed to {commit.commit_url}")


def _check_repo_id(repo_id: str) -> None:
    """`repo_id` is USER/NAME, or NAME alone (the token owner's), as huggingface_hub accepts it."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise UserError(f"--repo-id {repo_id!r} is not a Hub repository name: {describe(error)}") from None


def _check_hub_for_push() -> None:
    """The Hub can be reached: one quick request, so that a machine without a network gets one line at once."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        raise UserError("HF_HUB_OFFLINE is set, so nothing can be sent to the Hub: unset it to push, or write the "
                        "folder that would be uploaded with --dry-run OUT")
    if (reason := hub_unreachable()) is not None:
        raise UserError(f"the Hub ({constants.ENDPOINT}) cannot be reached ({reason}); --dry-run OUT writes the "
                        "folder that would be uploaded")


def _dry_run(args: argparse.Namespace, facts: dict) -> None:
    """push --dry-run: the folder `push` would upload, written whole into args.dry_run (a folder beside it, renamed)."""
    from ..hub.card import write_repository
    from ..text_files import output_folder

    out = Path(args.dry_run)
    if out.exists() and not out.is_dir():
        raise UserError(f"--dry-run {out} is a file, not a folder")
    for name, folder in (("--model", args.model), ("--run", args.run), ("current", ".")):
        if folder is not None and out.resolve() in (Path(folder).resolve(), *Path(folder).resolve().parents):
            raise UserError(f"--dry-run {out} would replace the {name} folder {folder}; choose another")
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise UserError(f"--dry-run {out} is not empty; pass --force to replace what it holds, or choose another")
    check_output_file(str(out / "README.md"), new_folders=True)
    needed = _folder_size(args.model, "model.safetensors", "*.json", "*.py")
    with user_errors(ValueError, OSError), write_errors(out, needed), output_folder(out) as staging:
        files = write_repository(
            args.model, staging, args.repo_id, results=facts, run_dir=args.run, license=args.license
        )
        files = [path.relative_to(staging).as_posix() for path in files]
    print(f"{len(files)} files that push would upload to {args.repo_id} written to {out} (nothing was sent):")
    for name in files:
        print(f"  {name}")


def _folder_size(folder: str | Path, *patterns: str) -> int:
    """The bytes of the files of `folder` that `patterns` match: what a copy of them needs on the disk."""
    return sum(path.stat().st_size for pattern in patterns for path in Path(folder).glob(pattern) if path.is_file())


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:  # argparse would name this function instead of what is expected
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _device(text: str) -> str:
    import torch

    try:
        torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected a device such as cpu, cuda or cuda:1, got {text!r}") from None
    return text


def _decoding_arguments(parser: argparse.ArgumentParser) -> None:
    from ..backends.table import BACKENDS

    parser.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="A saved model folder (from train, average or save_pretrained) or a Hub id USER/NAME; with --backend "
        "ct2, an export-ct2 folder; with --backend onnx, an export-onnx folder.",
    )
    parser.add_argument(
        "--batch-size", type=_positive_int, default=32, metavar="N", help="Sentences per batch (sorted by length)."
    )
    parser.add_argument(
        "--num-beams",
        type=_positive_int,
        metavar="N",
        help="Beam size (default: the model's generation config; 4 in the paper).",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=_positive_int,
        metavar="N",
        help="Most tokens generated per sentence (default: the model's generation config; source length + 50 in the "
        "paper).",
    )
    parser.add_argument("--device", type=_device, help="cpu, cuda, cuda:1, ... (default: cuda when available).")
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="torch", help="What runs the model.")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="With --backend torch: decode with a static cache and a torch.compile'd decoding step (the first batches "
        "of each source length wait for compilation; docs/decoding.md).",
    )


def _translator(args: argparse.Namespace):
    """The backend's translate function for the model folder, with the command's decoding options bound."""
    import torch

    from ..backends.table import BACKENDS

    torch_backend = args.backend == "torch"
    if args.compile and not torch_backend:
        raise UserError(f"--compile compiles PyTorch's decoding; --backend {args.backend} has its own")
    # Export folders hold no transformers weights: the ct2 and onnx backends say what a folder lacks.
    check_model(args.model, config=torch_backend, weights=torch_backend, hub=torch_backend)
    if torch_backend:
        check_tokenizer_fits(args.model)
    if torch_backend and args.device and torch.device(args.device).type == "cuda":
        index, available = torch.device(args.device).index or 0, torch.cuda.device_count()
        if index >= available:
            raise UserError(f"--device {args.device}: this machine has {available} CUDA device(s) for torch")
    with user_errors(OSError, ValueError, path=args.model):  # a folder the backend cannot run, a Hub id not there
        translate = BACKENDS[args.backend](args.model, args.device)
    options = dict(batch_size=args.batch_size, num_beams=args.num_beams)
    if args.max_new_tokens is not None:
        options["max_new_tokens"] = args.max_new_tokens
    if args.compile:
        options["compile"] = True
    return functools.partial(translate, **options)


def _read_lines(path: str) -> list[str]:
    """The lines of `path`; an unreadable file or a bad byte is a `UserError` naming the file (and line)."""
    from ..text_files import InvalidUTF8Error, read_lines

    with user_errors(OSError, EOFError, InvalidUTF8Error, path=path):
        return read_lines(path)


def _one_line(translation: str) -> str:
    """A line break inside a translation would shift every later line: it becomes a space."""
    return translation.replace("\r", " ").replace("\n", " ") + "\n"


def translate_command(argv: list[str]) -> None:
    from tqdm.auto import tqdm

    from ..backends.table import InputTooLongError
    from ..text_files import InvalidUTF8Error, iter_lines, output_file
    from ..inference.translate import translate_in_chunks

    parser = CommandParser(
        prog="vanilla-transformer translate",
        description="Translate a file or standard input line by line: one translation per input line, in order; "
        "empty lines stay empty.",
    )
    _decoding_arguments(parser)
    parser.add_argument(
        "--input", metavar="FILE", help="UTF-8 text, one sentence a line (.gz read as gzip); default: standard input."
    )
    parser.add_argument("--output", metavar="FILE", help="Where to write the translations; default: standard output.")
    args = parser.parse_args(argv)
    check_output_file(args.output)
    num_lines = check_input_file(args.input)
    translate = _translator(args)
    # A chunk of lines at a time (sorted and batched within it), so memory stays flat however long the input; the
    # output file appears, whole, at the end.
    with (
        write_errors(Path(args.output or ".").parent),
        output_file(args.output) as file,
        tqdm(total=num_lines, unit="line", disable=not sys.stderr.isatty()) as bar,
        user_errors(InvalidUTF8Error, InputTooLongError),  # standard input is checked as it is read
    ):
        for translation in translate_in_chunks(translate, iter_lines(args.input), show_progress=False):
            file.write(_one_line(translation))
            bar.update()


def evaluate_command(argv: list[str]) -> None:
    from ..backends.table import InputTooLongError
    from ..inference.metrics import LC_MOSES_BLEU_NAME, score_translations
    from ..text_files import output_file

    parser = CommandParser(
        prog="vanilla-transformer evaluate",
        description="Translate a source file and score it against its references with sacreBLEU: BLEU and chrF, "
        "each with its signature, and BLEU on lowercased, Moses-tokenized text (with the train extra) as Multi30k "
        "papers report it.",
    )
    _decoding_arguments(parser)
    parser.add_argument("--src", required=True, metavar="FILE", help="Source sentences, one a line (.gz read as gzip).")
    parser.add_argument(
        "--ref", required=True, metavar="FILE", help="Reference translations, aligned with --src line by line."
    )
    parser.add_argument("--output-hyps", metavar="FILE", help="Also write the translations to this file.")
    parser.add_argument(
        "--target-lang",
        metavar="LANG",
        help="Language of the references, for the Moses tokenizer of the lowercased BLEU (default: the model "
        "config's target_lang, else en).",
    )
    parser.add_argument(
        "--json",
        metavar="FILE",
        help="Also write the scores, their signatures and the first sample translations as the results file that "
        "model-card --results and push --card-results read.",
    )
    parser.add_argument(
        "--dataset", metavar="NAME", help="The name of the test data in --json, e.g. Multi30k (default: --src's name)."
    )
    parser.add_argument("--split", metavar="NAME", help="The split in --json, e.g. test_2016_flickr (default: test).")
    args = parser.parse_args(argv)
    if args.json == "-":
        raise UserError("--json -: give the name of a file to write (standard output has the scores)")
    for flag, value in (("--dataset", args.dataset), ("--split", args.split)):
        if value is not None and args.json is None:
            raise UserError(f"{flag} names the data in the --json results file; give --json FILE too")
    check_output_file(args.output_hyps)
    check_output_file(args.json)
    sources, references = _read_lines(args.src), _read_lines(args.ref)
    for path, lines in ((args.src, sources), (args.ref, references)):
        if not any(line.strip() for line in lines):
            raise UserError(f"{path} is empty")
    if len(sources) != len(references):
        raise UserError(
            f"{args.src} has {len(sources)} lines but {args.ref} has {len(references)}; source and reference files "
            "must be aligned line by line"
        )

    translate = _translator(args)
    with user_errors(InputTooLongError, path=args.src):
        hypotheses = translate(sources)
    if args.output_hyps:
        with write_errors(Path(args.output_hyps).parent), output_file(args.output_hyps) as file:
            file.writelines(_one_line(hypothesis) for hypothesis in hypotheses)
    try:
        scores = score_translations(hypotheses, references, moses_lang=_target_lang(args))
    except MissingExtraError as missing:  # the core install: sacreBLEU's scores only
        scores = score_translations(hypotheses, references)
        scores["bleu_lc_moses_report"] = f"{LC_MOSES_BLEU_NAME}: not computed, {missing}"
    print(f"{scores['bleu_report']}\n  signature: {scores['bleu_signature']}")
    print(f"{scores['chrf_report']}\n  signature: {scores['chrf_signature']}")
    print(scores["bleu_lc_moses_report"])
    if "bleu_lc_moses_signature" in scores:
        print(f"  signature: {scores['bleu_lc_moses_signature']}")
    if args.json:
        with user_errors(OSError, path=args.json), write_errors(Path(args.json).parent), output_file(args.json) as file:
            json.dump(_card_results(args, scores, sources, references, hypotheses), file, indent=2, ensure_ascii=False)
            file.write("\n")
        print(f"results written to {args.json}")


# How many sample translations evaluate --json keeps for the model card.
CARD_SAMPLES = 5


def _card_results(args: argparse.Namespace, scores: dict, sources, references, hypotheses) -> dict:
    """evaluate's scores as the results file of `model-card --results` and `push --card-results` (hub.py): one
    evaluation named by --dataset and --split, decoded as the options say, and the first non-empty pairs as samples."""
    result = dict(
        dataset=args.dataset or (Path(args.src).name if args.src != "-" else None),  # None: the card says "not named"
        split=args.split or "test",
        bleu=scores["bleu"],
        chrf=scores["chrf"],
        bleu_signature=scores["bleu_signature"],
        chrf_signature=scores["chrf_signature"],
        num_sentences=len(hypotheses),
        decoding=_decoding_description(args),
    )
    if "bleu_lc_moses" in scores:  # with the train extra
        result.update(bleu_lc_moses=scores["bleu_lc_moses"], bleu_lc_moses_signature=scores["bleu_lc_moses_signature"])
    pairs = [(s, r, h) for s, r, h in zip(sources, references, hypotheses, strict=True) if s.strip()]
    samples = [dict(source=s, reference=r, hypothesis=h) for s, r, h in pairs[:CARD_SAMPLES]]
    return dict(results=[result], samples=samples)


def _decoding_description(args: argparse.Namespace) -> str | None:
    """The decoding the options chose, where it differs from the model's generation config (None: it does not)."""
    parts = []
    if args.num_beams is not None:
        parts.append("greedy search" if args.num_beams == 1 else f"beam size {args.num_beams}")
    if args.max_new_tokens is not None:
        parts.append(f"at most {args.max_new_tokens} new tokens")
    if args.backend == "ct2":  # an export-ct2 folder, maybe quantized: not quite the weights of the model folder
        parts.append("CTranslate2 (--backend ct2)")
    return ", ".join(parts) or None


def _target_lang(args: argparse.Namespace) -> str:
    """The language of evaluate's references: --target-lang, else the model config's `target_lang`, else English."""
    from transformers import PretrainedConfig

    if args.target_lang:
        return args.target_lang
    try:  # an export-ct2 folder carries no target_lang
        return PretrainedConfig.get_config_dict(args.model)[0].get("target_lang") or "en"
    except (OSError, ValueError):
        return "en"


def plot_attention_command(argv: list[str]) -> None:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from ..inference.attention_plots import KINDS, attention_weights, plot_attention

    parser = CommandParser(
        prog="vanilla-transformer plot-attention",
        description="Draw the attention weights of one sentence as heatmaps, as in the paper's figures 3-5: one head, "
        "or all heads of a layer in a grid.",
    )
    parser.add_argument(
        "--model", required=True, metavar="DIR", help="A saved model folder (from train, average or save_pretrained)."
    )
    parser.add_argument("--source", required=True, metavar="TEXT", help="The source sentence.")
    parser.add_argument("--translation", metavar="TEXT", help="Its translation (default: the model's own).")
    parser.add_argument(
        "--kind",
        choices=list(KINDS),
        default="cross",
        help="Encoder self-attention, decoder (masked) self-attention, or cross: encoder-decoder attention (default).",
    )
    parser.add_argument("--layer", type=int, metavar="L", help="Layer, numbered from 1 (default: the last).")
    parser.add_argument(
        "--head", type=int, metavar="H", help="Head, numbered from 1 (default: all heads of the layer, in a grid)."
    )
    parser.add_argument("--out", required=True, metavar="FILE", help="The image file, e.g. attention.png.")
    args = parser.parse_args(argv)
    if not args.source.strip():
        raise UserError("--source is empty: give the sentence whose attention to draw")
    if args.translation is not None and not args.translation.strip():
        raise UserError("--translation is empty: give a translation, or leave it out for the model's own")
    check_model(args.model)
    check_tokenizer_fits(args.model)
    check_output_file(args.out)
    with user_errors(OSError, ValueError, path=args.model):
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForSeq2SeqLM.from_pretrained(args.model)
    weights = attention_weights(model, tokenizer, args.source, args.translation)
    with user_errors(ValueError):  # a layer or head the model does not have
        plot_attention(weights, args.kind, args.layer, args.head, args.out)
    print(f"translation: {weights['translation']}\nattention plot written to {args.out}")


def _export_parser(prog: str, description: str, kind: str) -> CommandParser:
    """An export command's parser with the flags that come first in every export: --model and --out (a `kind`
    folder)."""
    parser = CommandParser(prog=prog, description=description)
    parser.add_argument(
        "--model", required=True, metavar="DIR", help="A saved model folder (from train, average or save_pretrained)."
    )
    parser.add_argument("--out", required=True, metavar="DIR", help=f"The {kind} model folder to write.")
    return parser


def _export_arguments(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The flags every export shares (--max-positions, --force) added, parsed, and the model and --out checked."""
    parser.add_argument(
        "--max-positions",
        type=_positive_int,
        default=2048,
        metavar="N",
        help="Rows of the stored sinusoidal position table: the longest source or output, in tokens (default: 2048).",
    )
    parser.add_argument("--force", action="store_true", help="Replace --out if it exists.")
    args = parser.parse_args(argv)
    check_model(args.model, hub=False)
    check_tokenizer_fits(args.model)
    check_output_folder(args.out)
    return args


def export_ct2_command(argv: list[str]) -> None:
    from ..backends.ctranslate2 import QUANTIZATIONS, export_ctranslate2

    parser = _export_parser(
        "vanilla-transformer export-ct2",
        "Convert a saved model to CTranslate2 for fast CPU and GPU inference (`translate --backend ct2`); the folder "
        "also holds the tokenizer and generation config.",
        "CTranslate2",
    )
    parser.add_argument(
        "--quantization", choices=QUANTIZATIONS, help="Type of the stored weights (default: float32, as trained)."
    )
    args = _export_arguments(parser, argv)
    # OSError: FileExistsError without --force, a folder it cannot write; a full disk is named with the space
    with user_errors(ValueError, OSError), write_errors(args.out, _folder_size(args.model, "model.safetensors")):
        export_ctranslate2(args.model, args.out, args.quantization, args.max_positions, force=args.force)
    print(f"CTranslate2 model written to {args.out}")


def export_onnx_command(argv: list[str]) -> None:
    from ..backends.onnx_export import QUANTIZATIONS, export_onnx

    parser = _export_parser(
        "vanilla-transformer export-onnx",
        "Export a saved model to ONNX for ONNX Runtime (`translate --backend onnx`): encoder_model.onnx, "
        "decoder_model.onnx and decoder_with_past_model.onnx, with the config, generation config and tokenizer.",
        "ONNX",
    )
    parser.add_argument(
        "--quantize",
        choices=QUANTIZATIONS,
        help="Quantize the weights with ONNX Runtime's dynamic quantization (default: float32, as trained).",
    )
    args = _export_arguments(parser, argv)
    # OSError: FileExistsError without --force, a folder it cannot write; a full disk is named with the space
    with user_errors(ValueError, OSError), write_errors(args.out, _folder_size(args.model, "model.safetensors")):
        export_onnx(args.model, args.out, args.quantize, args.max_positions, force=args.force)
    print(f"ONNX model written to {args.out}")


# Each command with its one-line summary, in the order `--help` lists them.
COMMANDS = {
    "train": (train_command, "Train or fine-tune a translation model with the paper's recipe (no data: a demo)."),
    "average": (average_command, "Average the weights of a run's last checkpoints (section 6.1)."),
    "translate": (translate_command, "Translate a file or standard input, one line per sentence."),
    "evaluate": (evaluate_command, "Translate a test set and score it with sacreBLEU: BLEU and chrF."),
    "export-ct2": (export_ct2_command, "Convert a saved model to CTranslate2 for fast CPU and GPU inference."),
    "export-onnx": (export_onnx_command, "Export a saved model to ONNX, for ONNX Runtime and generate()."),
    "plot-attention": (plot_attention_command, "Draw a sentence's attention weights as heatmaps (figures 3-5)."),
    "model-card": (model_card_command, "Write the Hub model card (README.md) of a saved model."),
    "push": (push_command, "Upload a saved model, its tokenizer, code and model card to the Hub."),
}


@contextlib.contextmanager
def quiet_model_loading(quiet: bool = True):
    """Without transformers' progress bars (its "Loading weights" bar, drawn for every model loaded, which takes a
    blink): a command's own bars and its output are what it shows. `train` keeps them (its long steps show progress)."""
    from transformers.utils import logging as transformers_logging

    was_enabled = transformers_logging.is_progress_bar_enabled()
    if quiet:
        transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if quiet and was_enabled:
            transformers_logging.enable_progress_bar()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = CommandParser(
        prog="vanilla-transformer",
        description='The Transformer of "Attention Is All You Need" as a Hugging Face model: train, translate, '
        "evaluate and share it.",
        epilog="Run `vanilla-transformer COMMAND --help` for the options of a command.",
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command", required=True)
    for name, (_, summary) in COMMANDS.items():
        commands.add_parser(name, help=summary, add_help=False)
    if not argv:
        parser.print_help()
        sys.exit(2)
    try:  # --help prints the list of commands; an unknown one is an error
        name = parser.parse_args(argv[:1]).command
    except UserError as error:
        print(f"vanilla-transformer: error: {error}", file=sys.stderr)
        sys.exit(2)
    command, _ = COMMANDS[name]
    try:
        with quiet_model_loading(name != "train"):
            command(argv[1:])
    except (UserError, MissingExtraError) as error:  # one line, not a traceback
        print(f"vanilla-transformer {name}: error: {error}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"vanilla-transformer {name}: interrupted", file=sys.stderr)
        sys.exit(130)
    except Preempted as stop:  # SIGTERM stopped training: as Ctrl-C, 128 + the signal
        print(f"vanilla-transformer {name}: {stop}", file=sys.stderr)
        sys.exit(128 + stop.signal_number)


if __name__ == "__main__":
    # `python -m vanilla_transformer.cli` (torchrun): the package's own module runs, so that the `UserError` the
    # commands raise is the class `main` catches, not a copy in `__main__`.
    from vanilla_transformer.cli import main as package_main

    package_main()
