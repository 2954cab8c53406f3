"""Scores on the command line: `translate`'s n-best lists (`--nbest`, `--format`, `--token-scores`), its sampling
(`--sampling` and its flags) and the `score` command, each pair's log-probability under a model
(`backends.table.SCORERS`), for filtering a corpus or reranking an n-best list. docs/cli.md shows them with their
output; docs/decoding.md says what the scores are."""

import argparse
import functools
import itertools
import json
import sys
from pathlib import Path

from ..backends.table import SCORERS
from ..errors import CommandParser, UserError
from ..hub.reachability import check_model
from ..inference.hypotheses import ALIGNMENT_LAYER, AlignmentLayerError, AlignmentUnavailableError, pharaoh
from ..paths.disk import write_errors
from ..paths.files import check_input_file, check_output_file
from ..paths.model_folders import check_tokenizer_fits
from .arguments import device, positive_int
from .errors import command_line_message, user_errors

FORMATS = ("text", "tsv", "jsonl")


def hypotheses_arguments(parser: argparse.ArgumentParser) -> None:
    """translate's flags for n-best lists and scores."""
    parser.add_argument("--nbest", type=positive_int, metavar="N",
                        help="Write each input's N best hypotheses (at most the number of beams), best first, with "
                             "their scores (default: the best, as text).")
    parser.add_argument("--format", choices=FORMATS,
                        help="text: one translation a line; tsv: line number, rank, score, log-probability and "
                             "translation, one hypothesis a line; jsonl: the same as JSON objects (default: text, tsv "
                             "with --nbest or --token-scores).")
    parser.add_argument("--token-scores", action="store_true",
                        help="Add each hypothesis' tokens and their log-probabilities (tsv or jsonl).")
    parser.add_argument("--alignment", choices=("hard", "soft"),
                        help="Add each hypothesis' word alignment from the encoder-decoder attention (tsv or jsonl): "
                             "hard, Pharaoh i-j links (source word i, target word j); soft, the word matrix.")
    parser.add_argument("--alignment-layer", type=int, metavar="N",
                        help="With --alignment: the decoder layer whose attention (heads averaged) aligns, from 0; "
                             f"negative counts from the last (default: {ALIGNMENT_LAYER}; with --backend ct2, the "
                             "layer the export chose: export-ct2 --alignment-layer).")


def sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """translate's flags for sampling (back-translation: synthetic sources drawn from the model, not its best)."""
    parser.add_argument("--sampling", action="store_true",
                        help="Draw each translation token by token from the model's distribution instead of beam "
                             "search; reproducible for a given --seed and backend.")
    parser.add_argument("--top-k", type=int, metavar="K",
                        help="With --sampling: draw from the K most likely tokens only (default: 0, all of them).")
    parser.add_argument("--top-p", type=float, metavar="P",
                        help="With --sampling: draw from the smallest set of tokens whose probability reaches P "
                             "(default: 1.0, all of them).")
    parser.add_argument("--temperature", type=float, metavar="T",
                        help="With --sampling: divide the logits by T before drawing (default: 1.0).")
    parser.add_argument("--seed", type=int, metavar="S", help="With --sampling: the random seed (default: 0).")


def sampling_options(args: argparse.Namespace) -> dict:
    """The decoding options that --sampling and its flags ask for ({} without it), checked before any work."""
    flags = {"--top-k": args.top_k, "--top-p": args.top_p, "--temperature": args.temperature, "--seed": args.seed}
    if not args.sampling:
        if given := [flag for flag, value in flags.items() if value is not None]:
            raise UserError(f"{given[0]} shapes sampling: give --sampling too")
        return {}
    if args.num_beams not in (None, 1):
        raise UserError(f"--sampling draws one translation a line, token by token: it takes no --num-beams "
                        f"{args.num_beams}")
    if (args.nbest or 1) > 1:
        raise UserError(f"--sampling draws one translation a line: it takes no --nbest {args.nbest}")
    if args.top_k is not None and args.top_k < 0:
        raise UserError(f"--top-k must be 0 (all tokens) or more, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UserError(f"--top-p must be in (0, 1], got {args.top_p:g}")
    if args.temperature is not None and not args.temperature > 0:
        raise UserError(f"--temperature must be positive, got {args.temperature:g}")
    return dict(do_sample=True, num_beams=1, top_k=args.top_k or 0, top_p=1.0 if args.top_p is None else args.top_p,
                temperature=1.0 if args.temperature is None else args.temperature,
                seed=0 if args.seed is None else args.seed)


def check_hypotheses_arguments(args: argparse.Namespace) -> None:
    """The n-best flags agree, before any work; `args.format` set to what it defaults to."""
    if args.format is None:
        args.format = "tsv" if args.nbest is not None or args.token_scores or args.alignment else "text"
    for flag, given in (("--token-scores", args.token_scores), ("--alignment", args.alignment)):
        if args.format == "text" and given:
            raise UserError(f"{flag} needs --format tsv or jsonl (text holds the translations only)")
    if args.alignment_layer is not None and not args.alignment:
        raise UserError("--alignment-layer chooses the layer that --alignment reads: give --alignment hard or soft")
    if args.alignment and args.backend == "onnx":
        raise UserError("--alignment reads the encoder-decoder attention, which the ONNX export's decoder does not "
                        "return: use --backend torch or ct2")
    if args.format == "text" and (args.nbest or 1) > 1:
        raise UserError(f"--nbest {args.nbest} needs --format tsv or jsonl (text holds one translation a line)")


def with_nbest(translate, args: argparse.Namespace):
    """`translate` giving each line's hypotheses (`inference.hypotheses.Hypothesis`), its n-best setting checked
    against the number of beams the decoding has, before any input is read."""
    from ..inference.hypotheses import TooManyHypothesesError

    translate = functools.partial(translate, nbest=args.nbest or 1, token_scores=args.token_scores)
    if args.alignment:
        translate = functools.partial(translate, alignment=args.alignment, alignment_layer=args.alignment_layer)
    try:
        translate([])  # no line: the decoding settings alone are resolved and checked
    except TooManyHypothesesError as error:
        raise UserError(f"--nbest {error.nbest} is more than the {error.num_beams} beam(s) of the search: give "
                        f"--num-beams {error.nbest} or more, or a smaller --nbest") from None
    except (AlignmentLayerError, AlignmentUnavailableError) as error:
        raise UserError(command_line_message(error)) from None
    return translate


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def _cell(text: str) -> str:
    """A translation in a tab-separated line: a tab or line break inside it becomes a space."""
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ")


def hypothesis_lines(number: int, hypotheses, format: str, token_scores: bool, alignment: bool = False) -> str:
    """The lines of input line `number`'s hypotheses in `format`: tsv or jsonl, one hypothesis a line, with their
    tokens' scores and `alignment` when asked; text, the best one's translation."""
    if format == "text":
        return _cell(hypotheses[0].text) + "\n"
    lines = []
    for rank, hypothesis in enumerate(hypotheses, start=1):
        if format == "jsonl":
            record = dict(line=number, rank=rank, translation=hypothesis.text, score=hypothesis.score,
                          log_probability=hypothesis.log_probability)
            if token_scores:
                record.update(tokens=list(hypothesis.tokens or ()), token_scores=list(hypothesis.token_scores or ()))
            if alignment:
                record.update(alignment=hypothesis.alignment or [])
            lines.append(json.dumps(record, ensure_ascii=False) + "\n")
            continue
        fields = [str(number), str(rank), _number(hypothesis.score), _number(hypothesis.log_probability),
                  _cell(hypothesis.text)]
        if token_scores:
            fields += [" ".join(hypothesis.tokens or ()), " ".join(map(_number, hypothesis.token_scores or ()))]
        if alignment:
            fields.append(_alignment_cell(hypothesis.alignment or []))
        lines.append("\t".join(fields) + "\n")
    return "".join(lines)


def _alignment_cell(alignment: list) -> str:
    """Pharaoh links as fairseq and Marian print them (`0-0 1-2`); a soft matrix as Marian prints it, a target word's
    weights over the source words comma-separated, the target words space-separated."""
    if alignment and isinstance(alignment[0], tuple):
        return pharaoh(alignment)
    return " ".join(",".join(f"{weight:.3f}" for weight in row) for row in alignment)


def pair_score_line(number: int, score, format: str, token_scores: bool) -> str:
    """`score`'s line for pair `number`: line number, log-probability, per token, tokens (and each token's)."""
    if format == "jsonl":
        record = dict(line=number, log_probability=score.log_probability, per_token=score.per_token,
                      num_tokens=score.num_tokens)
        if token_scores:
            record.update(tokens=list(score.tokens), token_scores=list(score.token_scores))
        return json.dumps(record, ensure_ascii=False) + "\n"
    fields = [str(number), _number(score.log_probability), _number(score.per_token), str(score.num_tokens)]
    if token_scores:
        fields += [" ".join(score.tokens), " ".join(map(_number, score.token_scores))]
    return "\t".join(fields) + "\n"


def _score_parser() -> CommandParser:
    parser = CommandParser(
        prog="vanilla-transformer score",
        description="Score given translations: each pair's log-probability under the model (in all, per token, and "
        "its number of tokens, </s> included), one line per pair, in order. Use it to filter a noisy corpus or "
        "rerank an n-best list.",
    )
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="A saved model folder or Hub id; with --backend ct2 or onnx, an export folder.")
    parser.add_argument("--src", required=True, metavar="FILE", help="Source sentences, one a line (.gz: gzip).")
    parser.add_argument("--tgt", required=True, metavar="FILE", help="Their translations, aligned with --src.")
    parser.add_argument("--output", metavar="FILE", help="Where to write the scores; default: standard output.")
    parser.add_argument("--format", choices=("tsv", "jsonl"), default="tsv",
                        help="tsv: line number, log-probability, per token, tokens; jsonl: the same as JSON objects.")
    parser.add_argument("--token-scores", action="store_true", help="Add the tokens and their log-probabilities.")
    parser.add_argument("--batch-size", type=positive_int, default=32, metavar="N", help="Pairs per batch.")
    parser.add_argument("--device", type=device, help="cpu, cuda, cuda:1, ... (default: cuda when available).")
    parser.add_argument("--backend", choices=sorted(SCORERS), default="torch", help="What runs the model.")
    return parser


# Pairs scored at a time: memory stays flat however long the files.
SCORE_CHUNK = 2048


def score_command(argv: list[str]) -> None:
    args = _score_parser().parse_args(argv)
    from tqdm.auto import tqdm

    from ..paths.text_files import InvalidUTF8Error, iter_lines, output_file

    if args.src == "-" and args.tgt == "-":
        raise UserError("--src and --tgt cannot both be standard input")
    check_output_file(args.output)
    counts = {path: check_input_file(path) for path in (args.src, args.tgt) if path != "-"}
    if len(counts) == 2 and counts[args.src] != counts[args.tgt]:
        raise UserError(f"{args.src} has {counts[args.src]} lines but {args.tgt} has {counts[args.tgt]}; source and "
                        "target files must be aligned line by line")
    torch_backend = args.backend == "torch"
    check_model(args.model, config=torch_backend, weights=torch_backend, hub=torch_backend)
    if torch_backend:
        from ..model import register

        register()  # before any Auto class reads the folder (translate does the same)
        check_tokenizer_fits(args.model)
    with user_errors(OSError, ValueError, path=args.model):
        score = SCORERS[args.backend](args.model, args.device)
    missing = object()  # where one file ended before the other (standard input is not counted ahead)
    pairs = itertools.zip_longest(iter_lines(args.src), iter_lines(args.tgt), fillvalue=missing)
    number = 0
    with (
        write_errors(Path(args.output or ".").parent),
        output_file(args.output) as file,
        tqdm(total=max(counts.values(), default=None), unit="pair", disable=not sys.stderr.isatty()) as bar,
        user_errors(InvalidUTF8Error),
    ):
        while chunk := list(itertools.islice(pairs, SCORE_CHUNK)):
            if any(missing in pair for pair in chunk):
                raise UserError(f"{args.src} and {args.tgt} have different numbers of lines; source and target "
                                "files must be aligned line by line")
            sources, targets = zip(*chunk)
            for result in score(list(sources), list(targets), batch_size=args.batch_size, show_progress=False):
                number += 1
                file.write(pair_score_line(number, result, args.format, args.token_scores))
            bar.update(len(chunk))


__all__ = ["FORMATS", "check_hypotheses_arguments", "hypotheses_arguments", "hypothesis_lines", "pair_score_line",
           "sampling_arguments", "sampling_options", "score_command", "with_nbest"]
