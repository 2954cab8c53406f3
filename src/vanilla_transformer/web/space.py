"""A Hugging Face Space that serves a Hub model's translation page (`page.py`): `vanilla-transformer push --space
USER/NAME --model-repo USER/MODEL`, or `--dry-run OUT` for the folder alone.

```python
>>> from vanilla_transformer.web.space import push_space, write_space
>>> write_space("space", "USER/transformer-demo", "USER/transformer-multi30k-en-de")
>>> push_space("USER/transformer-demo", "USER/transformer-multi30k-en-de")
```

The folder holds `app.py` (the page of the model, loaded from the Hub when the Space starts), `requirements.txt`
(this package at its installed version, with the `demo` extra) and `README.md`, whose front matter tells the Hub to
run it with Gradio (`sdk: gradio` at the installed Gradio's version) and names the model (`models:`), so that the
model's page lists the Space; the model card links to the Space with `model-card`/`push --demo-space`.
"""

import importlib.metadata
import os
import tempfile
from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi, SpaceCard, SpaceCardData

from ..extras import installed_version

APP = '''"""The translation page of {model_repo}: vanilla-transformer's demo page (`vanilla-transformer demo`)."""
from vanilla_transformer.web.page import launch, translation_page

page = translation_page("{model_repo}", backend="torch")

if __name__ == "__main__":
    launch(page)
'''
BODY = """
# {title}

Try [{model_repo}](https://huggingface.co/{model_repo}), the Transformer of "Attention Is All You Need" \
(Vaswani et al., 2017), in the browser: type sentences, see their translations, each one's n best hypotheses with \
their scores, and the alignment of its best translation (the encoder-decoder attention, heads averaged) as a heatmap \
with its links.

The page is `vanilla-transformer demo --model {model_repo}` (vanilla-transformer {version}): \
`pip install '{requirement}'` runs it on your own machine.
"""

def space_files(space_id: str, model_repo: str, license: str = "apache-2.0",
                requirement: str | None = None) -> dict[str, str]:
    """The Space's files by name (`app.py`, `requirements.txt`, `README.md`) for the page of the Hub model
    `model_repo`; `requirement` is the line of requirements.txt that installs this package (default: its installed
    version from the package index, with the `demo` extra)."""
    version = importlib.metadata.version("vanilla-transformer")
    requirement = requirement or f"vanilla-transformer[demo]=={version}"
    title = space_id.split("/")[-1]
    data = SpaceCardData(title=title, sdk="gradio", sdk_version=installed_version("gradio", extra="demo"),
                         app_file="app.py", license=license, models=[model_repo], emoji="🔤", colorFrom="blue",
                         colorTo="indigo", short_description=_short(f"Translate with {model_repo}"),
                         tags=["translation", "vanilla-transformer"])
    body = BODY.format(title=title, model_repo=model_repo, version=version, requirement=requirement)
    card = SpaceCard(f"---\n{data.to_yaml()}\n---\n{body}")
    return {"app.py": APP.format(model_repo=model_repo),
            "requirements.txt": f"{requirement}\n",
            "README.md": str(card)}


def write_space(out: str | os.PathLike, space_id: str, model_repo: str, license: str = "apache-2.0",
                requirement: str | None = None) -> list[Path]:
    """Write the Space's files (`space_files`) into the folder `out`; returns their paths, sorted. Needs no
    network."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in space_files(space_id, model_repo, license, requirement).items():
        (out / name).write_text(text, encoding="utf-8")
        written.append(out / name)
    return sorted(written)


def push_space(space_id: str, model_repo: str, *, private: bool = False, license: str = "apache-2.0",
               requirement: str | None = None, token: str | None = None,
               commit_message: str = "Upload vanilla-transformer demo page"):
    """Create the Gradio Space `space_id` (if missing) and upload the folder `write_space` writes, in one commit;
    returns its `CommitInfo`."""
    api = HfApi(token=token)
    space_id = api.create_repo(space_id, repo_type="space", space_sdk="gradio", private=private,
                               exist_ok=True).repo_id
    with tempfile.TemporaryDirectory() as staging:
        files = write_space(staging, space_id, model_repo, license, requirement)
        operations = [CommitOperationAdd(path_in_repo=path.name, path_or_fileobj=str(path)) for path in files]
        return api.create_commit(space_id, operations, commit_message=commit_message, repo_type="space")


def _short(text: str, length: int = 60) -> str:
    """The Hub's short description holds at most 60 characters."""
    return text if len(text) <= length else text[: length - 1] + "…"


__all__ = ["push_space", "space_files", "write_space"]
