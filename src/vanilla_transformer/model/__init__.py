"""The model: the five files saved next to every model folder (configuration, modeling, generation, decoding,
pipeline).

`register()` makes the Auto classes know the model, and `register_for_auto_class` makes `save_pretrained` write
`auto_map` and copy the code files, so a saved folder also loads with `trust_remote_code=True`. transformers 5 dropped
the translation pipelines; `register_pipelines` brings back "translation", "translation_xx_to_yy" and
"text2text-generation" for every sequence-to-sequence model. `import vanilla_transformer` calls it (and so does the
command line, before it loads or saves a model); importing this folder alone imports nothing, so that
`decoding_vanilla_transformer.py`, which needs no torch, can be read without it.
"""

_registered = False


def register() -> None:
    """Register the model's classes and pipelines with transformers, once per process."""
    global _registered
    if _registered:
        return
    from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

    from .configuration_vanilla_transformer import VanillaTransformerConfig
    from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration, VanillaTransformerModel
    from .pipeline_vanilla_transformer import register_pipelines

    AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig, exist_ok=True)
    AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel, exist_ok=True)
    AutoModelForSeq2SeqLM.register(VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, exist_ok=True)
    VanillaTransformerConfig.register_for_auto_class()
    VanillaTransformerModel.register_for_auto_class("AutoModel")
    VanillaTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
    register_pipelines()
    _registered = True
