"""The installed `vanilla-transformer` script run as a user runs it, in a child process: sentences piped to `translate`
or named by --input, on the folders a user gets from `train`, `average`, a checkpoint and a fine-tuning run. Standard
input carries the sentences and nothing else, standard output the translations and nothing else: transformers'
question whether to run a folder's own code (its `auto_map`) must never be asked, since it would read its answers
from the sentences."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_config_for
from transformers import AutoTokenizer

from vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.cli.main import main

SCRIPT = Path(sys.executable).with_name("vanilla-transformer")
SENTENCES = "one hundred and two\nseven\n\nforty-one thousand\n"  # a blank line stays blank
DECODING_FLAGS = ["--num-beams", "2", "--max-new-tokens", "6"]
REMOTE_CODE_QUESTION = "custom code"  # "... contains custom code which must be executed ... [y/N]"

pytestmark = pytest.mark.skipif(not SCRIPT.exists(), reason="the console script is not installed next to this Python")


def write_tsv(corpus, path):
    path.write_text("".join(f"{pair['en']}\t{pair['fr']}\n" for pair in corpus["train"]["translation"]),
                    encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def folders(corpus, tokenizer_dir, tmp_path_factory):
    """A user's model folders, made by the commands: a run (`train`), its checkpoint, the average of its two
    checkpoints (`average`) and a run fine-tuned from it (`train --model_name_or_path`)."""
    root = tmp_path_factory.mktemp("console-script")
    common = ["--preset", "tiny", "--max_tokens", "256", "--warmup_steps", "4", "--report_to", "none",
              "--disable_tqdm", "true", "--source_lang", "en", "--target_lang", "fr"]
    pairs = str(write_tsv(corpus, root / "pairs.tsv"))
    main(["train", "--train_file", pairs, "--tokenizer_name", str(tokenizer_dir), "--max_steps", "4",
          "--save_steps", "2", "--output_dir", str(root / "run"), *common])
    main(["average", "--run", str(root / "run"), "--last", "2", "--out", str(root / "averaged")])
    main(["train", "--train_file", pairs, "--model_name_or_path", str(root / "run"), "--max_steps", "2",
          "--save_strategy", "no", "--output_dir", str(root / "fine-tuned"), *common])
    return {name: root / name for name in ("run", "run/checkpoint-2", "averaged", "fine-tuned")}


def expected_translations(folder) -> bytes:
    """The translations of SENTENCES by transformers' translation pipeline, in this process: one line each."""
    from transformers import pipeline

    translator = pipeline("translation", model=str(folder), device="cpu")
    lines = SENTENCES.splitlines()
    outputs = translator([line for line in lines if line.strip()], batch_size=32, num_beams=2, max_new_tokens=6)
    texts = iter(output["translation_text"] for output in outputs)
    return "".join(f"{next(texts) if line.strip() else ''}\n" for line in lines).encode()


def run_script(*arguments, **options) -> subprocess.CompletedProcess:
    return subprocess.run([SCRIPT, *map(str, arguments)], capture_output=True, timeout=300, **options)


@pytest.mark.slow  # four trained folders, eight processes
@pytest.mark.parametrize("name", ["run", "run/checkpoint-2", "averaged", "fine-tuned"])
def test_translate_reads_only_sentences_from_a_pipe_and_writes_only_translations(name, folders, tmp_path):
    folder = folders[name]
    assert "auto_map" in (folder / "config.json").read_text()  # a folder that names its own code
    expected = expected_translations(folder)
    piped = run_script("translate", "--model", folder, *DECODING_FLAGS, input=SENTENCES.encode())
    assert REMOTE_CODE_QUESTION not in piped.stderr.decode(), piped.stderr.decode()[-2000:]
    assert piped.returncode == 0, piped.stderr.decode()[-2000:]
    assert piped.stdout == expected
    # The same sentences from a file, standard input closed: the same bytes.
    source = tmp_path / "sentences.txt"
    source.write_text(SENTENCES, encoding="utf-8")
    from_file = run_script("translate", "--model", folder, "--input", source, *DECODING_FLAGS,
                           stdin=None, preexec_fn=lambda: os.close(0))
    assert from_file.returncode == 0, from_file.stderr.decode()[-2000:]
    assert REMOTE_CODE_QUESTION not in from_file.stderr.decode()
    assert from_file.stdout == expected


@pytest.mark.slow  # a process of its own
def test_translate_with_standard_input_closed_says_so_in_one_line(tmp_path):
    # Said before the model is looked at.
    result = run_script("translate", "--model", tmp_path, stdin=None, preexec_fn=lambda: os.close(0))
    assert result.returncode == 2
    assert result.stderr.decode() == (
        "vanilla-transformer translate: error: standard input is closed: pipe the sentences in, or give --input FILE\n"
    )
    assert result.stdout == b""


@pytest.fixture(scope="module")
def random_model(tokenizer_dir, tmp_path_factory):
    """A tiny random model saved with the `tokenizer_dir` BPE: a folder the commands load in a blink."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("random-model")
    VanillaTransformerForConditionalGeneration(tiny_config_for(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow  # a process of its own
def test_translate_ends_quietly_when_its_reader_goes(random_model, tmp_path):
    # `translate | head -1`: the reader has gone before the first translation is written.
    source = tmp_path / "sentences.txt"
    source.write_text(SENTENCES, encoding="utf-8")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([SCRIPT, "translate", "--model", random_model, "--input", source,
                                 *DECODING_FLAGS], stdout=write_end, stderr=subprocess.PIPE, timeout=300)
    finally:
        os.close(write_end)
    assert result.returncode == 141 and result.stderr == b""  # 128 + SIGPIPE, as a filter killed by the signal


@pytest.mark.slow  # a process of its own
def test_sigterm_during_translate_keeps_the_old_output_and_leaves_nothing_beside_it(random_model, tmp_path):
    source, output = tmp_path / "sentences.txt", tmp_path / "out.txt"
    source.write_text("".join(f"{i} one hundred and two\n" for i in range(3000)), encoding="utf-8")
    output.write_text("the old translations\n")
    process = subprocess.Popen([SCRIPT, "translate", "--model", random_model, "--input", source, "--output", output,
                                "--num-beams", "4", "--max-new-tokens", "20"], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".out.txt.*.tmp")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # until translate has begun writing beside the output
    assert process.poll() is None, "translate ended before it could be stopped"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143  # 128 + SIGTERM
    assert stderr.decode().splitlines()[-1] == "vanilla-transformer translate: stopped by SIGTERM"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.txt", "sentences.txt"]
    assert output.read_text() == "the old translations\n"


@pytest.mark.slow  # a process of its own
def test_a_line_of_200000_characters_gets_an_empty_line_and_a_warning_naming_it(random_model, tmp_path):
    words = ("one", "two", "hundred", "and", "forty", "thousand")
    huge = " ".join(words[i % 6] for i in range(33_000))  # about 200,000 characters
    result = run_script("translate", "--model", random_model, *DECODING_FLAGS,
                        input=f"seven\n{huge}\nforty-one\n".encode())
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    # The other lines translated as they are alone.
    from vanilla_transformer.backends.table import torch_translator

    alone = torch_translator(random_model, "cpu")(["seven", "forty-one"], num_beams=2, max_new_tokens=6)
    assert result.stdout.decode() == f"{alone[0]}\n\n{alone[1]}\n"
    assert "Line 2 (" in result.stderr.decode() and "tokens: left untranslated" in result.stderr.decode()
