"""The page at / in a real browser: headless Chromium (Debian's /usr/bin/chromium) driven by
Playwright draws a digit with the mouse, and the label and the ten bars the page shows are the
server's answer for that drawing; a screenshot is kept and checked."""
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.serving import Server

CHROMIUM = os.environ.get("CNNINFER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.browser
playwright = pytest.importorskip("playwright.sync_api")
pytest.importorskip("starlette")
if not Path(CHROMIUM).is_file():
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def server():
    s = Server("models/cnninfer-mnist.hdf5", "--backend", "cpu", "--max-delay-ms", "1")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def page(server):
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 900, "height": 620})
            page.goto(server.url + "/")
            yield page
        finally:
            browser.close()


def stroke(page, points):
    box = page.locator("#pad").bounding_box()
    page.mouse.move(box["x"] + points[0][0], box["y"] + points[0][1])
    page.mouse.down()
    for x, y in points[1:]:
        page.mouse.move(box["x"] + x, box["y"] + y, steps=6)
    page.mouse.up()


def shown(page):
    """(label shown, the ten bar widths) once the page is answered and settled."""
    page.wait_for_function("document.getElementById('pad').dataset.settled === 'yes'", timeout=20000)
    return page.inner_text("#label").strip(), page.locator("#bars .fill").evaluate_all(
        "els => els.map(e => parseFloat(e.style.width))")


def test_drawing_a_one_shows_1(page):
    page.click("#clear")
    stroke(page, [(140, 40), (140, 240)])
    label, bars = shown(page)
    assert label == "1"
    assert len(bars) == 10 and int(np.argmax(bars)) == 1 and abs(sum(bars) - 100) < 1


def test_drawing_a_seven_shows_7_and_the_screenshot(page, tmp_path):
    page.click("#clear")
    stroke(page, [(70, 60), (210, 60), (120, 240)])
    label, bars = shown(page)
    assert label == "7" and int(np.argmax(bars)) == 7
    shot = tmp_path / "page.png"
    page.screenshot(path=str(shot))
    from PIL import Image

    img = np.asarray(Image.open(shot).convert("RGB"))
    assert img.shape == (620, 900, 3)
    box = page.locator("#pad").bounding_box()
    pad = img[int(box["y"]):int(box["y"] + box["height"]), int(box["x"]):int(box["x"] + box["width"])]
    white = (pad > 200).all(axis=2).mean()
    black = (pad < 30).all(axis=2).mean()
    assert 0.03 < white < 0.4 and black > 0.5, "the pad shows the white stroke on black"
    top = page.locator("#bars .bar.top").get_attribute("data-class")
    assert top == "7"


def test_clear_resets(page):
    page.click("#clear")
    assert page.locator("#pad").get_attribute("data-settled") == "yes"
    assert page.inner_text("#label").strip() == "–"
    assert page.locator("#bars .bar").count() == 0
