"""The translation page (`vanilla_transformer.web`, `vanilla-transformer demo`) and its Hub Space (`push --space`):
what it shows computed by the backends' own translate functions (equal to `translate`'s), its bounds and messages,
the model card's facts, the Space's folder, the command's one-line refusals, a load test of 20 concurrent requests and
the page driven in a real browser (Debian's chromium through Selenium, test_web_browser.py)."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("gradio", reason="the demo extra (gradio) is not installed")

from huggingface_hub import ModelCard, SpaceCard  # noqa: E402
from test_ctranslate2 import SENTENCES, saved_model, tokenizer  # noqa: E402,F401 (a fixture)
from test_hub import CARD_RESULTS  # noqa: E402

from vanilla_transformer.backends.ctranslate2.export import export_ctranslate2  # noqa: E402
from vanilla_transformer.backends.table import BACKENDS  # noqa: E402
from vanilla_transformer.hub.card import write_model_card  # noqa: E402
from vanilla_transformer.inference.hypotheses import TooManyHypothesesError  # noqa: E402
from vanilla_transformer.web.facts import default_beams, model_facts, model_name  # noqa: E402
from vanilla_transformer.web.results import (MAX_CHARACTERS, MAX_LINES, Decoding, PageInputError,  # noqa: E402
                                             heatmap_html, sentences_of, translate_sentences)
from vanilla_transformer.web.space import space_files, write_space  # noqa: E402

SCRIPT = str(Path(sys.executable).with_name("vanilla-transformer"))
TEXT = "\n".join([SENTENCES[0], "", SENTENCES[1], SENTENCES[3]])


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer):  # noqa: F811
    """A random model whose outputs vary and end (test_ctranslate2's lively model) with a model card, and its
    CTranslate2 export."""
    root = tmp_path_factory.mktemp("web")
    model_dir = saved_model(root / "model", tokenizer, lively=True, position_embedding_type="learned",
                           max_position_embeddings=128)
    write_model_card(model_dir, model_dir / "README.md", CARD_RESULTS)
    return model_dir, export_ctranslate2(model_dir, root / "ct2")


@pytest.fixture(scope="module")
def translators(folders):
    model_dir, ct2_dir = folders
    return {"torch": BACKENDS["torch"](model_dir, "cpu"), "ct2": BACKENDS["ct2"](ct2_dir, "cpu")}


def test_the_input_is_bounded_and_an_empty_one_refused():
    assert sentences_of("a b\n\nc\n \n\n") == ["a b", "", "c"]  # an empty line inside kept, the trailing ones not
    for empty in ("", None, " \n\t\n"):
        with pytest.raises(PageInputError, match="Type or paste a sentence"):
            sentences_of(empty)
    assert len(sentences_of("a\n" * MAX_LINES)) == MAX_LINES
    with pytest.raises(PageInputError, match=f"{MAX_LINES + 1} lines: the page translates at most {MAX_LINES}"):
        sentences_of("a\n" * (MAX_LINES + 1))
    with pytest.raises(PageInputError, match=f"{MAX_CHARACTERS + 1:,} characters"):
        sentences_of("a" * (MAX_CHARACTERS + 1))


def test_the_decoding_controls_are_translates_options():
    assert Decoding(num_beams=5, nbest=3).options() == dict(nbest=3, num_beams=5)
    # Sampling draws one translation a line, as translate --sampling does: beams and n-best are not used.
    assert Decoding(num_beams=5, nbest=3, sampling=True, top_k=10, top_p=0.9, temperature=0.7, seed=3).options() == \
        dict(nbest=1, do_sample=True, num_beams=1, top_k=10, top_p=0.9, temperature=0.7, seed=3)


@pytest.mark.parametrize("backend", ["torch", "ct2"])
def test_the_page_shows_what_translate_gives(translators, backend):
    """Translations, n-best lists, scores and links are those of the backend's translate function, called as
    `translate` calls it (no nbest: the text; --nbest 3 --alignment hard: the hypotheses and links)."""
    translate = translators[backend]
    lines = TEXT.split("\n")
    found = translate_sentences(translate, TEXT, Decoding(num_beams=4, nbest=3), alignment=True)
    assert [result.translation for result in found] == translate(lines, num_beams=4)
    hard = translate(lines, num_beams=4, nbest=3, alignment="hard")
    for result, hypotheses in zip(found, hard):
        assert [row[1] for row in result.nbest_rows()] == [hypothesis.text for hypothesis in hypotheses]
        assert [row[2] for row in result.nbest_rows()] == [
            None if hypothesis.score is None else round(hypothesis.score, 4) for hypothesis in hypotheses]
        assert result.links() == " ".join(f"{s}-{t}" for s, t in hypotheses[0].alignment or [])
    assert len(found[0].nbest_rows()) == 3 and found[1].nbest_rows() == [[1, "", None, None]]
    assert found[1].alignment() is None and found[1].links() == ""


def test_sampling_on_the_page_draws_what_translate_sampling_draws(translators):
    options = dict(do_sample=True, num_beams=1, top_k=10, top_p=1.0, temperature=1.0, seed=5)
    found = translate_sentences(translators["torch"], TEXT, Decoding(sampling=True, top_k=10, seed=5), alignment=False)
    assert [result.translation for result in found] == translators["torch"](TEXT.split("\n"), **options)


def test_more_hypotheses_than_beams_is_the_translators_error(translators):
    with pytest.raises(TooManyHypothesesError):
        translate_sentences(translators["torch"], "a", Decoding(num_beams=2, nbest=3), alignment=False)


def test_the_heatmap_is_the_soft_alignment_with_its_strongest_links_marked(translators):
    result = translate_sentences(translators["torch"], SENTENCES[1], Decoding(num_beams=4, nbest=1), True)[0]
    source_words, target_words, matrix = result.alignment()
    assert source_words == SENTENCES[1].split() and target_words == result.translation.split()
    table = heatmap_html(source_words, target_words, matrix)
    assert table.count("<td") == len(source_words) * len(target_words)
    assert table.count('class="link"') == len(target_words)  # one strongest source word per target word
    # The cell of source word s and target word t holds matrix[t][s].
    assert f'title="{source_words[-1]} / {target_words[0]}: {matrix[0][-1]:.3f}"' in table
    assert "&lt;b&gt;" in heatmap_html(["<b>"], ["x"], [[1.0]])  # words are text, not markup


def test_the_page_states_the_model_cards_facts(folders, tmp_path):
    model_dir, ct2_dir = folders
    facts = model_facts(model_dir)
    assert "sacreBLEU 33.99 on Multi30k, test_2016_flickr." in facts
    assert "Data: the 29,000 Multi30k training pairs." in facts
    assert model_name(model_dir) == "model" and model_name(ct2_dir) == "ct2"  # the card's name, else the folder's
    assert model_facts(ct2_dir) == ["No model card (README.md) with this model: its scores and data are not known "
                                    "here."]
    (tmp_path / "config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de"}))
    assert model_facts(tmp_path)[0] == "Translates en -> de."


def test_the_beams_default_to_the_generation_configs(folders, tmp_path):
    model_dir, ct2_dir = folders
    expected = json.loads((model_dir / "generation_config.json").read_text()).get("num_beams", 4)
    assert default_beams(model_dir) == default_beams(ct2_dir) == expected
    (tmp_path / "generation_config.json").write_text(json.dumps({"num_beams": 6}))
    assert default_beams(tmp_path) == 6
    assert default_beams(tmp_path / "missing") == 4


def test_the_space_folder_runs_the_page_of_its_model(folders, tmp_path, monkeypatch):
    """The Space's README tells the Hub to run app.py with this Gradio and names the model; app.py builds the page of
    its model (here a local folder), without launching it when imported."""
    import gradio
    import runpy
    from importlib.metadata import version

    files = write_space(tmp_path / "space", "me/demo", "me/model")
    assert [path.name for path in files] == ["README.md", "app.py", "requirements.txt"]
    card = SpaceCard.load(tmp_path / "space" / "README.md")
    assert (card.data.sdk, card.data.sdk_version, card.data.app_file) == ("gradio", gradio.__version__, "app.py")
    assert card.data.models == ["me/model"] and len(card.data.short_description) <= 60
    assert (tmp_path / "space" / "requirements.txt").read_text() == \
        f"vanilla-transformer[demo]=={version('vanilla-transformer')}\n"
    app = tmp_path / "app.py"
    app.write_text(space_files("me/demo", str(folders[0]))["app.py"])
    page = runpy.run_path(str(app))["page"]  # run as a module: not served
    assert isinstance(page, gradio.Blocks) and "/translate" in str(page.get_api_info()["named_endpoints"])


def run(*argv, **kwargs) -> subprocess.CompletedProcess:
    """The installed command, as a user runs it."""
    return subprocess.run([SCRIPT, *argv], capture_output=True, text=True, timeout=300, **kwargs)


@pytest.mark.slow
def test_push_space_dry_run_writes_the_space_and_the_card_links_to_it(folders, tmp_path):
    result = run("push", "--space", "me/demo", "--model-repo", "me/model", "--dry-run", str(tmp_path / "space"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1:] == ["  README.md", "  app.py", "  requirements.txt"]
    spec = "vanilla-transformer[demo] @ git+https://example.org/vanilla-transformer@v0.1.0"  # not on PyPI: a URL
    result = run("push", "--space", "me/demo", "--model-repo", "me/model", "--space-requirement", spec,
                 "--dry-run", str(tmp_path / "space-from-git"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "space-from-git" / "requirements.txt").read_text() == spec + "\n"
    for argv, message in ((["--space-requirement", "numpy"], "installs numpy, not vanilla-transformer"),
                          (["--space-requirement", "git+https://x/y"], "is not a pip requirement"),
                          (["--model", str(folders[0])], "not --model: push the model first"),
                          ([], "--space USER/NAME and --model-repo USER/MODEL go together")):
        model_repo = [] if not argv else ["--model-repo", "me/model"]
        result = run("push", "--space", "me/demo", *model_repo, *argv, "--dry-run", str(tmp_path / "refused"))
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and message in result.stderr, argv
    assert not (tmp_path / "refused").exists()
    result = run("model-card", "--model", str(folders[0]), "--results", str(_results_file(tmp_path)),
                 "--demo-space", "me/demo", "--out", str(tmp_path / "card" / "README.md"))
    assert result.returncode == 0, result.stderr
    assert "[me/demo](https://huggingface.co/spaces/me/demo)" in (tmp_path / "card" / "README.md").read_text()
    assert "huggingface.co/spaces" not in ModelCard.load(folders[0] / "README.md").text  # no Space: no link


def _results_file(folder: Path) -> Path:
    path = folder / "results.json"
    path.write_text(json.dumps(CARD_RESULTS))
    return path


@pytest.mark.slow
def test_demo_refuses_what_it_cannot_serve_in_one_line(folders, tmp_path):
    model_dir, ct2_dir = folders
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        cases = [
            (["--model", str(model_dir), "--port", port], f"port {port} on 127.0.0.1 is in use: choose another"),
            (["--model", str(tmp_path)], f"{tmp_path} has no config.json: it is not a saved model folder"),
            (["--model", str(model_dir), "--backend", "ct2"],
             f"{model_dir} is a transformers model folder; the ct2 backend needs it exported first"),
            (["--model", str(ct2_dir)], f"{ct2_dir} is a CTranslate2 folder (from export-ct2): run it with "
                                        "--backend ct2"),
            (["--model", str(model_dir), "--port", "70000"], "expected a port number (1-65535), got 70000"),
            (["--model", str(model_dir), "--host", "no-such-host.invalid"], "--host no-such-host.invalid: not an"),
        ]
        for argv, message in cases:
            result = run("demo", *argv)
            assert result.returncode == 2, (argv, result.stderr)
            assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, (argv, result.stderr)
            assert result.stderr.startswith("vanilla-transformer demo: error: "), result.stderr


@pytest.fixture(scope="module")
def served(folders):
    """The page of the torch model served on a free loopback port, in this process."""
    from vanilla_transformer.web.page import launch, translation_page

    page = translation_page(folders[0], backend="torch", device="cpu")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    launch(page, host="127.0.0.1", port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    page.close()


@pytest.mark.slow
def test_twenty_concurrent_requests_are_all_answered_right(served, translators, record_property):
    """20 requests at once on loopback, each of other sentences: all answered, none in error, each with the
    translations `translate` gives; the time to answer them all is reported."""
    from gradio_client import Client

    inputs = [f"{SENTENCES[k % len(SENTENCES)]}\n{SENTENCES[(k + 3) % len(SENTENCES)]}" for k in range(20)]
    client = Client(served, verbose=False)
    start = time.perf_counter()
    jobs = [client.submit(text, 4, 2, False, 0, 1.0, 1.0, 0, api_name="/translate") for text in inputs]
    answers = [job.result(timeout=240) for job in jobs]
    seconds = time.perf_counter() - start
    expected = {text: "\n".join(translators["torch"](text.split("\n"), num_beams=4)) for text in set(inputs)}
    assert [answer[0] for answer in answers] == [expected[text] for text in inputs]
    assert all('class="alignment-heatmap"' in answer[3] for answer in answers)
    record_property("seconds_for_20_requests", round(seconds, 2))
    print(f"20 concurrent requests answered in {seconds:.2f} s ({seconds / 20:.3f} s a request, one at a time)")


@pytest.mark.slow
def test_bad_input_is_a_message_on_the_page_not_a_traceback(served):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    client = Client(served, verbose=False)
    for text, message in (("   ", "Type or paste a sentence to translate."),
                          ("a\n" * (MAX_LINES + 1), f"{MAX_LINES + 1} lines"),
                          ("a", "n-best 5 is more than the 2 beams")):
        nbest = 5 if "n-best" in message else 1
        with pytest.raises(AppError) as error:
            client.predict(text, 2, nbest, False, 0, 1.0, 1.0, 0, api_name="/translate")
        assert message in str(error.value) and "Traceback" not in str(error.value)


@pytest.mark.slow
def test_the_page_load_benchmark_checks_every_answer(folders, tmp_path):
    sources = tmp_path / "sources.txt"
    sources.write_text("\n".join(SENTENCES) + "\n")
    script = Path(__file__).parents[1] / "benchmarks" / "page_load.py"
    result = subprocess.run([sys.executable, str(script), "--model", str(folders[0]), "--src", str(sources),
                             "--requests", "3", "--lines", "2"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "3/3 answered with translate's translations" in result.stdout


def test_the_pages_beams_start_at_the_generation_configs_within_the_slider(tmp_path):
    from vanilla_transformer.web.page import translation_page

    for beams, shown in ((6, 6), (12, 8)):  # the slider ends at 8
        (tmp_path / "generation_config.json").write_text(json.dumps({"num_beams": beams}))
        page = translation_page(tmp_path, translate=lambda lines, **options: [])
        sliders = {c["props"].get("elem_id"): c["props"] for c in page.config["components"] if c["type"] == "slider"}
        assert (sliders["beams"]["value"], sliders["beams"]["maximum"]) == (shown, 8)
        assert sliders["nbest-size"]["value"] == 4
