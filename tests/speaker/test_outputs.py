"""Outputs: device lookup by stable name, file sink, several outputs, resampling, failure and reopen."""

from __future__ import annotations

import asyncio
import sys
import types

import numpy as np
import pytest
import soundfile as sf
from speaker_fakes import SR, EventLog, FakeSynth, amplitude

from irodori_speaker.errors import AudioError
from irodori_speaker.outputs import (
    Block,
    FileOutput,
    NullOutput,
    SoundDeviceOutput,
    Track,
    find_output_device,
    make_output,
)
from irodori_speaker.speaker import Speaker, UtteranceState

LINES = ["一つ目の行です", "二つ目の行はこれ", "三つ目で終わり"]


def _plateaus(x: np.ndarray, min_len: int) -> list[float]:
    """Levels of the flat stretches (>= min_len samples) of a mono signal, in order."""
    x = np.round(np.asarray(x, dtype=np.float64), 3)
    out: list[float] = []
    i = 0
    while i < len(x):
        j = i
        while j < len(x) and x[j] == x[i]:
            j += 1
        if j - i >= min_len and x[i] != 0.0:
            out.append(float(x[i]))
        i = j
    return out


@pytest.fixture
def fake_sd(monkeypatch):
    """A stand-in sounddevice module with a Windows-like device list."""
    apis = [{"name": "MME"}, {"name": "Windows WASAPI"}, {"name": "ALSA"}]
    rows = [
        ("Speakers (Realtek High Definition Audio)", 0, 2),
        ("Speakers (Realtek High Definition Audio)", 1, 2),
        ("CABLE Input (VB-Audio Virtual Cable)", 0, 8),
        ("CABLE Input (VB-Audio Virtual Cable)", 1, 8),
        ("Microphone (USB)", 0, 0),
        ("Speakers (USB Audio)", 1, 2),
        ("hw:0", 2, 2),
    ]
    devices = [
        {"index": i, "name": n, "hostapi": a, "max_output_channels": ch, "default_samplerate": 48000.0}
        for i, (n, a, ch) in enumerate(rows)
    ]
    mod = types.ModuleType("sounddevice")
    mod.query_devices = lambda: devices
    mod.query_hostapis = lambda i=None: apis if i is None else apis[i]
    mod.default = types.SimpleNamespace(device=[-1, 0], hostapi=0)
    monkeypatch.setitem(sys.modules, "sounddevice", mod)
    return mod


def test_devices_are_found_by_name_and_host_api_not_index(fake_sd):
    assert find_output_device("cable")["index"] == 2  # same device on two APIs: the default API wins
    assert find_output_device("VB-Audio", hostapi="wasapi")["index"] == 3
    assert find_output_device("speakers (usb audio)")["index"] == 5  # exact name, any case
    with pytest.raises(AudioError, match="ambiguous") as e:
        find_output_device("Speakers", hostapi="WASAPI")  # Realtek and USB
    assert "Realtek" in str(e.value) and "USB Audio" in str(e.value)
    with pytest.raises(AudioError, match="no output device matching 'Microphone'"):
        find_output_device("Microphone")  # an input-only device is not an output
    with pytest.raises(AudioError, match="available"):
        find_output_device("nothing like this")
    assert find_output_device(None)["index"] == 0  # the system default


def test_an_absent_device_is_an_audio_error_when_the_speaker_opens(run, fake_sd):
    async def body():
        async with Speaker(FakeSynth(), output=SoundDeviceOutput("Headset that is unplugged")):
            pass

    with pytest.raises(AudioError, match="no output device matching"):
        run(body())


def test_missing_portaudio_is_an_audio_error(run, monkeypatch):
    monkeypatch.setitem(sys.modules, "sounddevice", None)  # import fails

    async def body():
        async with Speaker(FakeSynth(), output="Speakers"):
            pass

    with pytest.raises(AudioError, match="unavailable"):
        run(body())


def test_file_output_is_one_continuous_file_in_order(run, tmp_path):
    fake = FakeSynth()
    path = tmp_path / "out.wav"

    async def body():
        async with Speaker(fake, output=FileOutput(path, subtype="FLOAT"), pause_s=0.2) as s:
            for t in LINES:
                await s.say(t)  # one at a time: idle time must not reach the file

    run(body())
    audio, sr = sf.read(path, dtype="float32")
    gap = np.zeros(round(0.2 * SR), np.float32)
    expected = np.concatenate(
        [fake.audio_for(LINES[0]), gap, fake.audio_for(LINES[1]), gap, fake.audio_for(LINES[2])]
    )
    assert sr == SR
    np.testing.assert_array_equal(audio, expected)
    run(_open_file_output(tmp_path / "no" / "such" / "dir" / "x.wav"))  # made, as `say -o` makes it
    assert (tmp_path / "no" / "such" / "dir" / "x.wav").is_file()
    (tmp_path / "a-file").write_text("")
    with pytest.raises(AudioError):
        run(_open_file_output(tmp_path / "a-file" / "x.wav"))


async def _open_file_output(path):
    async with Speaker(FakeSynth(), output=path):
        pass


def test_several_outputs_at_once_each_at_its_own_rate(run):
    fake = FakeSynth(seconds_per_char=0.02)
    main = NullOutput(speed=4.0, record=True)
    cable = NullOutput(speed=4.0, sample_rate=44_100, channels=2, record=True, name="cable")
    low = NullOutput(speed=4.0, sample_rate=24_000, record=True, name="low")

    async def body():
        async with Speaker(fake, output=[main, cable, low], pause_s=0.1) as s:
            hs = [s.enqueue(t) for t in LINES]
            await asyncio.gather(*hs)

    run(body())
    want = [amplitude(t) for t in LINES]
    assert _plateaus(main.recorded()[:, 0], 1000) == want
    rec = cable.recorded()
    assert rec.shape[1] == 2 and np.array_equal(rec[:, 0], rec[:, 1])
    assert _plateaus(rec[:, 0], 1000) == want  # resampled, same lines in the same order
    assert _plateaus(low.recorded()[:, 0], 500) == want
    line_44k = np.count_nonzero(np.abs(rec[:, 0] - want[0]) < 1e-3)
    assert abs(line_44k - fake.samples_for(LINES[0]) * 44_100 / SR) < 200


def test_make_output_specs(tmp_path):
    assert isinstance(make_output("null"), NullOutput)
    assert isinstance(make_output(tmp_path / "a.wav"), FileOutput)
    assert isinstance(make_output(str(tmp_path / "a.flac")), FileOutput)
    assert isinstance(make_output("CABLE Input"), SoundDeviceOutput)
    assert isinstance(make_output("USB Audio 2.0"), SoundDeviceOutput)
    for name in ("a.ogg", "a.opus", "a.MP3"):
        assert isinstance(make_output(str(tmp_path / name)), FileOutput)
    with pytest.raises(AudioError, match=r"unknown file extension '\.aiff'"):
        make_output(str(tmp_path / "a.aiff"))  # a file we cannot write, not a device called "a.aiff"
    with pytest.raises(Exception, match="not an output"):
        make_output(3.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name, fmt, subtype",
    [
        ("a.wav", "WAV", "PCM_16"),
        ("a.flac", "FLAC", "PCM_16"),
        ("a.ogg", "OGG", "VORBIS"),
        ("a.opus", "OGG", "OPUS"),
        ("a.mp3", "MP3", "MPEG_LAYER_III"),
    ],
)
def test_speaker_output_path_writes_the_format_its_extension_names(name, fmt, subtype, run, tmp_path):
    path = tmp_path / name

    async def body():
        async with Speaker(FakeSynth(), output=str(path)) as s:
            await s.say(LINES[0])

    run(body())
    info = sf.info(str(path))
    assert (info.format, info.subtype, info.samplerate, info.channels) == (fmt, subtype, SR, 1)
    audio, _ = sf.read(str(path), dtype="float32")
    assert abs(len(audio) - len(FakeSynth().audio_for(LINES[0]))) < 2_000  # lossy codecs pad a little


def test_file_output_sample_rate_and_channels(run, tmp_path):
    path = tmp_path / "st.flac"

    async def body():
        async with Speaker(FakeSynth(), output=FileOutput(path, sample_rate=24_000, channels=2)) as s:
            await s.say(LINES[0])

    run(body())
    audio, sr = sf.read(str(path), dtype="float32")
    assert sr == 24_000 and audio.shape[1] == 2
    np.testing.assert_array_equal(audio[:, 0], audio[:, 1])  # the mono line on both channels


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"path": "x.xyz"}, "unknown file extension '.xyz'"),
        ({"path": "noext"}, "no file extension"),
        ({"path": "x.wav", "subtype": "VORBIS"}, "cannot hold subtype 'VORBIS'"),
        ({"path": "x.opus", "sample_rate": 44_100}, "Opus cannot store 44100 Hz"),
        ({"path": "/proc/x.wav"}, "cannot write /proc/x.wav"),
    ],
)
def test_file_output_mistakes_fail_when_it_is_made(kwargs, match, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AudioError, match=match) as e:
        FileOutput(**kwargs)
    assert e.value.hint and "\n" not in str(e.value)


class Flaky(NullOutput):
    """A sink that can be "unplugged"."""

    def unplug(self) -> None:
        self.error = AudioError("device unplugged")
        self._running = False


def test_a_failed_output_reports_and_reopens_without_losing_lines(run):
    fake = FakeSynth(seconds_per_char=0.05)
    out = Flaky(speed=1.0, record=True)

    async def body():
        async with Speaker(fake, output=out) as s:
            log = EventLog(s)
            h1 = s.enqueue("途中で抜かれる長い行です")
            h2 = s.enqueue("抜かれた後に読む行")
            while h1.state != UtteranceState.PLAYING:
                await asyncio.sleep(0.005)
            out.unplug()
            await h1
            await asyncio.sleep(0.1)
            waiting = h2.state
            errors = log.of("output_error")
            await s.reopen_outputs()
            await h2
            return log, h1, h2, waiting, errors

    log, h1, h2, waiting, errors = run(body())
    assert len(errors) == 1 and "unplugged" in str(errors[0].error)
    assert h1.state == UtteranceState.INTERRUPTED and 0 < h1.played_fraction < 1
    assert not waiting.terminal  # kept, not dropped
    assert log.of("output_recovered") and h2.state == UtteranceState.PLAYED


def test_losing_one_of_two_outputs_keeps_playing_on_the_other(run):
    fake = FakeSynth(seconds_per_char=0.03)
    a, b = Flaky(speed=2.0, name="a"), NullOutput(speed=2.0, record=True, name="b")

    async def body():
        async with Speaker(fake, output=[a, b]) as s:
            log = EventLog(s)
            h1 = s.enqueue("二つの出力で読む行")
            while h1.state != UtteranceState.PLAYING:
                await asyncio.sleep(0.005)
            a.unplug()
            h2 = s.enqueue("残った出力で読む行")
            await asyncio.gather(h1, h2)
            return log, h1, h2

    log, h1, h2 = run(body())
    assert [e.output for e in log.of("output_error")] == ["a"]
    assert h1.state == h2.state == UtteranceState.PLAYED
    assert amplitude("残った出力で読む行") in _plateaus(b.recorded()[:, 0], 1000)


def _render_all(out: NullOutput, n: int) -> np.ndarray:
    buf = np.zeros((n, 1), dtype=np.float32)
    out._render(buf)
    out._pos += n
    return buf[:, 0].copy()


def test_render_drops_a_line_that_never_started_and_fades_one_that_did():
    out = NullOutput(fade_s=0.001)
    out._prepare(48_000, 1)  # 48-sample fade
    t1, t2 = Track(1), Track(2)
    out.push(Block(t1, np.ones(1000, np.float32), last=True))
    out.push(Block(t2, np.full(1000, 0.5, np.float32), last=True))
    assert out.drop_track(t2) is True and t2.dropped  # not started: dropped at once
    first = _render_all(out, 100)
    assert np.all(first == 1.0) and t1.start_pos == 0
    assert out.drop_track(t1) is False  # started: the render thread fades it
    rest = _render_all(out, 200)
    assert t1.stopped and t1.done and t1.end_pos == 148
    assert np.all(np.diff(rest[:48]) < 0) and rest[47] < 0.01 and np.all(rest[48:] == 0)
    assert t1.played == 148 and t2.played == 0 and t2.start_pos is None
