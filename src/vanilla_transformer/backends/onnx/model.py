"""A folder written by `vanilla-transformer export-onnx` (`export.py`) run by ONNX Runtime behind transformers'
`generate()`: `VanillaTransformerORTForConditionalGeneration` is a model without PyTorch weights whose forward runs the
exported graphs, and which decodes with the package's generation mixin, as the PyTorch model does. Needs the `onnx`
extra.

As optimum's ORT models for BART and Marian: the encoder runs once per `generate()` call, the first decoding step runs
`decoder_model.onnx` (which also projects the encoder output to the encoder-decoder attention's keys and values), and
every later step runs `decoder_with_past_model.onnx` on the cache of the earlier ones. The cache is transformers'
`EncoderDecoderCache`, so beam search reorders it through the mixin's `_reorder_cache`, as for the PyTorch model.
"""

import os
import shutil
from pathlib import Path

import numpy
import torch
from torch import nn
from transformers import GenerationConfig
from transformers.cache_utils import DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from ...errors import InputTooLongError, NotExportedError
from ...extras import require
from ...model.configuration_vanilla_transformer import VanillaTransformerConfig
from ...model.decoding_vanilla_transformer import PAPER_DECODING
from ...model.generation_vanilla_transformer import VanillaTransformerGenerationMixin
from ...model.modeling_vanilla_transformer import VanillaTransformerPreTrainedModel
from ...paths.model_folders import is_model_folder
from . import DECODER_FILE, DECODER_WITH_PAST_FILE, ENCODER_FILE, ONNX_FILES
from .export import cache_names


ort = require("onnxruntime", extra="onnx")


def _numpy(tensor: torch.Tensor) -> numpy.ndarray:
    """A CPU tensor's memory as a NumPy array, without a copy when it is contiguous (as the cache tensors are)."""
    return tensor.detach().cpu().contiguous().numpy()


def _check_positions(length: int, max_positions: int, what: str) -> None:
    if length > max_positions:
        raise InputTooLongError(
            f"{what} of {length} tokens is longer than the {max_positions} positions the ONNX model stores")


class ORTEncoder(nn.Module):
    """`encoder_model.onnx`: source token ids to the encoder output, as the PyTorch encoder returns it."""

    main_input_name = "input_ids"

    def __init__(self, session: "ort.InferenceSession", max_positions: int):
        super().__init__()
        self.session = session
        self.max_positions = max_positions

    def forward(
        self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None, **kwargs
    ) -> BaseModelOutput:
        if input_ids is None:
            raise ValueError("The ONNX encoder takes `input_ids`, token ids, not embeddings (`inputs_embeds`).")
        _check_positions(input_ids.shape[1], self.max_positions, "A source")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        (hidden_states,) = self.session.run(
            None, {"input_ids": _numpy(input_ids.long()), "attention_mask": _numpy(attention_mask.long())}
        )
        return BaseModelOutput(last_hidden_state=torch.from_numpy(hidden_states))


class ORTDecoder(nn.Module):
    """`decoder_model.onnx` and `decoder_with_past_model.onnx`: a decoding step's logits, with the cache of the step
    stored in an `EncoderDecoderCache` (self-attention keys and values of every step so far, and the encoder-decoder
    attention's keys and values of the first)."""

    def __init__(
        self,
        session: "ort.InferenceSession",
        session_with_past: "ort.InferenceSession",
        layers: int,
        max_positions: int,
    ):
        super().__init__()
        self.session, self.session_with_past = session, session_with_past
        self.layers = layers
        self.max_positions = max_positions
        self.present_names = cache_names("present", layers)
        self.past_names = cache_names("past_key_values", layers)

    def forward(
        self,
        input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
        cache: EncoderDecoderCache | None = None,
        use_cache: bool = True,
    ) -> tuple[torch.Tensor, EncoderDecoderCache | None]:
        past_length = cache.get_seq_length() if cache is not None else 0
        _check_positions(past_length + input_ids.shape[1], self.max_positions, "An output")
        inputs = {
            "encoder_attention_mask": _numpy(encoder_attention_mask.long()),
            "input_ids": _numpy(input_ids.long()),
        }
        if past_length == 0:
            inputs["encoder_hidden_states"] = _numpy(encoder_hidden_states)
            logits, *present = self.session.run(None, inputs)
            if not use_cache:
                return torch.from_numpy(logits), None
            if cache is None:
                cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
            for i in range(self.layers):
                keys, values, encoder_keys, encoder_values = present[4 * i : 4 * i + 4]
                self._store(cache.self_attention_cache, i, keys, values)
                self._store(cache.cross_attention_cache, i, encoder_keys, encoder_values)
                cache.is_updated[i] = True
            return torch.from_numpy(logits), cache

        for i, name in enumerate(self.past_names):
            layer = cache.self_attention_cache if ".decoder." in name else cache.cross_attention_cache
            states = layer.layers[i // 4]
            inputs[name] = _numpy(states.keys if name.endswith(".key") else states.values)
        logits, *present = self.session_with_past.run(None, inputs)
        for i in range(self.layers):
            self._store(cache.self_attention_cache, i, present[2 * i], present[2 * i + 1])
        return torch.from_numpy(logits), cache

    @staticmethod
    def _store(cache: DynamicCache, layer_index: int, keys: numpy.ndarray, values: numpy.ndarray) -> None:
        """Make the ONNX graph's present keys and values (the whole cache of the layer, not the new part that
        `DynamicCache.update` would append) the layer's cache."""
        while len(cache.layers) <= layer_index:  # a cache made without a config has no layers yet
            cache.layers.append(DynamicLayer())
        layer = cache.layers[layer_index]
        keys, values = torch.from_numpy(keys), torch.from_numpy(values)
        if not layer.is_initialized:
            layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values


class VanillaTransformerORTForConditionalGeneration(
    VanillaTransformerPreTrainedModel, VanillaTransformerGenerationMixin
):
    r"""
    An `export-onnx` folder run by ONNX Runtime, with the `generate()` of
    [`VanillaTransformerForConditionalGeneration`]: greedy and beam search, the GNMT length penalty, the source + 50
    limit and every other generation argument, read from the call, else from the folder's `generation_config.json`.
    It also serves `pipeline("translation", model=model, tokenizer=tokenizer)`.

    The model holds no PyTorch weights; its inputs and outputs are CPU tensors. Sources and outputs are at most
    `config.max_position_embeddings` tokens long (the position table the folder stores; `export-onnx
    --max-positions`), else an `InputTooLongError`.

    Example:

    ```python
    >>> from transformers import AutoTokenizer
    >>> from vanilla_transformer.backends.onnx.model import VanillaTransformerORTForConditionalGeneration
    >>> model = VanillaTransformerORTForConditionalGeneration.from_pretrained("outputs/number-words-en-fr-onnx")
    >>> tokenizer = AutoTokenizer.from_pretrained("outputs/number-words-en-fr-onnx")
    >>> outputs = model.generate(**tokenizer(["forty-two"], return_tensors="pt"))
    ```"""

    main_input_name = "input_ids"

    def __init__(
        self,
        config: VanillaTransformerConfig,
        sessions: dict[str, "ort.InferenceSession"],
        model_dir: str | os.PathLike | None = None,
        generation_config: GenerationConfig | None = None,
    ):
        super().__init__(config)
        self.model_dir = None if model_dir is None else Path(model_dir)
        max_positions = config.max_position_embeddings
        self.encoder = ORTEncoder(sessions[ENCODER_FILE], max_positions)
        self.decoder = ORTDecoder(
            sessions[DECODER_FILE], sessions[DECODER_WITH_PAST_FILE], config.decoder_layers, max_positions
        )
        self.generation_config = generation_config or GenerationConfig(**PAPER_DECODING)
        self.eval()

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | os.PathLike,
        device: str | None = None,
        session_options: "ort.SessionOptions | None" = None,
    ) -> "VanillaTransformerORTForConditionalGeneration":
        """The `export-onnx` folder `model_dir` loaded into ONNX Runtime sessions: on the CPU (`device` None or "cpu"),
        or on a GPU ("cuda", "cuda:1") with the CUDA provider of `onnxruntime-gpu`. `session_options` (e.g. its
        `intra_op_num_threads`) apply to the three sessions; without them, `default_session_options()`."""
        model_dir = Path(model_dir)
        missing = [name for name in ONNX_FILES if not (model_dir / name).is_file()]
        if not model_dir.is_dir():
            raise FileNotFoundError(f"no such folder: {model_dir}")
        if missing:
            raise NotExportedError(model_dir, "onnx", f"ONNX model ({', '.join(missing)} missing)",
                                   is_model_folder(model_dir))
        providers = _providers(device)
        if session_options is None:
            session_options = default_session_options()
        sessions = {
            name: ort.InferenceSession(str(model_dir / name), sess_options=session_options, providers=providers)
            for name in ONNX_FILES
        }
        config = VanillaTransformerConfig.from_pretrained(model_dir)
        generation_config = None
        if (model_dir / "generation_config.json").is_file():
            generation_config = GenerationConfig.from_pretrained(model_dir)
        return cls(config, sessions, model_dir, generation_config)

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs) -> None:
        """Copy the loaded folder's graphs, config and generation config into `save_directory` (the tokenizer saves
        itself)."""
        if self.model_dir is None:
            raise ValueError("This model was not loaded from a folder; export it with export_onnx instead.")
        save_directory = Path(save_directory)
        save_directory.mkdir(parents=True, exist_ok=True)
        if save_directory.resolve() != self.model_dir.resolve():
            for name in (*ONNX_FILES, "config.json"):
                shutil.copyfile(self.model_dir / name, save_directory / name)
        self.generation_config.save_pretrained(save_directory)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")  # where ONNX Runtime reads its inputs and writes its outputs

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def get_encoder(self) -> ORTEncoder:
        return self.encoder

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        cache: EncoderDecoderCache | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        """The logits of `decoder_input_ids` (after the `cache` of the tokens before them, if any) given the source
        `input_ids`, or its `encoder_outputs`. With `use_cache`, the returned cache holds every step's keys and
        values. Attention weights and hidden states are not exported: asking for them is an error."""
        wanted = [name for name in ("output_attentions", "output_hidden_states") if kwargs.get(name)]
        if wanted:
            raise ValueError(f"The ONNX model does not output attentions or hidden states ({', '.join(wanted)}).")
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids, attention_mask)
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        encoder_hidden_states = encoder_outputs.last_hidden_state
        if attention_mask is None:
            attention_mask = torch.ones(encoder_hidden_states.shape[:2], dtype=torch.long)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        logits, cache = self.decoder(
            decoder_input_ids, encoder_hidden_states, attention_mask, cache if use_cache else None, use_cache
        )
        return Seq2SeqLMOutput(logits=logits, cache=cache, encoder_last_hidden_state=encoder_hidden_states)


def default_session_options(intra_op_threads: int = 0) -> "ort.SessionOptions":
    """ONNX Runtime's session options for `generate()`: `intra_op_threads` threads per graph (0: ONNX Runtime's
    choice, one per physical core), and threads that sleep between runs instead of spinning. Between two decoding
    steps PyTorch does `generate()`'s own work (logits processors, beam search, reordering the cache), and spinning
    threads would take the cores it needs: on a few cores the spinning default makes decoding slower than PyTorch's
    (docs/speed.md)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def _providers(device: str | None) -> list:
    """ONNX Runtime's execution providers for `device`: the CPU's, or CUDA's (on the device's index) before it."""
    device = torch.device(device or "cpu")
    if device.type == "cpu":
        return ["CPUExecutionProvider"]
    if device.type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        return [("CUDAExecutionProvider", {"device_id": device.index or 0}), "CPUExecutionProvider"]
    raise ValueError(
        f"device {device}: this ONNX Runtime runs on {', '.join(ort.get_available_providers())} (onnxruntime-gpu "
        "brings the CUDA provider)"
    )


__all__ = ["VanillaTransformerORTForConditionalGeneration", "default_session_options"]
