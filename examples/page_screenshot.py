"""A screenshot of a model's translation page (`vanilla-transformer demo`), as README.md shows it: the page served on a
free loopback port, sentences typed and translated in headless chromium (Selenium, Debian's chromedriver), the whole
page saved as a PNG of 256 colours.

    python examples/page_screenshot.py --model runs/multi30k-en-de/averaged --out docs/images/demo_page.png
"""

import argparse
import io
import shutil
import socket
import time

from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as shown
from selenium.webdriver.support.ui import WebDriverWait

from vanilla_transformer.web.page import launch, translation_page

SENTENCES = "A man in an orange hat is looking at something.\nTwo dogs play in the snow."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="A saved model folder.")
    parser.add_argument("--out", required=True, help="The PNG to write.")
    parser.add_argument("--text", default=SENTENCES, help="The sentences to type, one a line.")
    parser.add_argument("--width", type=int, default=1200, help="The window's width in pixels.")
    args = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    page = translation_page(args.model, device="cpu")
    launch(page, host="127.0.0.1", port=port, prevent_thread_lock=True, quiet=True)
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={args.width},1200"):
        options.add_argument(argument)
    browser = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        browser.get(f"http://127.0.0.1:{port}/")
        wait = WebDriverWait(browser, 120)
        wait.until(shown.element_to_be_clickable((By.CSS_SELECTOR, "#source textarea"))).send_keys(args.text)
        browser.find_element(By.CSS_SELECTOR, "#translate").click()
        wait.until(shown.presence_of_element_located((By.CSS_SELECTOR, "#heatmap table.alignment-heatmap")))
        for _ in range(3):  # the page lays itself out again in the taller window
            time.sleep(0.5)
            browser.set_window_size(args.width, browser.execute_script(
                "return document.documentElement.scrollHeight") + 120)
        png = browser.get_screenshot_as_png()
    finally:
        browser.quit()
        page.close()
    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=256)
    image.save(args.out, optimize=True)
    print(f"{args.out}: {image.width} x {image.height} pixels")


if __name__ == "__main__":
    main()
