"""CTranslate2 export and the `ct2` translation backend.

`export_ctranslate2` writes a saved model as a CTranslate2 `TransformerSpec` (optionally quantized to int8 or float16),
with its tokenizer and generation config, so the folder translates on its own. `ct2_translator` is the `ct2` backend of
`vanilla-transformer translate` and `evaluate`: batched like the PyTorch backend, decoded by CTranslate2's search.
"""

import functools
import itertools
import sys
from pathlib import Path

import ctranslate2
import torch
from ctranslate2.specs import common_spec, transformer_spec
from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES
from tqdm.auto import tqdm
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from .generation_vanilla_transformer import LENGTH_PENALTY_TYPES, PAPER_DECODING, gnmt_length_penalty
from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration, sinusoidal_position_encoding
from .translate import PathLike, Translator, _length_sorted_batches, tokenize_lines


# Weight types CTranslate2 stores: int8, int8_float32, int8_float16, int8_bfloat16, int16, float16, bfloat16, float32.
QUANTIZATIONS = ACCEPTED_MODEL_TYPES

# transformers activations that CTranslate2 computes the same way.
ACTIVATIONS = {
    "relu": common_spec.Activation.RELU,
    "gelu": common_spec.Activation.GELU,
    "gelu_new": common_spec.Activation.GELUTanh,
    "gelu_pytorch_tanh": common_spec.Activation.GELUTanh,
    "silu": common_spec.Activation.SWISH,
    "swish": common_spec.Activation.SWISH,
}


# --- Export ------------------------------------------------------------------------------------------------------


def export_ctranslate2(
    model_dir: PathLike,
    output_dir: PathLike,
    quantization: str | None = None,
    max_positions: int = 2048,
    force: bool = False,
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
    replaced only with `force`.
    """
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"Unknown quantization {quantization!r}; choose one of {', '.join(QUANTIZATIONS)}.")
    if max_positions < 1:
        raise ValueError(f"max_positions must be positive, got {max_positions}.")
    if model_dir.resolve() == output_dir.resolve() or output_dir.resolve() in model_dir.resolve().parents:
        raise ValueError(f"The output folder {output_dir} would replace the model folder {model_dir}; choose another.")
    if output_dir.exists() and not force:
        raise FileExistsError(f"{output_dir} already exists; pass force=True (--force) to replace it.")

    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    spec = transformer_spec_of(model, tokenizer, max_positions)
    # The Converter base class validates the spec, aliases equal weights, quantizes and saves.
    _SpecConverter(spec).convert(str(output_dir), quantization=quantization, force=True)
    tokenizer.save_pretrained(output_dir)
    model.generation_config.save_pretrained(output_dir)
    return output_dir


class _SpecConverter(ctranslate2.converters.Converter):
    def __init__(self, spec: transformer_spec.TransformerSpec):
        self.spec = spec

    def _load(self) -> transformer_spec.TransformerSpec:
        return self.spec


def transformer_spec_of(
    model: VanillaTransformerForConditionalGeneration, tokenizer: PreTrainedTokenizerBase, max_positions: int = 2048
) -> transformer_spec.TransformerSpec:
    """The CTranslate2 `TransformerSpec` of `model`, with `tokenizer`'s vocabulary, weights not yet quantized."""
    config = model.config
    if config.activation_function not in ACTIVATIONS:
        raise ValueError(
            f"activation_function={config.activation_function!r} has no CTranslate2 equivalent; exportable "
            f"activations are {', '.join(ACTIVATIONS)}."
        )
    vocabulary = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    if len(vocabulary) > config.vocab_size:
        raise ValueError(
            f"The tokenizer has {len(vocabulary)} tokens but the model only {config.vocab_size} embeddings; "
            "they were not trained together."
        )
    # Embedding rows the tokenizer never produces (a vocabulary padded to a round size) still need a name.
    vocabulary += [f"<unused_{index}>" for index in range(len(vocabulary), config.vocab_size)]

    # Post-norm (the paper) has no final LayerNorm per stack; pre-norm has one, as CTranslate2's pre_norm expects.
    spec = transformer_spec.TransformerSpec(
        transformer_spec.TransformerEncoderSpec(
            config.encoder_layers,
            config.encoder_attention_heads,
            pre_norm=config.normalize_before,
            activation=ACTIVATIONS[config.activation_function],
        ),
        transformer_spec.TransformerDecoderSpec(
            config.decoder_layers,
            config.decoder_attention_heads,
            pre_norm=config.normalize_before,
            activation=ACTIVATIONS[config.activation_function],
        ),
    )
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

    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(vocabulary)
    eos_token_id = config.eos_token_id[0] if isinstance(config.eos_token_id, list) else config.eos_token_id
    spec.config.bos_token = vocabulary[config.bos_token_id]
    spec.config.eos_token = vocabulary[eos_token_id]
    spec.config.unk_token = tokenizer.unk_token
    spec.config.decoder_start_token = vocabulary[config.decoder_start_token_id]
    spec.config.layer_norm_epsilon = encoder.layers[0].final_layer_norm.eps
    return spec


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
    spec.weight = _tensor(linear.weight)
    if linear.bias is not None:
        spec.bias = _tensor(linear.bias)


def _set_layer_norm(spec, layer_norm: torch.nn.LayerNorm) -> None:
    spec.gamma = _tensor(layer_norm.weight)
    spec.beta = _tensor(layer_norm.bias)


def _set_fused(spec, *linears: torch.nn.Linear) -> None:
    """Linear layers applied to the same input, stored as one (CTranslate2 fuses Q, K, V and K, V)."""
    spec.weight = torch.cat([_tensor(linear.weight) for linear in linears])
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


# --- The ct2 translation backend ---------------------------------------------------------------------------------


def ct2_translator(model_dir: PathLike, device: str | None = None) -> Translator:
    """The CTranslate2 folder `model_dir` (from `export_ctranslate2`) loaded on `device` ("cpu", "cuda", "cuda:1";
    default: CUDA when CTranslate2 sees a GPU), as `ct2_translate_lines` bound to its translator, tokenizer and
    generation config."""
    model_dir = Path(model_dir)
    if not ctranslate2.contains_model(str(model_dir)):
        if (model_dir / "config.json").is_file() and any(model_dir.glob("*.safetensors")):
            raise ValueError(
                f"{model_dir} is a transformers model folder; the ct2 backend needs it exported first: "
                f"`vanilla-transformer export-ct2 --model {model_dir} --out {model_dir}-ct2`, then --model "
                f"{model_dir}-ct2."
            )
        raise ValueError(
            f"{model_dir} holds no CTranslate2 model (model.bin); make one with `vanilla-transformer export-ct2`."
        )
    if device is None:
        device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
    device_type, _, index = device.partition(":")
    translator = ctranslate2.Translator(str(model_dir), device=device_type, device_index=int(index or 0))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if (model_dir / "generation_config.json").is_file():
        generation_config = GenerationConfig.from_pretrained(model_dir)
    else:
        generation_config = GenerationConfig(**PAPER_DECODING)
    return functools.partial(ct2_translate_lines, translator, tokenizer, generation_config=generation_config)


def ct2_translate_lines(
    translator: ctranslate2.Translator,
    tokenizer: PreTrainedTokenizerBase,
    lines: list[str],
    *,
    batch_size: int = 32,
    max_tokens: int | None = None,
    warn_length: int | None = None,
    show_progress: bool | None = None,
    generation_config: GenerationConfig | None = None,
    **options,
) -> list[str]:
    r"""
    Translate each of `lines` with a CTranslate2 `translator`, batched as `translate_lines` does for `generate()`
    (sorted by length, `batch_size` sentences and `max_tokens` tokens at most, empty lines give ""); the translations
    come back in input order.

    The decoding settings of `generate()` are read as it reads them: from `options`, else from `generation_config`
    (the exported model's; section 6.1's when missing):

    - `num_beams` (4 in the paper): CTranslate2's `beam_size`.
    - `length_penalty` (alpha, 0.6) and `length_penalty_type`: CTranslate2's own penalty is transformers' formula,
      finished hypotheses ranked by `log P(Y|X) / |Y|^alpha` (`"transformers"`; `|Y|` counts `</s>`). With `"gnmt"`
      (the paper's) the hypotheses CTranslate2's search finished are re-ranked by `log P(Y|X) / ((5 + |Y|) / 6)^alpha`.
      The search itself ranks candidates by `log P(Y|X)`, as transformers' does, but CTranslate2 stops once
      `beam_size` hypotheses are finished, while `generate()` stops when no running hypothesis can still win
      (`early_stopping="never"`), so the two may finish different hypotheses.
    - `max_new_tokens`: CTranslate2's `max_decoding_length`. Left out, each output ends at the latest after its source
      length + `max_length_over_source` (50) tokens, `</s>` included; as CTranslate2 takes one maximum length per
      call, batches then hold sentences of one length. Where `generate()` ends an output at the limit with `</s>`,
      CTranslate2 stops one token earlier without it: the same text in greedy search, a slightly different score in
      beam search.

    Other `options` go to `Translator.translate_batch` unchanged (`repetition_penalty`, `no_repeat_ngram_size`, ...).
    """
    if batch_size < 1 or (max_tokens is not None and max_tokens < 1):
        raise ValueError(f"batch_size ({batch_size}) and max_tokens ({max_tokens}) must be positive")
    generation_config = generation_config or GenerationConfig(**PAPER_DECODING)

    def setting(name):
        """The call's value, else the generation config's, as generate() reads them."""
        value = options.pop(name, None)
        return getattr(generation_config, name, None) if value is None else value

    num_beams = setting("num_beams") or 1
    alpha = setting("length_penalty")
    alpha = 1.0 if alpha is None else alpha
    length_penalty_type = setting("length_penalty_type") or "transformers"
    if length_penalty_type not in LENGTH_PENALTY_TYPES:
        raise ValueError(f"length_penalty_type must be one of {LENGTH_PENALTY_TYPES}, got {length_penalty_type!r}")
    max_new_tokens = options.pop("max_new_tokens", None)
    # CTranslate2 has one stopping rule, transformers' early_stopping=True: stop once beam_size hypotheses are finished.
    options.pop("early_stopping", None)
    # As in generate(), an explicit None turns the source + 50 rule off.
    if "max_length_over_source" in options:
        max_length_over_source = options.pop("max_length_over_source")
    else:
        max_length_over_source = getattr(generation_config, "max_length_over_source", None)
    # With GNMT, every finished hypothesis comes back with its score, to be re-ranked.
    rerank = length_penalty_type == "gnmt" and num_beams > 1 and alpha != 0
    search = dict(
        beam_size=num_beams,
        length_penalty=alpha,
        num_hypotheses=num_beams if rerank else 1,
        return_scores=rerank,
        return_end_token=True,  # so |Y| counts </s>, as in generate(); decoding drops it
        min_decoding_length=0,  # generate() may end with </s> at once
        max_input_length=0,  # translate whole sentences, as the PyTorch backend does
    )
    search.update(options)

    translations, to_translate, input_ids = tokenize_lines(tokenizer, lines, warn_length)
    if not to_translate:
        return translations
    lengths = [len(ids) for ids in input_ids]
    show_progress = sys.stderr.isatty() if show_progress is None else show_progress

    if max_new_tokens is not None or max_length_over_source is None:
        # generate()'s own limits: max_length counts the decoder start token; with neither set, 20 new tokens.
        limit = max_new_tokens or generation_config.max_new_tokens
        limit = limit or (generation_config.max_length - 1 if generation_config.max_length else 20)
        batches = [(batch, limit) for batch in _length_sorted_batches(lengths, batch_size, max_tokens)]
    else:
        # generate() forces </s> as the last of source + 50 tokens; CTranslate2 stops one token earlier, without it.
        batches = [
            (batch, max(1, lengths[batch[0]] + max_length_over_source - 1))
            for batch in _equal_length_batches(lengths, batch_size, max_tokens)
        ]

    with tqdm(total=len(to_translate), unit="sentence", disable=not show_progress) as bar:
        for batch, max_length in batches:
            sources = [tokenizer.convert_ids_to_tokens(input_ids[k]) for k in batch]
            try:
                results = translator.translate_batch(sources, max_decoding_length=max_length, **search)
            except RuntimeError as error:
                if "position encodings" not in str(error):
                    raise
                raise RuntimeError(
                    f"{error}: the CTranslate2 model has a fixed number of positions; export it again with a larger "
                    "--max-positions, or shorten the input or max_new_tokens"
                ) from error
            for k, result in zip(batch, results):
                tokens = _best_gnmt_hypothesis(result, alpha) if rerank else result.hypotheses[0]
                text = tokenizer.decode(tokenizer.convert_tokens_to_ids(tokens), skip_special_tokens=True)
                translations[to_translate[k]] = text.strip()
            bar.update(len(batch))
    return translations


def _equal_length_batches(lengths: list[int], batch_size: int, max_tokens: int | None) -> list[list[int]]:
    """Indices into `lengths`, longest first, in batches of sentences of one length: CTranslate2 takes one maximum
    output length per call, and the source + 50 rule gives each sentence its own."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)
    batches = []
    for length, group in itertools.groupby(order, key=lengths.__getitem__):
        group = list(group)
        size = max(1, min(batch_size, max_tokens // length)) if max_tokens else batch_size
        batches += [group[start : start + size] for start in range(0, len(group), size)]
    return batches


def _best_gnmt_hypothesis(result, alpha: float) -> list[str]:
    """The finished hypothesis with the best GNMT score, from CTranslate2's scores `log P(Y|X) / |Y|^alpha`."""

    def gnmt_score(hypothesis_and_score):
        tokens, score = hypothesis_and_score
        return score * len(tokens) ** alpha / gnmt_length_penalty(len(tokens), alpha)

    return max(zip(result.hypotheses, result.scores), key=gnmt_score)[0]


__all__ = ["QUANTIZATIONS", "ct2_translate_lines", "ct2_translator", "export_ctranslate2", "transformer_spec_of"]
