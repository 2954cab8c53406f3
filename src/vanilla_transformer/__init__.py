"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face model.

`import vanilla_transformer` makes the Auto classes and `pipeline("translation")` know the model (`model.register`).
When the `vanilla-transformer` command started the process (`vanilla_transformer_cli`), this stays lazy instead, so
that `--help` imports neither torch nor transformers: the public names are imported when first used, and the command
registers the model before it loads or saves one.
"""

import importlib
import sys

__version__ = "0.1.0"

# Each public name and the module that defines it.
PUBLIC_NAMES = {
    "VanillaTransformerConfig": ".model.configuration_vanilla_transformer",
    "VanillaTransformerForConditionalGeneration": ".model.modeling_vanilla_transformer",
    "VanillaTransformerModel": ".model.modeling_vanilla_transformer",
    "VanillaTransformerPreTrainedModel": ".model.modeling_vanilla_transformer",
    "TranslationPipeline": ".model.pipeline_vanilla_transformer",
}


def __getattr__(name: str):
    if name not in PUBLIC_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(PUBLIC_NAMES[name], __name__), name)
    globals()[name] = value
    return value


if "vanilla_transformer_cli" not in sys.modules:
    from .model.configuration_vanilla_transformer import VanillaTransformerConfig
    from .model.modeling_vanilla_transformer import (
        VanillaTransformerForConditionalGeneration,
        VanillaTransformerModel,
        VanillaTransformerPreTrainedModel,
    )
    from .model.pipeline_vanilla_transformer import TranslationPipeline
    from .model import register

    register()

__all__ = [
    "VanillaTransformerConfig",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "TranslationPipeline",
]
