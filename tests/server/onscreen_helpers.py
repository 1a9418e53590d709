"""Helpers of the on-screen tests (docs/overlay.md): a real Speaker on the tiny model with a
NullOutput at real-time speed and its EventsServer, on an event loop of their own (Selenium is
synchronous), and headless Chromium from Debian driven by Selenium."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("websockets")

from irodori_speaker.outputs import NullOutput
from irodori_speaker.server.events_server import EventsServer
from irodori_speaker.speaker import Speaker

DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


class LiveSpeaker:
    """An open Speaker (real time, NullOutput) and its EventsServer in a thread's event loop."""

    def __init__(self, synth: Any, port: int = 0, **speaker: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="live-speaker", daemon=True)
        self.thread.start()
        self.events: list[Any] = []
        self.received: dict[int, float] = {}  # id(event) -> when the Speaker delivered it
        self.speaker = Speaker(synth, output=NullOutput(speed=1.0), pause_s=0.2, **speaker)
        self.server = EventsServer(port=port)
        self.run(self._open())

    async def _open(self) -> None:
        await self.speaker.open()
        self.speaker.on(None, self._got)
        await self.server.start(self.speaker)

    def _got(self, event: Any) -> None:
        self.received[id(event)] = time.monotonic()
        self.events.append(event)

    @property
    def url(self) -> str:
        return self.server.url

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 120.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], Any]) -> Any:
        async def go() -> Any:
            return fn()

        return self.run(go())

    def say(self, text: str, **line: Any) -> Any:
        return self.run(self.speaker.say(text, **line))

    def of(self, kind: str, uid: int | None = None) -> list[Any]:
        return [e for e in list(self.events) if e.kind == kind and (uid is None or e.utterance_id == uid)]

    def close(self) -> None:
        try:
            self.run(self.server.stop(), 30)
            self.run(self.speaker.aclose(), 30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


def chromium() -> Any:
    """Headless Chromium at 1920x1080 (Debian's chromium + chromium-driver), or skip saying why."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the dev extra) is not installed")
    binary = next((shutil.which(b) for b in CHROMIUM if shutil.which(b)), None)
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        pytest.skip("Chromium is missing: apt-get install chromium chromium-driver (CONTRIBUTING.md)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1920,1080",
        "--force-device-scale-factor=1",
        "--autoplay-policy=no-user-gesture-required",
        "--hide-scrollbars",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=driver_path))
    # the page itself 1920x1080 (the window's size includes the browser's own frame)
    metrics = {"width": 1920, "height": 1080, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    return driver


def wait_for(driver: Any, script: str, timeout: float = 30.0, *args: Any) -> Any:
    """Poll `script` (a JavaScript expression's `return ...`) until it is truthy; its value."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = driver.execute_script(script, *args)
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not true after {timeout} s: {script} (last {value!r})")


def screenshot(driver: Any, name: str) -> Path:
    """A 1920x1080 PNG of the page for the docs (docs/images/NAME)."""
    DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
    path = DOCS_IMAGES / name
    driver.get_screenshot_as_file(str(path))
    return path
