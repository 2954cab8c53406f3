"""`vanilla-transformer translate`, `evaluate` and `plot-attention`: a model run on sentences, by any backend
(`backends/table.py`), and its attention drawn. Paths are checked before any work, and outputs are written whole or
not at all (`text_files.output_file`)."""

import argparse
import functools
import json
import sys
from pathlib import Path

from ..paths.disk import write_errors
from ..errors import CommandParser, InputTooLongError, UserError
from ..extras import MissingExtraError
from ..paths.files import check_input_file, check_output_file
from ..hub.reachability import check_model
from ..paths.model_folders import check_tokenizer_fits
from ..backends.table import BACKENDS
from ..inference.attention_plots import KINDS
from .arguments import device, positive_int
from .errors import user_errors
from .scores import (check_hypotheses_arguments, hypotheses_arguments, hypothesis_lines, sampling_arguments,
                     sampling_options, with_nbest)


def _decoding_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="A saved model folder (from train, average or save_pretrained) or a Hub id USER/NAME; with --backend "
        "ct2, an export-ct2 folder; with --backend onnx, an export-onnx folder.",
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=32, metavar="N", help="Sentences per batch (sorted by length)."
    )
    parser.add_argument(
        "--num-beams",
        type=positive_int,
        metavar="N",
        help="Beam size (default: the model's generation config; 4 in the paper).",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=positive_int,
        metavar="N",
        help="Most tokens generated per sentence (default: the model's generation config; source length + 50 in the "
        "paper).",
    )
    parser.add_argument("--device", type=device, help="cpu, cuda, cuda:1, ... (default: cuda when available).")
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="torch", help="What runs the model.")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="With --backend torch: decode with a static cache and a torch.compile'd decoding step (the first batches "
        "of each source length wait for compilation; docs/decoding.md).",
    )


def backend_translator(args: argparse.Namespace):
    """The backend's translate function for the model folder, with the command's decoding options bound."""
    torch_backend = args.backend == "torch"
    if args.compile and not torch_backend:
        raise UserError(f"--compile compiles PyTorch's decoding; --backend {args.backend} has its own")
    # Export folders hold no transformers weights: the ct2 and onnx backends say what a folder lacks.
    check_model(args.model, config=torch_backend, weights=torch_backend, hub=torch_backend)
    if torch_backend:
        from ..model import register

        register()  # before any Auto class reads the folder, which would otherwise offer to run the folder's own code
        check_tokenizer_fits(args.model)
        _check_cuda_device(args.device)
    with user_errors(OSError, ValueError, path=args.model):  # a folder the backend cannot run, a Hub id not there
        translate = BACKENDS[args.backend](args.model, args.device)
    options = dict(batch_size=args.batch_size, num_beams=args.num_beams)
    if args.max_new_tokens is not None:
        options["max_new_tokens"] = args.max_new_tokens
    if args.compile:
        options["compile"] = True
    return functools.partial(translate, **options)


def _check_cuda_device(name: str | None) -> None:
    """A CUDA device `name` (--device) that torch sees on this machine."""
    if not name:
        return
    import torch

    if torch.device(name).type == "cuda":
        index, available = torch.device(name).index or 0, torch.cuda.device_count()
        if index >= available:
            raise UserError(f"--device {name}: this machine has {available} CUDA device(s) for torch")


def _read_lines(path: str) -> list[str]:
    """The lines of `path`; an unreadable file or a bad byte is a `UserError` naming the file (and line)."""
    from ..paths.text_files import InvalidUTF8Error, read_lines

    with user_errors(OSError, EOFError, InvalidUTF8Error, path=path):
        return read_lines(path)


def _one_line(translation: str) -> str:
    """A line break inside a translation would shift every later line: it becomes a space."""
    return translation.replace("\r", " ").replace("\n", " ") + "\n"


def translate_command(argv: list[str]) -> None:
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
    parser.add_argument("--target-prefix", metavar="FILE",
                        help="Target prefixes, one a line, aligned with the input (an empty line: none): each "
                             "translation starts with its prefix's tokens, and the search continues it.")
    hypotheses_arguments(parser)
    sampling_arguments(parser)
    args = parser.parse_args(argv)
    from tqdm.auto import tqdm

    from ..inference.lines import translate_in_chunks
    from ..paths.text_files import InvalidUTF8Error, iter_lines, output_file

    check_hypotheses_arguments(args)
    sampling = sampling_options(args)
    check_output_file(args.output)
    num_lines = check_input_file(args.input)
    prefixes = None if args.target_prefix is None else _read_lines(args.target_prefix)
    if prefixes is not None and num_lines is not None and len(prefixes) != num_lines:
        raise UserError(f"{args.target_prefix} has {len(prefixes)} lines but {args.input} has {num_lines}; give one "
                        "target prefix a line (an empty line for none)")
    translate = functools.partial(backend_translator(args), **sampling)
    if prefixes is not None:
        translate = _with_target_prefixes(translate, prefixes, args.target_prefix)
    if args.nbest is not None or args.format != "text":
        translate = with_nbest(translate, args)
    number = 0
    # A chunk of lines at a time (sorted and batched within it), so memory stays flat however long the input; the
    # output file appears, whole, at the end.
    with (
        write_errors(Path(args.output or ".").parent),
        output_file(args.output) as file,
        tqdm(total=num_lines, unit="line", disable=not sys.stderr.isatty()) as bar,
        user_errors(InvalidUTF8Error, InputTooLongError),  # standard input is checked as it is read
    ):
        for number, translation in enumerate(translate_in_chunks(translate, iter_lines(args.input),
                                                                 show_progress=False), start=1):
            file.write(_one_line(translation) if isinstance(translation, str) else
                       hypothesis_lines(number, translation, args.format, args.token_scores, bool(args.alignment)))
            bar.update()
        if prefixes is not None and number != len(prefixes):  # standard input, not counted ahead
            raise UserError(f"{args.target_prefix} has {len(prefixes)} lines but the input has {number}; give one "
                            "target prefix a line (an empty line for none)")


def _with_target_prefixes(translate, prefixes: list[str], path: str):
    """`translate` given the target prefixes of the lines of each chunk it translates (`first_line` on)."""

    def translate_after_prefixes(chunk, first_line: int = 1, **options):
        given = prefixes[first_line - 1: first_line - 1 + len(chunk)]
        if len(given) < len(chunk):
            raise UserError(f"{path} has {len(prefixes)} lines but the input has more; give one target prefix a line "
                            "(an empty line for none)")
        return translate(chunk, first_line=first_line, target_prefixes=given, **options)

    return translate_after_prefixes


def _evaluate_parser() -> CommandParser:
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
    return parser


def evaluate_command(argv: list[str]) -> None:
    args = _evaluate_parser().parse_args(argv)
    from ..paths.text_files import output_file

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

    translate = backend_translator(args)
    with user_errors(InputTooLongError, path=args.src):
        hypotheses = translate(sources)
    if args.output_hyps:
        with write_errors(Path(args.output_hyps).parent), output_file(args.output_hyps) as file:
            file.writelines(_one_line(hypothesis) for hypothesis in hypotheses)
    scores = _scores(args, hypotheses, references)
    if args.json:
        with user_errors(OSError, path=args.json), write_errors(Path(args.json).parent), output_file(args.json) as file:
            file.write(_card_results(args, scores, sources, references, hypotheses).text())
        print(f"results written to {args.json}")


def _scores(args: argparse.Namespace, hypotheses: list[str], references: list[str]) -> dict:
    """evaluate's scores of `hypotheses`, printed with their signatures: BLEU, chrF and, with the train extra, the
    lowercased Moses-tokenized BLEU."""
    from ..inference.metrics import LC_MOSES_BLEU_NAME, score_translations

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
    return scores


def _card_results(args: argparse.Namespace, scores: dict, sources, references, hypotheses):
    """evaluate's scores as the results file of `model-card --results` and `push --card-results`: one evaluation
    named by --dataset and --split, decoded as the options say (`hub.evaluation.evaluation_card_facts`)."""
    from ..hub.evaluation import evaluation_card_facts

    dataset = args.dataset or (Path(args.src).name if args.src != "-" else None)  # None: the card says "not named"
    return evaluation_card_facts(dataset, args.split or "test", scores, sources, references, hypotheses,
                                 decoding=_decoding_description(args))


def _decoding_description(args: argparse.Namespace) -> str | None:
    """The decoding the options chose, where it differs from the model's generation config (None: it does not)."""
    from ..hub.evaluation import decoding_in_words

    parts = [decoding_in_words(args.num_beams, max_new_tokens=args.max_new_tokens)]
    if args.backend == "ct2":  # an export-ct2 folder, maybe quantized: not quite the weights of the model folder
        parts.append("CTranslate2 (--backend ct2)")
    return ", ".join(part for part in parts if part) or None


def _target_lang(args: argparse.Namespace) -> str:
    """The language of evaluate's references: --target-lang, else the model config's `target_lang`, else English. A
    local folder's config.json is read as JSON, without transformers (an export-ct2 folder's is CTranslate2's, with no
    target_lang): the ct2 backend imports no torch."""
    if args.target_lang:
        return args.target_lang
    try:
        if Path(args.model).is_dir():
            config = json.loads((Path(args.model) / "config.json").read_text(encoding="utf-8"))
        else:  # a Hub id
            from transformers import PretrainedConfig

            config = PretrainedConfig.get_config_dict(args.model)[0]
    except (OSError, ValueError):
        return "en"
    return (config.get("target_lang") if isinstance(config, dict) else None) or "en"


def plot_attention_command(argv: list[str]) -> None:
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
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from ..inference.attention_plots import attention_weights, plot_attention

    if not args.source.strip():
        raise UserError("--source is empty: give the sentence whose attention to draw")
    if args.translation is not None and not args.translation.strip():
        raise UserError("--translation is empty: give a translation, or leave it out for the model's own")
    check_model(args.model)
    check_tokenizer_fits(args.model)
    check_output_file(args.out)
    with user_errors(OSError, ValueError, path=args.model):
        tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=False)
        model = AutoModelForSeq2SeqLM.from_pretrained(args.model, trust_remote_code=False)
    weights = attention_weights(model, tokenizer, args.source, args.translation)
    with user_errors(ValueError):  # a layer or head the model does not have
        plot_attention(weights, args.kind, args.layer, args.head, args.out)
    print(f"translation: {weights['translation']}\nattention plot written to {args.out}")
