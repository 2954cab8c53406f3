"""`pipeline("translation")` and `pipeline("text2text-generation")` for sequence-to-sequence models.

transformers 5 removed these two tasks (and `translation_xx_to_yy`). This file brings them back for translation
models: importing `vanilla_transformer` registers them, `translation_xx_to_yy` for every pair as in transformers 4,
and a saved model folder lists them (with its own pair) in its config's `custom_pipelines`, so
`pipeline("translation", model=DIR, trust_remote_code=True)` also works where the package is not installed. It imports
only transformers, as remote code must.
"""

import re

from transformers import Pipeline
from transformers.utils import logging


logger = logging.get_logger(__name__)


class Text2TextGenerationPipeline(Pipeline):
    """Text in, generated text out: `[{"generated_text": ...}]` per input, decoded with the model's generation
    config (for vanilla-transformer, section 6.1's beam search) unless the call passes generation arguments."""

    _pipeline_calls_generate = True
    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    return_name = "generated"

    def _sanitize_parameters(self, return_tensors=None, clean_up_tokenization_spaces=None, truncation=None, **kwargs):
        # Translation pipelines of transformers 4 took the language pair as arguments; the model here knows it.
        kwargs.pop("src_lang", None)
        kwargs.pop("tgt_lang", None)
        preprocess_params = {} if truncation is None else {"truncation": truncation}
        postprocess_params = {}
        if return_tensors is not None:
            postprocess_params["return_tensors"] = return_tensors
        if clean_up_tokenization_spaces is not None:
            postprocess_params["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        return preprocess_params, kwargs, postprocess_params

    def __call__(self, inputs, **kwargs):
        """`inputs`: a string, a list of strings, or a dataset/generator of strings (e.g. `KeyDataset`)."""
        results = super().__call__(inputs, **kwargs)
        # One output per input unless num_return_sequences asks for more, as transformers 4's pipelines did.
        if isinstance(inputs, list) and all(len(result) == 1 for result in results):
            return [result[0] for result in results]
        return results

    def preprocess(self, text, truncation=False):
        if not isinstance(text, str):
            raise TypeError(f"{self.return_name} pipeline: expected a string, got {type(text).__name__}")
        return self.tokenizer(text, truncation=truncation, return_tensors="pt")

    def _forward(self, model_inputs, **generate_kwargs):
        prepare = getattr(self, "_prepare_generate_kwargs", None)
        if prepare is not None:  # transformers >= 5.x: the pipeline's and the user's generation settings, merged
            generate_kwargs = prepare(generate_kwargs)
        sequences = self.model.generate(**model_inputs, **generate_kwargs)
        batch_size = model_inputs["input_ids"].shape[0]
        return {"output_ids": sequences.reshape(batch_size, sequences.shape[0] // batch_size, -1)}

    def postprocess(self, model_outputs, return_tensors=False, clean_up_tokenization_spaces=False):
        key = f"{self.return_name}_token_ids" if return_tensors else f"{self.return_name}_text"
        return [
            {
                key: output_ids
                if return_tensors
                else self.tokenizer.decode(
                    output_ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                )
            }
            for output_ids in model_outputs["output_ids"][0]
        ]


class TranslationPipeline(Text2TextGenerationPipeline):
    """`pipeline("translation", model=DIR)` and `pipeline("translation_en_to_de", model=DIR)`: text in,
    `[{"translation_text": ...}]` out. The model translates in the direction it was trained for; a task naming another
    pair than its config's `source_lang` / `target_lang` gets a warning."""

    return_name = "translation"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        asked = language_pair(self.task)
        trained = (getattr(self.model.config, "source_lang", None), getattr(self.model.config, "target_lang", None))
        if asked and all(trained) and asked != trained:
            logger.warning(
                f"Task {self.task} asks for {asked[0]} -> {asked[1]}, but the model translates {trained[0]} -> "
                f"{trained[1]}: it will translate as it was trained."
            )


# The tasks, as `PIPELINE_REGISTRY` and config.json's `custom_pipelines` name them.
PIPELINE_TASKS = {"translation": TranslationPipeline, "text2text-generation": Text2TextGenerationPipeline}


def language_pair_task(source_lang: str | None, target_lang: str | None) -> str | None:
    """`translation_en_to_de` for a model that translates English to German (transformers 4's task names)."""
    return f"translation_{source_lang}_to_{target_lang}" if source_lang and target_lang else None


def language_pair(task: str | None) -> tuple[str, str] | None:
    """("en", "de") for the task `translation_en_to_de`; None for any other task."""
    match = re.fullmatch(r"translation_(.+?)_to_(.+)", task or "")
    return match.groups() if match else None


class LanguagePairAliases(dict):
    """transformers' task aliases, and every `translation_xx_to_yy` an alias of `translation`, so that
    `PIPELINE_REGISTRY.check_task` takes any language pair, as transformers 4's did (its 5.x registry knows fixed
    names only). `pipeline()` still hands the pipeline the task as asked."""

    def __contains__(self, task):
        return super().__contains__(task) or language_pair(task) is not None

    def __getitem__(self, task):
        if not super().__contains__(task) and language_pair(task) is not None:
            return "translation"
        return super().__getitem__(task)


def register_pipelines():
    """Make `pipeline("translation" | "translation_xx_to_yy" | "text2text-generation")` available again in this
    process (done by `import vanilla_transformer`)."""
    from transformers import AutoModelForSeq2SeqLM
    from transformers.pipelines import PIPELINE_REGISTRY, REMOVED_TASKS

    for task, pipeline_class in PIPELINE_TASKS.items():
        REMOVED_TASKS.pop(task, None)
        PIPELINE_REGISTRY.supported_tasks[task] = {"impl": pipeline_class, "pt": (AutoModelForSeq2SeqLM,), "type": "text"}
    if not isinstance(PIPELINE_REGISTRY.task_aliases, LanguagePairAliases):
        PIPELINE_REGISTRY.task_aliases = LanguagePairAliases(PIPELINE_REGISTRY.task_aliases)


def registered() -> bool:
    import sys

    pipelines = sys.modules.get("transformers.pipelines")
    registry = getattr(pipelines, "PIPELINE_REGISTRY", None)
    return registry is not None and registry.supported_tasks.get("translation", {}).get("impl") is TranslationPipeline


def register_language_pair(source_lang: str | None, target_lang: str | None):
    from transformers import AutoModelForSeq2SeqLM
    from transformers.pipelines import PIPELINE_REGISTRY

    if task := language_pair_task(source_lang, target_lang):
        PIPELINE_REGISTRY.supported_tasks[task] = {"impl": TranslationPipeline, "pt": (AutoModelForSeq2SeqLM,), "type": "text"}
