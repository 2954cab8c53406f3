"""Configuration of the Transformer of "Attention Is All You Need" (Vaswani et al., 2017)."""

from typing import Literal

import transformers
from huggingface_hub.dataclasses import strict
from packaging.version import Version
from transformers import PreTrainedConfig
from transformers.activations import ACT2FN

# This file and the modeling file also run as remote code (`trust_remote_code=True`) under whatever transformers the
# user has; say which one they need before an older one fails deep inside its own modules.
MINIMUM_TRANSFORMERS = "5.24"
if Version(transformers.__version__).release < Version(MINIMUM_TRANSFORMERS).release:
    raise ImportError(
        f"vanilla-transformer needs transformers>={MINIMUM_TRANSFORMERS} (its `cache` argument and output capturing), "
        f"found {transformers.__version__}: pip install -U 'transformers>={MINIMUM_TRANSFORMERS}'."
    )


# Fields that folders saved by earlier versions hold but that never changed the model's computation.
SPEED_ONLY_FIELDS = ("dropout_implementation",)


# Table 3 of the paper: the "base" and "big" rows (P_drop 0.3 is the En-De big model), plus a tiny size for tests.
PRESETS = {
    "base": dict(d_model=512, layers=6, heads=8, ffn_dim=2048, dropout=0.1),
    "big": dict(d_model=1024, layers=6, heads=16, ffn_dim=4096, dropout=0.3),
    "tiny": dict(d_model=32, layers=2, heads=4, ffn_dim=64, dropout=0.1, vocab_size=128),
}


@strict
class VanillaTransformerConfig(PreTrainedConfig):
    r"""
    Configuration of [`VanillaTransformerModel`] and [`VanillaTransformerForConditionalGeneration`]. The defaults are
    the paper's base model (section 3, Table 3): N = 6, d_model = 512, h = 8, d_ff = 2048, P_drop = 0.1, ReLU, one
    embedding matrix shared by source, target and the pre-softmax projection, scaled by sqrt(d_model), sinusoidal
    positions, post-LayerNorm sub-layers. Field names follow Marian and BART so generic tooling works.

    d_k (`int`, *optional*, defaults to `None`):
        Size of each head's queries and keys (section 3.2.2): W_i^Q and W_i^K are d_model x d_k, and the attention
        logits are scaled by 1/sqrt(d_k). `None` means d_model / h, the paper's choice for every row of Table 3 but
        row (B), which shrinks d_k to 16 and 32.
    d_v (`int`, *optional*, defaults to `None`):
        Size of each head's values (section 3.2.2): W_i^V is d_model x d_v and W^O is h d_v x d_model. `None` means
        d_model / h (64 in Table 3's row (B), as in base).
    position_embedding_type (`str`, *optional*, defaults to `"sinusoidal"`):
        `"sinusoidal"` (section 3.5, any length) or `"learned"` (Table 3 row E, at most `max_position_embeddings`).
    max_position_embeddings (`int`, *optional*, defaults to 1024):
        Length of the learned position table; unused with sinusoidal positions.
    attention_bias (`bool`, *optional*, defaults to `False`):
        Whether the attention projections W^Q, W^K, W^V and W^O have biases. Section 3.2.2 writes them without, as
        tensor2tensor builds them; fairseq and Marian add biases. Folders saved before this field existed had biases
        and load with `True`, exactly as saved.
    normalize_before (`bool`, *optional*, defaults to `False`):
        `False` is the paper's post-norm `LayerNorm(x + Sublayer(x))`. `True` is the pre-norm variant of
        tensor2tensor, `x + Sublayer(LayerNorm(x))`, which adds a final LayerNorm to each stack.
    init_std (`float`, *optional*, defaults to `None`):
        Standard deviation of the embedding initialisation; `None` means `d_model ** -0.5`.
    source_lang, target_lang (`str`, *optional*):
        Language codes of the translation direction (e.g. `"en"`, `"de"`), for `pipeline("translation_en_to_de")`
        and the model card.

    Example:

    ```python
    >>> from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
    >>> config = VanillaTransformerConfig.from_preset("base", vocab_size=37000)
    >>> model = VanillaTransformerForConditionalGeneration(config)
    ```"""

    model_type = "vanilla_transformer"
    keys_to_ignore_at_inference = ["cache"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
    }

    vocab_size: int = 37000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    d_k: int | None = None
    d_v: int | None = None
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    activation_function: str = "relu"
    attention_bias: bool = False
    scale_embedding: bool = True
    position_embedding_type: Literal["sinusoidal", "learned"] = "sinusoidal"
    max_position_embeddings: int = 1024
    normalize_before: bool = False
    init_std: float | None = None
    source_lang: str | None = None
    target_lang: str | None = None
    use_cache: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 1
    is_encoder_decoder: bool = True
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        # Where the package is imported its pipelines are registered with transformers, and a saved folder's
        # `custom_pipelines` (for loading without the package, see `to_dict`) must not send `pipeline()` to remote code.
        custom_pipelines = kwargs.pop("custom_pipelines", None)
        if custom_pipelines and not pipelines_registered():
            kwargs["custom_pipelines"] = custom_pipelines
        super().__post_init__(**kwargs)
        self._check_values()

    def to_dict(self):
        # config.json lists the translation pipelines, so `pipeline("translation", model=DIR, trust_remote_code=True)`
        # works without the package: they live in pipeline_vanilla_transformer.py, saved next to this file.
        output = super().to_dict()
        output["custom_pipelines"] = hub_pipeline_tasks(self.source_lang, self.target_lang)
        return output

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        # config.json files written before `attention_bias` existed describe projections with biases. Earlier versions
        # also saved `dropout_implementation`, a kernel choice that changed speed only: it is not part of the model.
        config_dict = {name: value for name, value in config_dict.items() if name not in SPEED_ONLY_FIELDS}
        return super().from_dict({"attention_bias": True, **config_dict}, **kwargs)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "VanillaTransformerConfig":
        """The config of a named size: `"base"` or `"big"` (Table 3), or `"tiny"` for tests; `overrides` win."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}; choose one of {sorted(PRESETS)}.")
        size = dict(PRESETS[name])
        layers, heads, ffn_dim = size.pop("layers"), size.pop("heads"), size.pop("ffn_dim")
        fields = dict(
            encoder_layers=layers,
            decoder_layers=layers,
            encoder_attention_heads=heads,
            decoder_attention_heads=heads,
            encoder_ffn_dim=ffn_dim,
            decoder_ffn_dim=ffn_dim,
            **size,
        )
        return cls(**{**fields, **overrides})

    def head_sizes(self, heads: int) -> tuple[int, int]:
        """(d_k, d_v) of the attention layers with `heads` heads: the fields, or d_model / h where left None."""
        default = self.d_model // heads
        return (default if self.d_k is None else self.d_k), (default if self.d_v is None else self.d_v)

    def _check_values(self):
        # Raised from __post_init__ as plain ValueErrors naming the field (strict's validate_* hooks would wrap them).
        sizes = ["vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
                 "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings"]
        for name in sizes:
            if getattr(self, name) <= 0:
                raise ValueError(f"`{name}` must be a positive integer, got {getattr(self, name)}.")
        for name in ["d_k", "d_v"]:
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"`{name}` must be a positive integer or None, got {getattr(self, name)}.")
        left_to_default = [name for name in ["d_k", "d_v"] if getattr(self, name) is None]
        for name in ["encoder_attention_heads", "decoder_attention_heads"] if left_to_default else []:
            if self.d_model % getattr(self, name) != 0:
                raise ValueError(
                    f"`d_model` ({self.d_model}) must be divisible by `{name}` ({getattr(self, name)}): "
                    f"{' and '.join(left_to_default)} left to None means d_model / h per head (section 3.2.2); "
                    "set them to choose another size."
                )
        if self.activation_function not in ACT2FN:
            raise ValueError(
                f"`activation_function` must be one of transformers' activations ({', '.join(sorted(ACT2FN))}), "
                f"got {self.activation_function!r}."
            )
        for name in ["dropout", "attention_dropout", "activation_dropout"]:
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be in [0, 1), got {getattr(self, name)}.")
        if self.init_std is not None and self.init_std <= 0:
            raise ValueError(f"`init_std` must be positive or None, got {self.init_std}.")
        for name in ["pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"]:
            ids = getattr(self, name)
            for token_id in ids if isinstance(ids, list) else [ids]:
                if token_id is not None and not 0 <= token_id < self.vocab_size:
                    raise ValueError(
                        f"`{name}` ({token_id}) must be a token id in the vocabulary [0, {self.vocab_size})."
                    )


def hub_pipeline_tasks(source_lang: str | None, target_lang: str | None) -> dict:
    from .pipeline_vanilla_transformer import PIPELINE_TASKS, language_pair_task

    tasks = dict(PIPELINE_TASKS)
    if pair_task := language_pair_task(source_lang, target_lang):
        tasks[pair_task] = PIPELINE_TASKS["translation"]
    return {
        task: {"impl": f"pipeline_vanilla_transformer.{pipeline_class.__name__}", "pt": ["AutoModelForSeq2SeqLM"]}
        for task, pipeline_class in tasks.items()
    }


def pipelines_registered() -> bool:
    """Whether `vanilla_transformer` registered its pipelines with transformers in this process."""
    from .pipeline_vanilla_transformer import registered

    return registered()


__all__ = ["VanillaTransformerConfig"]
