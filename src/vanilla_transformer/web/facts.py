"""The facts the translation page shows about its model, read from the model card (`README.md`, as `model-card` and
`push` write it) of the folder or Hub repository: the languages, the scores with their data and split (the card's
`model-index`), and the card's paragraph on the training data."""

import json
import os
from pathlib import Path

from huggingface_hub import ModelCard, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError

# The beam size of section 6.1, for a model whose generation config does not say.
PAPER_BEAMS = 4
# The default of `card` below: not read yet (None is a model read and found without a card).
NOT_READ = object()


def model_facts(model: str | os.PathLike, card: ModelCard | None = NOT_READ) -> list[str]:
    """Markdown lines about `model` (a folder or a Hub id): its languages, each BLEU of its card with data and split,
    and where its training data came from; a line saying so when it has no card. `card`: its card, already read
    (`model_card`)."""
    card = model_card(model) if card is NOT_READ else card
    languages = _languages(model, card)
    facts = [f"Translates {languages}."] if languages else []
    if card is None:
        return facts + ["No model card (README.md) with this model: its scores and data are not known here."]
    for result in card.data.eval_results or []:
        if result.metric_type == "bleu":
            split = f", {result.dataset_split}" if result.dataset_split else ""
            facts.append(f"{result.metric_name or 'BLEU'} {result.metric_value:.2f} on {result.dataset_name}{split}.")
    if data := _section_paragraph(card.text, "## Training"):
        facts.append(data)
    return facts


def model_name(model: str | os.PathLike, card: ModelCard | None = NOT_READ) -> str:
    """The model's name: its card's (`model-index`; `card`, already read), else the Hub id or the folder's name."""
    card = model_card(model) if card is NOT_READ else card
    if card is not None and card.data.model_name:
        return card.data.model_name
    return Path(model).resolve().name if Path(model).is_dir() else str(model)


def default_beams(model: str | os.PathLike) -> int:
    """The beam size of the model's generation config (`generation_config.json`, in every folder that the commands
    write), else the paper's 4 (section 6.1)."""
    try:
        if Path(model).is_dir():
            path = Path(model) / "generation_config.json"
        else:
            path = Path(hf_hub_download(str(model), "generation_config.json"))
        beams = json.loads(path.read_text(encoding="utf-8")).get("num_beams")
    except (OSError, ValueError, AttributeError, HfHubHTTPError):
        return PAPER_BEAMS
    return beams if isinstance(beams, int) and beams >= 1 else PAPER_BEAMS


def model_card(model: str | os.PathLike) -> ModelCard | None:
    """The model card of a folder (its README.md) or of a Hub repository; None where there is none."""
    folder = Path(model)
    try:
        if folder.is_dir():
            return ModelCard.load(folder / "README.md") if (folder / "README.md").is_file() else None
        return ModelCard.load(str(model))
    except (OSError, ValueError, HfHubHTTPError):
        return None


def _languages(model: str | os.PathLike, card: ModelCard | None) -> str | None:
    """"en -> fr" from the model's configuration (`source_lang`, `target_lang`), else the card's languages."""
    config = Path(model) / "config.json"
    try:
        values = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    except (OSError, ValueError):
        values = {}
    if isinstance(values, dict) and values.get("source_lang") and values.get("target_lang"):
        return f"{values['source_lang']} -> {values['target_lang']}"
    languages = card.data.language if card is not None else None
    if isinstance(languages, str):
        return languages
    return ", ".join(languages) if languages else None


def _section_paragraph(text: str, heading: str) -> str | None:
    """The first paragraph under `heading` in a card's Markdown text, if any."""
    _, found, after = text.partition(f"\n{heading}\n")
    paragraphs = [part.strip() for part in after.split("\n\n") if part.strip()] if found else []
    return paragraphs[0] if paragraphs and not paragraphs[0].startswith("#") else None


__all__ = ["PAPER_BEAMS", "default_beams", "model_card", "model_facts", "model_name"]
