"""A Speaker's line lanes reach the device owner (engine/hardware/owner.py): with several Speakers
on one model, a high line's device work goes ahead of the others' (the owner's own ordering is
tested in tests/test_device_owner.py)."""

from __future__ import annotations

from irodori_speaker.synthesis.loading import load_synthesizer


def test_a_speakers_line_carries_its_lane_to_the_device_owner(irodori_home, run):
    """The Speaker renders each line inside `line_lane(priority)`: what the owner reads on the
    line's thread while its jobs are submitted."""
    from irodori_speaker import NullOutput, Speaker
    from irodori_speaker.lanes import current_lane

    synth = load_synthesizer(tiny_random=True, backend="cpu", voice_cache_dir=False)
    lanes: list[int] = []
    real = synth.stream

    def stream(*a, **k):
        lanes.append(current_lane())
        return real(*a, **k)

    synth.stream = stream

    async def body():
        async with Speaker(synth, output=NullOutput(speed=100.0), prewarm=False) as s:
            await s.enqueue("高い", priority="high").wait()
            await s.enqueue("低い", priority="low").wait()
            await s.enqueue("普通").wait()

    run(body(), timeout=60)
    assert lanes == [0, 2, 1]
