"""ONNX export: `export_onnx` writes a saved model as the three ONNX graphs that optimum lays out for an
encoder-decoder model, with the model's config, generation config and tokenizer, so that the folder translates on its
own with ONNX Runtime (`model.VanillaTransformerORTForConditionalGeneration`, and the `onnx` backend of
`vanilla-transformer translate` and `evaluate`). Needs the `onnx` extra.

- `encoder_model.onnx`: `input_ids`, `attention_mask` (batch_size, encoder_sequence_length) -> `last_hidden_state`.
- `decoder_model.onnx`, the first decoding step: `encoder_attention_mask`, `input_ids` (batch_size,
  decoder_sequence_length) and `encoder_hidden_states` -> `logits` and, for each layer i, `present.i.decoder.key` and
  `.value` (the self-attention cache) and `present.i.encoder.key` and `.value` (the encoder output projected to the
  encoder-decoder attention's keys and values: once per sentence, as in the PyTorch model).
- `decoder_with_past_model.onnx`, every later step: `encoder_attention_mask`, `input_ids` and the cache as
  `past_key_values.i.decoder.key` (batch_size, heads, past_decoder_sequence_length, d_k), `.decoder.value` (..., d_v),
  `.encoder.key` and `.encoder.value` -> `logits` and `present.i.decoder.key` and `.value`, the cache grown by the new
  tokens. Keys have d_k and values d_v dimensions per head (d_model / h unless the config sets them, section 3.2.2).

The graphs come from `torch.onnx.export` (torch.export), with dynamic batch and length axes.
"""

import contextlib
import copy
import logging
import os
import warnings
from pathlib import Path

import torch
from packaging.version import Version
from torch import nn
from transformers import AutoTokenizer
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from ...extras import MissingExtraError, require
from ...paths.text_files import output_folder
from ..ctranslate2.export import check_export
from . import DECODER_FILE, DECODER_WITH_PAST_FILE, ENCODER_FILE, ONNX_FILES, QUANTIZATIONS
from ...model.modeling_vanilla_transformer import (
    SinusoidalPositionalEncoding,
    VanillaTransformerForConditionalGeneration,
    sinusoidal_position_encoding,
)

# The torch release whose torch.onnx.export is torch.export-based by default, the exporter this module is written for.
EXPORTER_TORCH = (2, 9)


# Example sizes of the traced inputs: distinct, and above 1, so that torch.export keeps every axis dynamic.
EXAMPLE_BATCH, EXAMPLE_SOURCE, EXAMPLE_TARGET, EXAMPLE_PAST = 2, 7, 3, 5


def cache_names(prefix: str, layers: int, parts=("decoder", "encoder")) -> list[str]:
    """`prefix.i.part.key` and `.value` for each layer i: optimum's names of the cache tensors, layer by layer."""
    return [f"{prefix}.{i}.{part}.{kind}" for i in range(layers) for part in parts for kind in ("key", "value")]


class EncoderGraph(nn.Module):
    """The encoder of `model` as `encoder_model.onnx` computes it."""

    def __init__(self, model: VanillaTransformerForConditionalGeneration):
        super().__init__()
        self.encoder = model.model.encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class DecoderGraph(nn.Module):
    """A decoding step of `model` with its cache as flat tensors: the first step (`decoder_model.onnx`) from the
    encoder output, or a later one (`decoder_with_past_model.onnx`) from the cache of the earlier steps."""

    def __init__(self, model: VanillaTransformerForConditionalGeneration, with_past: bool):
        super().__init__()
        self.decoder, self.lm_head = model.model.decoder, model.lm_head
        self.layers, self.d_model = model.config.decoder_layers, model.config.d_model
        self.with_past = with_past

    def forward(self, encoder_attention_mask, input_ids, encoder_states_or_cache):
        self_attention, cross_attention = DynamicCache(), DynamicCache()
        cache = EncoderDecoderCache(self_attention, cross_attention)
        if self.with_past:
            past = encoder_states_or_cache  # per layer: self-attention key, value, encoder key, value
            for i in range(self.layers):
                self_attention.update(past[4 * i], past[4 * i + 1], i)
                cross_attention.update(past[4 * i + 2], past[4 * i + 3], i)
                cache.is_updated[i] = True
            # Once its keys and values are cached, the encoder output is read for its shape only (the mask's length).
            batch, _, source_length, _ = past[2].shape
            encoder_hidden_states = past[2].new_zeros(()).expand(batch, source_length, self.d_model)
        else:
            encoder_hidden_states = encoder_states_or_cache
        outputs = self.decoder(
            input_ids=input_ids,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            cache=cache,
            use_cache=True,
        )
        present = []
        for i in range(self.layers):
            present += [self_attention.layers[i].keys, self_attention.layers[i].values]
            if not self.with_past:
                present += [cross_attention.layers[i].keys, cross_attention.layers[i].values]
        return (self.lm_head(outputs.last_hidden_state), *present)


def export_onnx(
    model_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    quantize: str | None = None,
    max_positions: int = 2048,
    force: bool = False,
) -> Path:
    """
    Export the saved model in `model_dir` (from train, average or `save_pretrained`, with its tokenizer) to the ONNX
    folder `output_dir`: `encoder_model.onnx`, `decoder_model.onnx` and `decoder_with_past_model.onnx` (module
    docstring), `config.json`, `generation_config.json` and the tokenizer, all that translating needs.

    `quantize="int8"` quantizes the three graphs with ONNX Runtime's dynamic quantization (`QUANTIZATIONS`); default:
    float32, as trained. Sinusoidal positions are stored as a table of their first `max_positions` rows, so that
    sources and outputs are each at most `max_positions` tokens long; learned positions keep their table. The folder's
    `config.json` gives that length as `max_position_embeddings`. The exported graphs are checked against the model
    on inputs of other shapes than the traced ones. An existing `output_dir` is replaced only with `force`, and only
    once the new folder is complete.
    """
    require("onnx", extra="onnx")
    require("onnxscript", extra="onnx")  # torch.onnx.export's translation of torch.export graphs
    ort = require("onnxruntime", extra="onnx")
    if Version(torch.__version__).release < EXPORTER_TORCH:
        raise MissingExtraError(f"the ONNX export needs torch >= {'.'.join(map(str, EXPORTER_TORCH))} (its "
                                f"torch.export-based exporter), found {torch.__version__}: pip install -U torch")
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    check_export(model_dir, output_dir, quantize, QUANTIZATIONS, max_positions, force)

    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    config = copy.deepcopy(model.config)  # the folder's
    # The eager kernel is the formula of section 3.2.1 as plain operators, which every ONNX runtime has.
    model.set_attn_implementation("eager")
    for stack in (model.model.encoder, model.model.decoder):
        if isinstance(stack.embed_positions, SinusoidalPositionalEncoding):
            stack.embed_positions.table = sinusoidal_position_encoding(max_positions, config.d_model)
            config.max_position_embeddings = max_positions

    # Written beside `output_dir` and renamed into place when complete: an interrupted export leaves no half folder.
    with output_folder(output_dir) as folder:
        with torch.no_grad():
            _export_graphs(model, folder)
            check_graphs(model, folder, ort)
        if quantize == "int8":
            for name in ONNX_FILES:
                quantize_int8(folder / name)
        # The folder holds no model code: its config names the configuration class only.
        config.auto_map = {key: value for key, value in (config.auto_map or {}).items() if key == "AutoConfig"}
        config.save_pretrained(folder)
        model.generation_config.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return output_dir


@contextlib.contextmanager
def _quiet_export():
    """torch.export, the ONNX translation and ONNX Runtime's quantizer report their steps and choices as warnings and
    log lines (the quantizer through the root logger, which `logging.warning` would configure as a side effect): the
    export command prints its own result."""
    loggers = [logging.getLogger(), logging.getLogger("torch.onnx")]
    levels = [logger.level for logger in loggers]
    silent = logging.NullHandler()
    loggers[0].addHandler(silent)
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        loggers[0].removeHandler(silent)
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _export_graphs(model: VanillaTransformerForConditionalGeneration, folder: Path) -> None:
    """The three graphs of `model` written into `folder`, traced on example inputs with padding."""
    from torch.export import Dim

    config = model.config
    layers = config.decoder_layers
    batch, source, target, past = (Dim(name) for name in (
        "batch_size", "encoder_sequence_length", "decoder_sequence_length", "past_decoder_sequence_length"))
    generator = torch.Generator().manual_seed(0)  # example token ids that leave the caller's random state alone
    input_ids, attention_mask = _example_batch(config, EXAMPLE_BATCH, EXAMPLE_SOURCE, generator)
    decoder_input_ids = torch.randint(0, config.vocab_size, (EXAMPLE_BATCH, EXAMPLE_TARGET), generator=generator)
    encoder_hidden_states = EncoderGraph(model)(input_ids, attention_mask)
    # The later steps' example cache: that of a first step on EXAMPLE_PAST tokens.
    past_ids = torch.randint(0, config.vocab_size, (EXAMPLE_BATCH, EXAMPLE_PAST), generator=generator)
    example_cache = list(DecoderGraph(model, with_past=False)(attention_mask, past_ids, encoder_hidden_states)[1:])
    heads = config.decoder_attention_heads
    d_k, d_v = config.head_sizes(heads)
    logits_shape = ("batch_size", "decoder_sequence_length", config.vocab_size)

    def cache_shape(name, length):
        length = "encoder_sequence_length" if ".encoder." in name else length
        return ("batch_size", heads, length, d_k if name.endswith(".key") else d_v)

    graphs = {
        ENCODER_FILE: (
            EncoderGraph(model),
            (input_ids, attention_mask),
            ({0: batch, 1: source}, {0: batch, 1: source}),
            {"input_ids": ("batch_size", "encoder_sequence_length"),
             "attention_mask": ("batch_size", "encoder_sequence_length")},
            {"last_hidden_state": ("batch_size", "encoder_sequence_length", config.d_model)},
        ),
        DECODER_FILE: (
            DecoderGraph(model, with_past=False),
            (attention_mask, decoder_input_ids, encoder_hidden_states),
            ({0: batch, 1: source}, {0: batch, 1: target}, {0: batch, 1: source}),
            {"encoder_attention_mask": ("batch_size", "encoder_sequence_length"),
             "input_ids": ("batch_size", "decoder_sequence_length"),
             "encoder_hidden_states": ("batch_size", "encoder_sequence_length", config.d_model)},
            {"logits": logits_shape,
             **{name: cache_shape(name, "decoder_sequence_length") for name in cache_names("present", layers)}},
        ),
        DECODER_WITH_PAST_FILE: (
            DecoderGraph(model, with_past=True),
            (attention_mask, decoder_input_ids, example_cache),
            ({0: batch, 1: source}, {0: batch, 1: target},
             [{0: batch, 2: source if ".encoder." in name else past}
              for name in cache_names("past_key_values", layers)]),
            {"encoder_attention_mask": ("batch_size", "encoder_sequence_length"),
             "input_ids": ("batch_size", "decoder_sequence_length"),
             **{name: cache_shape(name, "past_decoder_sequence_length")
                for name in cache_names("past_key_values", layers)}},
            {"logits": logits_shape,
             **{name: cache_shape(name, "past_decoder_sequence_length + decoder_sequence_length")
                for name in cache_names("present", layers, parts=("decoder",))}},
        ),
    }
    for name, graph in graphs.items():
        _write_graph(folder / name, *graph)


def _write_graph(path: Path, graph: nn.Module, inputs, dynamic_shapes, input_shapes: dict, output_shapes: dict) -> None:
    """`graph` exported on the example `inputs` with its dynamic axes, the axes named, and saved as `path`."""
    with _quiet_export():
        program = torch.onnx.export(
            graph, inputs, input_names=list(input_shapes), output_names=list(output_shapes),
            dynamic_shapes=dynamic_shapes, dynamo=True, external_data=False, verbose=False,
        )
    _name_axes(program.model_proto, {**input_shapes, **output_shapes})
    _save(program.model_proto, path)


def _example_batch(config, batch_size: int, length: int, generator: torch.Generator):
    """Random source ids and their attention mask, the last row padded after its first two tokens."""
    input_ids = torch.randint(0, config.vocab_size, (batch_size, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[-1, 2:] = 0
    input_ids[-1, 2:] = config.pad_token_id or 0
    return input_ids, attention_mask


def _name_axes(model_proto, shapes: dict[str, tuple]) -> None:
    """Give the graph's inputs and outputs their shapes with optimum's axis names (the exporter names some axes after
    the operators that compute them)."""
    for value in [*model_proto.graph.input, *model_proto.graph.output]:
        dims = value.type.tensor_type.shape.dim
        for dim, size in zip(dims, shapes[value.name]):
            if isinstance(size, int):
                dim.dim_value = size
            else:
                dim.dim_param = size


def _save(model_proto, path: Path) -> None:
    import onnx

    onnx.save_model(model_proto, str(path))


def check_graphs(model: VanillaTransformerForConditionalGeneration, folder: Path, ort, atol: float = 1e-4) -> None:
    """Run the exported graphs on a batch of other shapes than the traced one, through a first step and two cached
    ones, and compare their logits with the model's (a `RuntimeError` past `atol`)."""
    import numpy

    config = model.config
    sessions = {
        name: ort.InferenceSession(str(folder / name), providers=["CPUExecutionProvider"]) for name in ONNX_FILES
    }
    generator = torch.Generator().manual_seed(1)
    input_ids, attention_mask = _example_batch(config, EXAMPLE_BATCH + 1, EXAMPLE_SOURCE + 2, generator)
    decoder_input_ids = torch.randint(0, config.vocab_size, (EXAMPLE_BATCH + 1, 4), generator=generator)
    expected = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    mask = attention_mask.numpy()
    (encoder_hidden_states,) = sessions[ENCODER_FILE].run(
        None, {"input_ids": input_ids.numpy(), "attention_mask": mask}
    )
    logits, *present = sessions[DECODER_FILE].run(
        None, {"encoder_attention_mask": mask, "input_ids": decoder_input_ids[:, :2].numpy(),
               "encoder_hidden_states": encoder_hidden_states})
    steps = [logits]
    past = dict(zip(cache_names("past_key_values", config.decoder_layers), present))
    for position in (2, 3):
        logits, *present = sessions[DECODER_WITH_PAST_FILE].run(
            None, {"encoder_attention_mask": mask, "input_ids": decoder_input_ids[:, position:position + 1].numpy(),
                   **past})
        steps.append(logits)
        past.update(zip(cache_names("past_key_values", config.decoder_layers, parts=("decoder",)), present))
    difference = (torch.from_numpy(numpy.concatenate(steps, axis=1)) - expected).abs().max().item()
    if difference > atol:
        raise RuntimeError(
            f"The exported graphs' logits differ from the model's by {difference:.2e} (more than {atol})."
        )


def quantize_int8(path: Path) -> None:
    """The ONNX model at `path` replaced by its dynamic int8 quantization (ONNX Runtime's `quantize_dynamic`): weights
    of the matrix products stored as int8, activations quantized to uint8 per tensor as they are computed."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantized = path.with_name(path.stem + "_int8.onnx")
    with _quiet_export():
        quantize_dynamic(path, quantized, weight_type=QuantType.QInt8)
    quantized.replace(path)


__all__ = ["export_onnx", "quantize_int8"]
