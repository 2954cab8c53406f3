"""The package as a user installs it from a checkout: the sdist and the wheel build, the wheel built from the sdist
installs into a new virtual environment, and there the package loads a model, translates with it and runs
`vanilla-transformer --help`.

The dependencies (torch, transformers, ...) are not downloaded: a full install needs the network, which tests do not
have. The wheel is installed with `--no-deps` into a new venv, and the test environment's site-packages is put on that
venv's path by a `.pth` line: a plain path entry, so the test environment's own `.pth` files (its editable install of
this package among them) are not run, and `import vanilla_transformer` finds the installed wheel, nothing else.
`python -m build` builds when it is installed; otherwise setuptools' build hooks build the sdist and `pip wheel`
builds the wheel from it, both without build isolation (which would download setuptools)."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds, a new venv, pip installs

ROOT = Path(__file__).resolve().parents[1]

CHECK_SCRIPT = textwrap.dedent(
    """
    import json, sys, tempfile
    from pathlib import Path

    import torch
    from transformers import AutoModelForSeq2SeqLM

    import vanilla_transformer
    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    folder = Path(tempfile.mkdtemp())
    torch.manual_seed(0)
    VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny")).save_pretrained(folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    ids = model.generate(torch.tensor([[5, 6, 7, 2]]), num_beams=1, max_new_tokens=4)
    package = Path(vanilla_transformer.__file__).parent
    print(json.dumps(dict(
        package=str(package), model=type(model).__name__, generated=list(ids.shape),
        template=(package / "hub" / "model_card_template.md").is_file(),
        saved_code=sorted(path.name for path in folder.glob("*.py")),
    )))
    """
)


def run(*command, cwd=None) -> subprocess.CompletedProcess:
    result = subprocess.run([str(part) for part in command], cwd=cwd, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": "", "PIP_NO_INDEX": "1", "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, f"{command}:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


def tracked_copy(destination: Path) -> Path:
    """The checkout's files (git's tracked and unignored ones, else all but build outputs) copied to `destination`:
    building writes `build/` and `*.egg-info` beside the sources, which stay out of the checkout."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout.strip():
        for name in listed.stdout.splitlines():
            if (ROOT / name).is_file():
                (destination / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, destination / name)
        return destination
    ignored = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "outputs", "runs")
    shutil.copytree(ROOT, destination, ignore=ignored, dirs_exist_ok=True)
    return destination


def build_sdist_and_wheel(source: Path, dist: Path) -> tuple[Path, Path]:
    """The sdist of `source`, and the wheel built from that sdist (so that the sdist is known to be complete)."""
    if importlib.util.find_spec("build") is not None:
        run(sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", dist, source)
    else:
        run(sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(dist)!r})",
            cwd=source)
    (sdist,) = dist.glob("vanilla_transformer-*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(dist / "unpacked", filter="data")
    (unpacked,) = (dist / "unpacked").iterdir()
    if importlib.util.find_spec("build") is not None:
        run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, unpacked)
    else:
        run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", dist, unpacked)
    (wheel,) = dist.glob("vanilla_transformer-*.whl")
    return sdist, wheel


def test_the_wheel_built_from_the_sdist_installs_into_a_new_venv_and_runs(tmp_path):
    source = tracked_copy(tmp_path / "checkout")
    sdist, wheel = build_sdist_and_wheel(source, tmp_path / "dist")
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    assert any(name.endswith("src/vanilla_transformer/hub/model_card_template.md") for name in names)

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    site_packages = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip())
    # The test environment's packages, as a plain path entry after the venv's own site-packages.
    (site_packages / "test-environment.pth").write_text(sysconfig.get_path("purelib") + "\n")
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel)

    report = json.loads(run(python, "-c", CHECK_SCRIPT, cwd=tmp_path).stdout.strip().splitlines()[-1])
    assert Path(report["package"]).is_relative_to(site_packages)  # the wheel's files, not the checkout's
    assert report["model"] == "VanillaTransformerForConditionalGeneration" and report["generated"][0] == 1
    assert report["template"]
    assert "modeling_vanilla_transformer.py" in report["saved_code"]  # the code a saved folder carries

    help_text = run(venv / "bin" / "vanilla-transformer", "--help", cwd=tmp_path).stdout
    for command in ("train", "translate", "evaluate", "average", "export-ct2", "export-onnx", "model-card", "push"):
        assert command in help_text
