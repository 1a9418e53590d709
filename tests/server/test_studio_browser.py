"""The studio page in headless Chromium, against a bot's running Speaker (tiny model, NullOutput
at real-time speed) served by EventsServer: a dictionary word changes the reading preview, a
line is spoken into the page's audio element (a WAV of the line's length), a phrase is
prebuilt, listed, played and removed, and the Speaker's last lines are listed."""

from __future__ import annotations

import pytest
from onscreen_helpers import LiveSpeaker, chromium, screenshot, wait_for

from irodori_speaker.cache import PhraseCache
from irodori_speaker.options import SynthesisOptions
from irodori_speaker.synthesis.loading import load_synthesizer

pytest.importorskip("pyopenjtalk")  # readings and the dictionary need the ja extra
# one xdist worker runs this module: its module-scoped Speaker and browser start once (conftest.py)
pytestmark = pytest.mark.xdist_group(__name__)

TEXT = "蒼月ソラです、よろしくお願いします！"
SPOKEN = "こんにちは、今日もよろしくお願いします！"


@pytest.fixture(scope="module")
def live(irodori_home, tmp_path_factory):
    home = tmp_path_factory.mktemp("studio")
    synth = load_synthesizer(
        tiny_random=True, backend="cpu", voice_cache_dir=False, user_dict=home / "dict.sqlite3"
    )
    cache = PhraseCache(home / "phrases")
    live = LiveSpeaker(synth, cache=cache, options={"seed": 0})
    yield live
    live.close()
    cache.close()


@pytest.fixture(scope="module")
def page(live):
    driver = chromium()
    try:
        driver.get(live.url + "/studio")
        wait_for(driver, "return window.__studio && window.__studio.ready === true")
        yield driver
    finally:
        driver.quit()


def fill(driver, element_id: str, value: str) -> None:
    driver.execute_script("document.getElementById(arguments[0]).value = arguments[1]", element_id, value)


def click(driver, element_id: str) -> None:
    driver.find_element("id", element_id).click()


def text_of(driver, element_id: str) -> str:
    return driver.execute_script("return document.getElementById(arguments[0]).textContent", element_id)


def test_a_dictionary_word_changes_the_reading_preview(page):
    fill(page, "reading-text", TEXT)
    click(page, "reading-go")
    before = wait_for(page, "return document.getElementById('reading-after').textContent")
    assert "アオツキ" not in before
    fill(page, "dict-surface", "蒼月")
    fill(page, "dict-pron", "アオツキ")
    click(page, "dict-add")
    after = wait_for(page, "const t = document.getElementById('reading-after').textContent;"
                           "return t.includes('アオツキ') && t")  # fmt: skip
    assert after != before and after.startswith("アオツキ")
    assert "アオツキ" not in text_of(page, "reading-before")  # the same text without the dictionary
    assert "蒼月" in text_of(page, "dict-words")


def test_a_line_is_spoken_into_the_audio_element_as_a_wav_of_its_length(live, page):
    fill(page, "try-text", SPOKEN)
    click(page, "try-speak")
    wav = wait_for(page, "return window.__studio.lastWav", 60)
    duration = wait_for(page, "const a = document.getElementById('try-audio');"
                              "return a.readyState >= 1 && a.duration", 10)  # fmt: skip
    # the same line rendered here with the same options (seed 0) has exactly that many samples
    opts = SynthesisOptions(seed=0)
    expected = live.speaker.synthesizer.synthesize(
        "こんにちは、今日もよろしくお願いします！", None, opts
    ).audio
    assert wav["samples"] == len(expected) and wav["rate"] == 48_000
    assert wav["bytes"] == 44 + 2 * len(expected)  # a 16-bit mono WAV
    assert duration == pytest.approx(len(expected) / 48_000, abs=1e-3)  # as the browser decoded it


def test_the_speakers_last_lines_are_listed(live, page):
    live.say("配信を見てくれてありがとう！")
    recent = wait_for(page, "const t = document.getElementById('speaker-recent').textContent;"
                            "return t.includes('配信を見てくれてありがとう') && t", 10)  # fmt: skip
    assert "(played)" in recent


def test_a_phrase_is_prebuilt_listed_played_and_removed(live, page):
    fill(page, "cache-lines", "いらっしゃいませ！")
    click(page, "cache-prebuild")
    wait_for(page, "return document.querySelectorAll('#cache-list tbody tr').length >= 1", 60)
    entry = live.speaker.cache.entries()[0]
    assert entry.text and "いらっしゃいませ" in text_of(page, "cache-list")
    page.find_element("css selector", f"#cache-list tr[data-key='{entry.key}'] button.play").click()
    duration = wait_for(page, "const a = document.getElementById('cache-audio');"
                              "return a.readyState >= 1 && a.duration", 10)  # fmt: skip
    assert duration == pytest.approx(entry.seconds, abs=1e-3)
    wait_for(page, "return document.getElementById('cache-audio').currentTime > 0", 10)  # it plays
    screenshot(page, "studio.png")
    page.find_element("css selector", f"#cache-list tr[data-key='{entry.key}'] button:not(.play)").click()
    wait_for(page, "return document.querySelectorAll('#cache-list tbody tr').length === 0", 10)
    assert live.speaker.cache.entries() == []
