"""A real headless Chromium for tests of web pages (the console), driven by Selenium.

``chromium_session`` (session scope) starts one browser for the whole session, Chromium and its
chromedriver from :func:`delayq.dev.chromium.ensure_chromium` (the pair on PATH, else Debian's
packages fetched once into the cache); the test fails with one line when neither can be had.
``browser`` (per test) hands that driver over with its cookies cleared, and when the test fails
saves a screenshot and the page's HTML into the test's tmp folder.

``DELAYQ_SCREENSHOTS=<folder>`` makes the ``screenshot`` fixture save the named pictures tests take
of their pages there (the README's pictures of the console come from that); unset, it does nothing.

A test module takes the fixtures with ``pytest_plugins = ["support.browser"]`` (importing them
would shadow them in every test's arguments).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

from delayq.dev.chromium import ChromiumError, ensure_chromium

SCREENSHOTS_VARIABLE = "DELAYQ_SCREENSHOTS"
WINDOW = (1400, 1000)
# A picture of a long page stops here: the top of a long list shows what it is.
SCREENSHOT_MAX_HEIGHT = 1600


def live(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Print past pytest's capture: a first fetch of Chromium takes long enough to say so as it goes."""
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def say(text: str) -> None:
        with capture.global_and_fixture_disabled():
            print(text, flush=True)
    return say


def chromium_options(binary: Path) -> webdriver.ChromeOptions:
    options = webdriver.ChromeOptions()
    options.binary_location = str(binary)
    # --no-sandbox: tests run as root in CI, where Chromium's sandbox refuses to start.
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={WINDOW[0]},{WINDOW[1]}"):
        options.add_argument(argument)
    return options


@pytest.fixture(scope="session")
def chromium_session(request) -> Iterator[WebDriver]:
    """One headless Chromium for the session; quit at its end."""
    try:
        binary, driver_binary = ensure_chromium(say=live(request))
    except ChromiumError as err:
        problem = str(err)
    else:
        try:
            driver = webdriver.Chrome(service=Service(executable_path=str(driver_binary)),
                                      options=chromium_options(binary))
        except WebDriverException as err:
            problem = f"{binary} did not start under {driver_binary}: {(err.msg or str(err)).splitlines()[0]}"
        else:
            driver.set_page_load_timeout(30)
            yield driver
            driver.quit()
            return
    pytest.fail(f"Chromium could not be had: {problem}", pytrace=False)


@pytest.fixture
def browser(chromium_session: WebDriver, request, tmp_path: Path) -> Iterator[WebDriver]:
    """The session's browser, cookies cleared; on the test's failure, ``failure.png`` and ``failure.html`` in tmp_path."""
    chromium_session.delete_all_cookies()
    failed_before = request.session.testsfailed
    yield chromium_session
    # The call phase's report is counted before teardown runs: more failures now means this test failed.
    if request.session.testsfailed > failed_before:
        try:
            chromium_session.save_screenshot(str(tmp_path / "failure.png"))
            (tmp_path / "failure.html").write_text(chromium_session.page_source)
            live(request)(f"\nthe browser's page when {request.node.name} failed ({chromium_session.current_url}): "
                          f"{tmp_path / 'failure.png'}, {tmp_path / 'failure.html'}")
        except WebDriverException as err:
            live(request)(f"no screenshot of the failure: {err.msg}")


def save_screenshot(driver: WebDriver, name: str) -> Path | None:
    """Save the page, below the window's edge too (up to :data:`SCREENSHOT_MAX_HEIGHT`), as
    ``<$DELAYQ_SCREENSHOTS>/<name>.png`` when that variable is set; the file, or None."""
    folder = os.environ.get(SCREENSHOTS_VARIABLE)
    if not folder:
        return None
    path = Path(folder) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    height = min(driver.execute_script("return document.documentElement.scrollHeight"), SCREENSHOT_MAX_HEIGHT)
    # Chromium's DevTools call, not WebDriver's: WebDriver's screenshot stops at the window's bottom edge.
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": WINDOW[0], "height": height, "scale": 1}})
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


@pytest.fixture
def screenshot(browser: WebDriver) -> Callable[[str], Path | None]:
    """``screenshot(name)``: the browser's page as ``<$DELAYQ_SCREENSHOTS>/<name>.png``, when that is set."""
    return lambda name: save_screenshot(browser, name)
