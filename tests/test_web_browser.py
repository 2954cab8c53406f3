"""The translation page in a real headless browser: Debian's chromium, driven by Selenium through Debian's
chromedriver, on the page that the installed `vanilla-transformer demo` serves. It types a sentence, presses
Translate, reads the translation (equal to `vanilla-transformer translate`'s with the same settings), finds the
alignment heatmap and the n-best table, changes the beam size and translates again, saves a screenshot, and checks
that the page fetched nothing from the Web.

Without a browser the test says so and is skipped; `.ci/run` installs one and sets VANILLA_TRANSFORMER_REQUIRE_BROWSER,
under which a missing browser fails the test instead.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("gradio", reason="the demo extra (gradio) is not installed")

from test_ctranslate2 import SENTENCES, tokenizer  # noqa: E402,F401 (a fixture)
from test_web import folders  # noqa: E402,F401 (a fixture)

SCRIPT = str(Path(sys.executable).with_name("vanilla-transformer"))
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
pytestmark = pytest.mark.slow  # a server, a browser and two translate processes


def _browser_or_reason() -> tuple[str, str] | str:
    """The paths of a chromium and its chromedriver, or why there are none."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install 'vanilla-transformer[dev]')"
    browser = next((found for name in BROWSERS if (found := shutil.which(name))), None)
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        return (f"no headless browser to drive: {'chromium' if browser is None else 'chromedriver'} is not on PATH "
                "(Debian: apt-get install chromium chromium-driver)")
    return browser, driver


@pytest.fixture(scope="module")
def browser():
    found = _browser_or_reason()
    if isinstance(found, str):
        if os.environ.get("VANILLA_TRANSFORMER_REQUIRE_BROWSER"):
            pytest.fail(f"VANILLA_TRANSFORMER_REQUIRE_BROWSER is set, but {found}")
        pytest.skip(found)
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})  # the page's requests, for the last check
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1600"):
        options.add_argument(argument)
    try:
        driver = webdriver.Chrome(service=Service(found[1]), options=options)
    except WebDriverException as error:
        message = f"chromium ({found[0]}) did not start through {found[1]}: {error.msg}"
        pytest.fail(message) if os.environ.get("VANILLA_TRANSFORMER_REQUIRE_BROWSER") else pytest.skip(message)
    yield driver
    driver.quit()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def page_url(folders):  # noqa: F811
    """The installed `vanilla-transformer demo` serving the model folder, until the tests end."""
    port = _free_port()
    server = subprocess.Popen([SCRIPT, "demo", "--model", str(folders[0]), "--port", str(port), "--device", "cpu"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"vanilla-transformer demo ended: {server.stdout.read()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
    else:
        server.kill()
        pytest.fail("vanilla-transformer demo did not serve its page within 3 minutes")
    yield url
    server.terminate()
    server.wait(timeout=30)


def translate_command(model_dir, text: str, *flags: str) -> str:
    """`vanilla-transformer translate` of `text` piped in, as a user runs it."""
    result = subprocess.run([SCRIPT, "translate", "--model", str(model_dir), "--device", "cpu", *flags], input=text,
                            capture_output=True, text=True, timeout=300, check=True)
    return result.stdout.rstrip("\n")


def test_the_page_translates_as_translate_does_in_a_real_browser(browser, page_url, folders, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as shown
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 120)
    browser.get(page_url)
    source = wait.until(shown.element_to_be_clickable((By.CSS_SELECTOR, "#source textarea")))
    button = browser.find_element(By.CSS_SELECTOR, "#translate")
    button.click()  # nothing typed: a message on the page, no traceback
    toast = wait.until(shown.visibility_of_element_located((By.CSS_SELECTOR, ".toast-body")))
    assert "Type or paste a sentence to translate." in toast.text and "Traceback" not in browser.page_source

    text = "\n".join([SENTENCES[1], SENTENCES[3]])
    source.send_keys(text)
    button.click()
    wait.until(lambda _: _translation(browser))
    assert _translation(browser) == translate_command(folders[0], text)
    heatmap = wait.until(shown.presence_of_element_located((By.CSS_SELECTOR, "#heatmap table.alignment-heatmap")))
    assert len(heatmap.find_elements(By.CSS_SELECTOR, "tbody tr")) == len(SENTENCES[1].split())
    rows = _nbest_rows(browser)  # the page's default n-best: 4 (the paper's beams), ranked, the best first
    assert [row[0] for row in rows] == ["1", "2", "3", "4"]
    assert rows[0][1] == _translation(browser).split("\n")[0]  # the first sentence's, shown first

    for control, value in (("#nbest-size", "2"), ("#beams", "2")):  # n-best first: never more than the beams
        box = browser.find_element(By.CSS_SELECTOR, f"{control} input[type=number]")
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(value, Keys.TAB)
    button.click()
    wait.until(lambda _: len(_nbest_rows(browser)) == 2)
    assert _translation(browser) == translate_command(folders[0], text, "--num-beams", "2")
    assert browser.save_screenshot(str(tmp_path / "page.png")) and (tmp_path / "page.png").stat().st_size > 10_000
    # The page fetched nothing from the Web (system fonts, no telemetry): every request went to the page's server.
    assert [url for url in _requested(browser) if not url.startswith((page_url, "data:", "blob:"))] == []


def _requested(browser) -> list[str]:
    """The URLs the browser has requested (Chrome's performance log)."""
    import json

    messages = [json.loads(entry["message"])["message"] for entry in browser.get_log("performance")]
    return [message["params"]["request"]["url"] for message in messages
            if message["method"] == "Network.requestWillBeSent"]


# The page is read in one script each time, so that an element Gradio renders again meanwhile is never half-read.
def _translation(browser) -> str:
    """The text of the Translation box."""
    return browser.execute_script("return document.querySelector('#translation textarea').value")


def _nbest_rows(browser) -> list[list[str]]:
    """The hypotheses' rows of the n-best table (Gradio's grid: four cells a row, rank, translation, score, log P)."""
    cells = browser.execute_script("return Array.from(document.querySelectorAll('#nbest [role=\"gridcell\"]'))"
                                   ".map(cell => cell.innerText.trim())")
    return [cells[k: k + 4] for k in range(0, len(cells), 4)]
