"""CTranslate2 export: `export_ctranslate2` writes a saved model as a CTranslate2 `TransformerSpec` (optionally
quantized to int8 or float16), with its tokenizer and generation config, so the folder translates on its own with the
`ct2` backend of `vanilla-transformer translate` and `evaluate` (`search.py`). Needs the `ct2` extra.
"""

import os
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from ...errors import FolderExistsError
from ...extras import require
from ...model.modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    sinusoidal_position_encoding,
)
from ...paths.text_files import output_folder
from .. import ExportSettingsError, UnsupportedModelError
from ...inference.hypotheses import ALIGNMENT_LAYER, AlignmentLayerError
from . import EXPORTED_ALIGNMENT, QUANTIZATIONS


# transformers activations that CTranslate2 computes the same way: its `common_spec.Activation` of each.
ACTIVATIONS = {
    "relu": "RELU",
    "gelu": "GELU",
    "gelu_new": "GELUTanh",
    "gelu_pytorch_tanh": "GELUTanh",
    "silu": "SWISH",
    "swish": "SWISH",
}


def check_export(model_dir: Path, output_dir: Path, quantization, quantizations, max_positions: int, force: bool):
    """The checks an export makes before it loads anything (this one and the ONNX one): a known quantization, a
    positive position table, an output folder that is not the model's, and none replaced without `force`."""
    if quantization is not None and quantization not in quantizations:
        raise ExportSettingsError(f"Unknown quantization {quantization!r}; choose one of {', '.join(quantizations)}.")
    if max_positions < 1:
        raise ExportSettingsError(f"max_positions must be positive, got {max_positions}.")
    if model_dir.resolve() == output_dir.resolve() or output_dir.resolve() in model_dir.resolve().parents:
        raise ExportSettingsError(
            f"The output folder {output_dir} would replace the model folder {model_dir}; choose another.")
    if output_dir.exists() and not force:
        raise FolderExistsError(output_dir, "already exists")


def export_ctranslate2(
    model_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    quantization: str | None = None,
    max_positions: int = 2048,
    force: bool = False,
    alignment_layer: int = ALIGNMENT_LAYER,
) -> Path:
    """
    Convert the saved model in `model_dir` (from train, average or `save_pretrained`, with its tokenizer) into a
    CTranslate2 model folder `output_dir`, which `ctranslate2.Translator` and `translate --backend ct2` load.

    `quantization` is the weight type CTranslate2 stores (`QUANTIZATIONS`: "int8", "int8_float32", "float16", ...;
    default: float32 as trained). Sinusoidal positions are stored as a table of their first `max_positions` rows
    (CTranslate2's own sinusoids put sines and cosines in halves, not interleaved as in section 3.5), so source and
    output are each at most `max_positions` tokens long; learned positions keep their table. The one embedding matrix
    is written once: CTranslate2 aliases the encoder, decoder and output projection weights to it. The tokenizer and
    `generation_config.json` are copied, so the folder is all that translation needs. An existing `output_dir` is
    replaced only with `force`. The attention CTranslate2 returns for word alignment (`return_attention`) is decoder
    layer `alignment_layer`'s encoder-decoder attention, every head averaged, as the torch backend aligns
    (`inference.alignment`); the layer is fixed here and recorded in the folder's config.json (`exported_alignment`).
    """
    ctranslate2 = require("ctranslate2", extra="ct2")
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    check_export(model_dir, output_dir, quantization, QUANTIZATIONS, max_positions, force)

    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    spec = transformer_spec_of(model, tokenizer, max_positions, alignment_layer)

    class SpecConverter(ctranslate2.converters.Converter):
        """Hands `spec` to CTranslate2's Converter, which validates it, aliases equal weights, quantizes and saves."""

        def _load(self):
            return spec

    # Written beside `output_dir` and renamed into place when complete: an interrupted export leaves no half folder.
    with output_folder(output_dir) as folder:
        SpecConverter().convert(str(folder), quantization=quantization, force=True)
        tokenizer.save_pretrained(folder)
        model.generation_config.save_pretrained(folder)
    return output_dir


def transformer_spec_of(
    model: VanillaTransformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    max_positions: int = 2048,
    alignment_layer: int = ALIGNMENT_LAYER,
):
    """The CTranslate2 `TransformerSpec` of `model`, with `tokenizer`'s vocabulary, weights not yet quantized; its
    attention for alignment is decoder layer `alignment_layer`'s (negative: from the last), all heads averaged."""
    require("ctranslate2", extra="ct2")
    from ctranslate2.specs import common_spec, transformer_spec

    config = model.config
    layers = config.decoder_layers
    if not -layers <= alignment_layer < layers:
        raise AlignmentLayerError(alignment_layer, layers)
    if config.activation_function not in ACTIVATIONS:
        raise UnsupportedModelError(
            f"activation_function={config.activation_function!r} has no CTranslate2 equivalent; exportable "
            f"activations are {', '.join(ACTIVATIONS)}."
        )
    encoder_head_dim, decoder_head_dim = (
        _head_dim(config, heads) for heads in (config.encoder_attention_heads, config.decoder_attention_heads)
    )
    vocabulary = _vocabulary(tokenizer, config.vocab_size)

    activation = common_spec.Activation[ACTIVATIONS[config.activation_function]]
    # Post-norm (the paper) has no final LayerNorm per stack; pre-norm has one, as CTranslate2's pre_norm expects.
    spec = transformer_spec.TransformerSpec(
        transformer_spec.TransformerEncoderSpec(
            config.encoder_layers,
            config.encoder_attention_heads,
            pre_norm=config.normalize_before,
            activation=activation,
            **encoder_head_dim,
        ),
        transformer_spec.TransformerDecoderSpec(
            config.decoder_layers,
            config.decoder_attention_heads,
            pre_norm=config.normalize_before,
            activation=activation,
            alignment_layer=alignment_layer % layers,
            alignment_heads=0,  # CTranslate2's 0: every head, averaged
            **decoder_head_dim,
        ),
    )
    _set_weights(spec, model, max_positions)

    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(vocabulary)
    eos_token_id = config.eos_token_id[0] if isinstance(config.eos_token_id, list) else config.eos_token_id
    spec.config.bos_token = vocabulary[config.bos_token_id]
    spec.config.eos_token = vocabulary[eos_token_id]
    spec.config.unk_token = tokenizer.unk_token
    spec.config.decoder_start_token = vocabulary[config.decoder_start_token_id]
    spec.config.layer_norm_epsilon = model.model.encoder.layers[0].final_layer_norm.eps
    # CTranslate2 keeps the alignment settings among the weights; the backend reads them here (search.py).
    spec.config.add_attribute(EXPORTED_ALIGNMENT, dict(decoder_layer=alignment_layer % layers, decoder_layers=layers,
                                                       heads="averaged"))
    return spec


def _head_dim(config, heads: int) -> dict:
    """The `head_dim` argument of CTranslate2's spec for an attention of `heads` heads: none where a head is
    CTranslate2's default d_model / h in size. CTranslate2 has one size per head for queries, keys and values, so d_k
    and d_v must be equal."""
    d_k, d_v = config.head_sizes(heads)
    if d_k != d_v:
        raise UnsupportedModelError(
            f"CTranslate2 cannot run d_k={d_k} with d_v={d_v} (queries and keys of another size per head than values, "
            "as in Table 3 row (B)): its attention has one size per head. Translate with the torch or onnx backend."
        )
    return {} if d_k * heads == config.d_model else dict(head_dim=d_k)


def _vocabulary(tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> list[str]:
    """The tokenizer's tokens in id order, one for each of the model's `vocab_size` embedding rows."""
    vocabulary = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    if len(vocabulary) > vocab_size:
        raise UnsupportedModelError(
            f"The tokenizer has {len(vocabulary)} tokens but the model only {vocab_size} embeddings; "
            "they were not trained together."
        )
    # Embedding rows the tokenizer never produces (a vocabulary padded to a round size) still need a name.
    return vocabulary + [f"<unused_{index}>" for index in range(len(vocabulary), vocab_size)]


def _set_weights(spec, model: VanillaTransformerForConditionalGeneration, max_positions: int) -> None:
    """Every weight of `model` in its place in the `TransformerSpec`, layer by layer."""
    encoder, decoder = model.model.encoder, model.model.decoder
    for stack_spec, stack in ((spec.encoder, encoder), (spec.decoder, decoder)):
        _set_embeddings(stack_spec, stack, max_positions)
        for layer_spec, layer in zip(stack_spec.layer, stack.layers):
            _set_self_attention(layer_spec.self_attention, layer.self_attn, layer.self_attn_layer_norm)
            if hasattr(layer, "encoder_attn"):
                _set_encoder_attention(layer_spec.attention, layer.encoder_attn, layer.encoder_attn_layer_norm)
            _set_linear(layer_spec.ffn.linear_0, layer.fc1)
            _set_linear(layer_spec.ffn.linear_1, layer.fc2)
            _set_layer_norm(layer_spec.ffn.layer_norm, layer.final_layer_norm)
        if stack.layer_norm is not None:
            _set_layer_norm(stack_spec.layer_norm, stack.layer_norm)
    _set_linear(spec.decoder.projection, model.lm_head)


def _tensor(parameter: torch.Tensor) -> torch.Tensor:
    return parameter.detach().float().contiguous()


def _set_embeddings(spec, stack, max_positions: int) -> None:
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _tensor(stack.embed_tokens.weight)
    spec.scale_embeddings = stack.embed_scale  # sqrt(d_model) (section 3.4), or 1
    if isinstance(stack.embed_positions, torch.nn.Embedding):
        spec.position_encodings.encodings = _tensor(stack.embed_positions.weight)
    else:
        spec.position_encodings.encodings = sinusoidal_position_encoding(max_positions, stack.config.d_model)


def _set_linear(spec, linear: torch.nn.Linear) -> None:
    """A CTranslate2 `LinearSpec`, whose bias is optional: set only where the layer has one (the attention
    projections have none unless `config.attention_bias`)."""
    spec.weight = _tensor(linear.weight)
    if linear.bias is not None:
        spec.bias = _tensor(linear.bias)


def _set_layer_norm(spec, layer_norm: torch.nn.LayerNorm) -> None:
    spec.gamma = _tensor(layer_norm.weight)
    spec.beta = _tensor(layer_norm.bias)


def _set_fused(spec, *linears: torch.nn.Linear) -> None:
    """Linear layers applied to the same input, stored as one (CTranslate2 fuses Q, K, V and K, V); biased all of them
    or none, as `config.attention_bias` says."""
    spec.weight = torch.cat([_tensor(linear.weight) for linear in linears])
    if linears[0].bias is not None:
        spec.bias = torch.cat([_tensor(linear.bias) for linear in linears])


def _set_self_attention(spec, attention, layer_norm) -> None:
    _set_fused(spec.linear[0], attention.q_proj, attention.k_proj, attention.v_proj)
    _set_linear(spec.linear[1], attention.out_proj)
    _set_layer_norm(spec.layer_norm, layer_norm)


def _set_encoder_attention(spec, attention, layer_norm) -> None:
    _set_linear(spec.linear[0], attention.q_proj)
    _set_fused(spec.linear[1], attention.k_proj, attention.v_proj)
    _set_linear(spec.linear[2], attention.out_proj)
    _set_layer_norm(spec.layer_norm, layer_norm)


__all__ = ["ACTIVATIONS", "export_ctranslate2", "transformer_spec_of"]
