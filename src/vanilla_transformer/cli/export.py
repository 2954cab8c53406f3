"""`vanilla-transformer export-ct2` and `export-onnx`: a saved model written as a folder that the `ct2` or `onnx`
backend of `translate` and `evaluate` runs."""

import argparse
import functools
import json
from pathlib import Path

from ..backends import ExportSettingsError, UnsupportedModelError, ctranslate2, onnx
from ..paths.disk import folder_size, write_errors
from ..errors import CommandParser
from ..paths.files import check_output_folder
from ..hub.reachability import check_model
from ..inference.hypotheses import ALIGNMENT_LAYER, AlignmentLayerError
from ..paths.model_folders import check_tokenizer_fits
from .arguments import positive_int
from .errors import user_errors


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
        type=positive_int,
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


# How many copies of the weights and the stored position table an export writes: CTranslate2 one model.bin; ONNX
# three graphs (encoder, decoder, decoder with past), each with its weights and positions.
COPIES_WRITTEN = {"CTranslate2": 1, "ONNX": 3}


def _size_written(args: argparse.Namespace, kind: str) -> int:
    """About the bytes the export writes: its copies of the weights (float32, as saved) and of the position table of
    --max-positions rows, which a tiny model's weights are far smaller than."""
    d_model = json.loads((Path(args.model) / "config.json").read_text(encoding="utf-8")).get("d_model", 0)
    table = args.max_positions * d_model * 4 if isinstance(d_model, int) else 0
    return COPIES_WRITTEN[kind] * (folder_size(args.model, "model.safetensors") + table)


def _write(export, args: argparse.Namespace, quantization: str | None, kind: str) -> None:
    """`export(model, out, quantization, max_positions, force=...)` on the parsed flags, and the line that says so."""
    # The export's own refusals; OSError: FileExistsError without --force, a folder it cannot write; a full disk is
    # named with the space. Any other exception is a bug and keeps its traceback.
    with user_errors(ExportSettingsError, UnsupportedModelError, AlignmentLayerError, OSError), \
            write_errors(args.out, _size_written(args, kind)):
        export(args.model, args.out, quantization, args.max_positions, force=args.force)
    print(f"{kind} model written to {args.out}")


def export_ct2_command(argv: list[str]) -> None:
    parser = _export_parser(
        "vanilla-transformer export-ct2",
        "Convert a saved model to CTranslate2 for fast CPU and GPU inference (`translate --backend ct2`); the folder "
        "also holds the tokenizer and generation config.",
        "CTranslate2",
    )
    parser.add_argument(
        "--quantization",
        choices=ctranslate2.QUANTIZATIONS,
        help="Type of the stored weights (default: float32, as trained).",
    )
    parser.add_argument(
        "--alignment-layer",
        type=int,
        default=ALIGNMENT_LAYER,
        metavar="N",
        help="The decoder layer whose encoder-decoder attention, heads averaged, `translate --alignment` reads, from 0; "
        f"negative counts from the last (default: {ALIGNMENT_LAYER}). CTranslate2 fixes it in the export.",
    )
    args = _export_arguments(parser, argv)
    from ..backends.ctranslate2.export import export_ctranslate2

    export = functools.partial(export_ctranslate2, alignment_layer=args.alignment_layer)
    _write(export, args, args.quantization, "CTranslate2")


def export_onnx_command(argv: list[str]) -> None:
    parser = _export_parser(
        "vanilla-transformer export-onnx",
        "Export a saved model to ONNX for ONNX Runtime (`translate --backend onnx`): encoder_model.onnx, "
        "decoder_model.onnx and decoder_with_past_model.onnx, with the config, generation config and tokenizer.",
        "ONNX",
    )
    parser.add_argument(
        "--quantize",
        choices=onnx.QUANTIZATIONS,
        help="Quantize the weights with ONNX Runtime's dynamic quantization (default: float32, as trained).",
    )
    args = _export_arguments(parser, argv)
    from ..backends.onnx.export import export_onnx

    _write(export_onnx, args, args.quantize, "ONNX")
