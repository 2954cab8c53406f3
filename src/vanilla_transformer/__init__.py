"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face model."""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .model.configuration_vanilla_transformer import VanillaTransformerConfig
from .model.pipeline_vanilla_transformer import TranslationPipeline, register_pipelines
from .model.modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
    VanillaTransformerPreTrainedModel,
)

__version__ = "0.1.0"

# Importing the package makes the Auto classes know the model; `register_for_auto_class` makes `save_pretrained`
# write `auto_map` and copy these two code files, so a saved folder also loads with `trust_remote_code=True`.
AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig, exist_ok=True)
AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, exist_ok=True)
VanillaTransformerConfig.register_for_auto_class()
VanillaTransformerModel.register_for_auto_class("AutoModel")
VanillaTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
# transformers 5 dropped the translation pipelines; this brings back "translation", "translation_xx_to_yy" (for
# models whose config names the pair) and "text2text-generation" for every sequence-to-sequence model.
register_pipelines()

__all__ = [
    "VanillaTransformerConfig",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "TranslationPipeline",
]
