"""pipeline("translation" | "translation_xx_to_yy" | "text2text-generation") from a saved folder, as in transformers 4."""

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoTokenizer, pipeline
from transformers.pipelines.pt_utils import KeyDataset

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.training.tokenization import train_tokenizer

SENTENCES = [
    "A man in an orange hat starring at something.",
    "Two dogs play in the snow.",
    "A girl is reading a book under a tree while her brother plays football nearby.",
    "People walk.",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("translation-model")
    tokenizer = train_tokenizer(SENTENCES * 3, vocab_size=300, show_progress=False)
    config = VanillaTransformerConfig.from_preset(
        "tiny",
        dropout=0.0,
        vocab_size=len(tokenizer),
        source_lang="en",
        target_lang="de",
    )
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def reference_translations(model_dir, sentences, **generate_kwargs):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir).eval()
    outputs = []
    for sentence in sentences:
        ids = model.generate(**tokenizer(sentence, return_tensors="pt"), **generate_kwargs)
        outputs.append(tokenizer.decode(ids[0], skip_special_tokens=True))
    return outputs


@pytest.mark.parametrize("task", ["translation", "translation_en_to_de"])
def test_translation_pipeline_from_a_folder(model_dir, task):
    translator = pipeline(task, model=str(model_dir))
    expected = reference_translations(model_dir, SENTENCES)
    assert translator(SENTENCES[0]) == [{"translation_text": expected[0]}]
    assert translator(SENTENCES) == [{"translation_text": text} for text in expected]
    assert translator(SENTENCES, batch_size=3) == [{"translation_text": text} for text in expected]


def test_pipeline_uses_the_saved_paper_decoding_and_takes_generation_arguments(model_dir):
    translator = pipeline("translation", model=str(model_dir))
    greedy = reference_translations(model_dir, SENTENCES[:2], num_beams=1, max_new_tokens=5)
    assert translator(SENTENCES[:2], num_beams=1, max_new_tokens=5) == [{"translation_text": t} for t in greedy]
    several = translator(SENTENCES[0], num_return_sequences=3)
    assert len(several) == 3 and all("translation_text" in output for output in several)


def test_text2text_generation_pipeline_and_key_dataset(model_dir):
    datasets = pytest.importorskip("datasets")
    generator = pipeline("text2text-generation", model=str(model_dir))
    expected = reference_translations(model_dir, SENTENCES)
    rows = datasets.Dataset.from_dict({"en": SENTENCES})
    outputs = list(generator(KeyDataset(rows, "en"), batch_size=2))
    assert outputs == [[{"generated_text": text}] for text in expected]


def test_saved_config_lists_the_pipelines_for_loading_without_the_package(model_dir):
    custom_pipelines = json.loads((model_dir / "config.json").read_text())["custom_pipelines"]
    assert set(custom_pipelines) == {"translation", "translation_en_to_de", "text2text-generation"}
    assert custom_pipelines["translation"]["impl"] == "pipeline_vanilla_transformer.TranslationPipeline"
    assert (model_dir / "pipeline_vanilla_transformer.py").exists()
    # In this process the package is imported: the config does not send pipeline() to remote code.
    assert not getattr(VanillaTransformerConfig.from_pretrained(model_dir), "custom_pipelines", None)


@pytest.fixture(scope="module")
def model_dir_without_pair(model_dir, tmp_path_factory):
    """The same model, its config naming no language pair."""
    folder = tmp_path_factory.mktemp("no-pair")
    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir)
    model.config.source_lang = model.config.target_lang = None
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_the_language_pair_task_of_a_models_config_is_registered_when_pipeline_reads_it(model_dir):
    """transformers' public registration: `pipeline()` reads the config before it looks the task up, and reading a
    config that names its pair registers `translation_<source>_to_<target>` (a fresh process: nothing registered
    it before)."""
    script = f"""
import vanilla_transformer
from transformers import pipeline
from transformers.pipelines import PIPELINE_REGISTRY
assert "translation_en_to_de" not in PIPELINE_REGISTRY.get_supported_tasks()
translator = pipeline("translation_en_to_de", model={str(model_dir)!r})
print(type(translator).__name__)
print(translator({SENTENCES[0]!r})[0]["translation_text"])
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert run.stdout.splitlines()[-2:] == ["TranslationPipeline", reference_translations(model_dir, SENTENCES[:1])[0]]


def test_a_pair_no_loaded_config_names_is_an_unknown_task(model_dir_without_pair):
    with pytest.raises(KeyError, match="Unknown task translation_xx_to_yy"):
        pipeline("translation_xx_to_yy", model=str(model_dir_without_pair))


def test_a_task_naming_another_pair_names_the_pair_the_model_translates(model_dir, tmp_path):
    """An en -> de model asked for `translation_en_to_fr`: one line naming its pair, whether or not another model's
    config registered the task asked for."""
    # A KeyError while the task is unknown to transformers; a ValueError once another model registered it, which an
    # earlier test of the session may have done (the registry is global).
    with pytest.raises((KeyError, ValueError)) as unknown:
        pipeline("translation_en_to_fr", model=str(model_dir))
    expected = ('Task translation_en_to_fr asks for en -> fr, but the model translates en -> de: use '
                'pipeline("translation") or pipeline("translation_en_to_de")')
    assert unknown.value.args == (expected,)
    french = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir)
    french.config.target_lang = "fr"
    french.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(tmp_path)
    assert pipeline("translation_en_to_fr", model=str(tmp_path))  # registers translation_en_to_fr
    with pytest.raises(ValueError) as registered:
        pipeline("translation_en_to_fr", model=str(model_dir))
    assert registered.value.args == (expected,)
