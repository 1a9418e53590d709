"""The `irodori-speaker` command line: one entry point, one subcommand per job.

Errors print as one line (plus a hint when there is one) and exit with status 1;
usage errors exit with 2 (argparse); Ctrl-C exits with 130.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .errors import AudioError, CacheError, InputError, IrodoriError

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

EPILOG = """\
exit status: 0 done; 1 an error (one line on stderr, with a hint), or some phrases failed
(prebuild), or problems found (cache verify); 2 bad usage; 130 interrupted (Ctrl-C).
Run `irodori-speaker COMMAND --help` for a command's options. Everything runs offline
with --tiny-random (a small random model: the output is noise)."""


class Progress:
    """A one-line progress display on a terminal (stderr); silent when stderr is not a tty.

    Called as `progress(done, total)` (the sampler's steps), optionally with `eta` seconds
    (else estimated from the elapsed time) and a short `note`.
    """

    def __init__(self, label: str, enabled: bool | None = None) -> None:
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.t0 = time.perf_counter()
        self._shown = False

    def __call__(self, done: int, total: int, eta: float | None = None, note: str = "") -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.t0
        if eta is None:
            eta = elapsed / done * (total - done) if done else 0.0
        width = 24
        fill = int(width * done / max(total, 1))
        bar = "#" * fill + "-" * (width - fill)
        tail = f"  {note[:30]}" if note else ""
        sys.stderr.write(
            f"\r{self.label} [{bar}] {done}/{total}  {elapsed:5.1f}s  eta {eta:4.1f}s{tail}\x1b[K"
        )
        sys.stderr.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self._shown = False


# ---- shared flags ---------------------------------------------------------------------------


def add_model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        help="DiT checkpoint: path, hf://org/repo/file, repo id, or alias "
        "(v2, v3, v2-voicedesign, v3-voicedesign, lite-int4). Default: v2",
    )
    g.add_argument("--codec", help="DACVAE codec: weights.pth, our converted .safetensors, or a repo id")
    g.add_argument("--tokenizer", help="tokenizer.json (default: the model's tokenizer repo)")
    g.add_argument(
        "--tiny-random",
        nargs="?",
        const="v2",
        metavar="KIND",
        help="use a small random model in the real formats (offline; output is NOISE). "
        "KIND: v2 (default), v3, v2-voicedesign",
    )
    g.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "cuda", "mps", "cpu"],
        help="device backend preset (default: auto = cuda, else mps, else cpu)",
    )
    g.add_argument("--device", help="torch device override, e.g. cuda:1")
    g.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], help="model precision override")


def add_voice_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("voice")
    g.add_argument("--voice", help="reference voice: an audio file, or a saved latent (.safetensors)")
    g.add_argument("--caption", help="voice description for VoiceDesign models")


def add_sampling_flags(p: argparse.ArgumentParser, seed_help: str | None = None) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--steps", type=int, help="sampler steps (default: the backend preset's, 8)")
    g.add_argument("--schedule", choices=["linear", "sway"], help="time schedule (default: sway)")
    g.add_argument(
        "--seed",
        type=int,
        help=seed_help or "noise seed: the same seed gives the same audio (default: random)",
    )
    g.add_argument("--seconds", type=float, help="utterance length (default: predicted or estimated)")
    g.add_argument("--no-tail-trim", action="store_true", help="keep the trailing near-silence")


def add_cache_flags(p: argparse.ArgumentParser, *, optional: bool = False) -> None:
    from .cache import default_cache_dir

    g = p.add_argument_group("phrase cache")
    if optional:
        g.add_argument(
            "--cache",
            nargs="?",
            const="",
            metavar="DIR",
            help=f"look the line up in the phrase cache first and store it after (DIR default: "
            f"{default_cache_dir()}; $IRODORI_CACHE moves it). A cached line uses seed 0 unless --seed",
        )
    else:
        g.add_argument(
            "--cache",
            metavar="DIR",
            help=f"phrase cache directory (default: {default_cache_dir()}; $IRODORI_CACHE moves it)",
        )


def add_output_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sound output")
    g.add_argument(
        "--output-device",
        metavar="NAME",
        help="sound device: a unique part of its name as `irodori-speaker devices` lists it "
        "(default: the system's default output)",
    )
    g.add_argument("--hostapi", help="host API of the device when a name is offered by several (e.g. WASAPI)")


def build_voice(args: argparse.Namespace):
    from .voices import Voice

    if args.voice:
        path = Path(args.voice)
        if path.suffix == ".safetensors":
            return Voice.from_latent(path, caption=args.caption)
        return Voice.from_wav(path, caption=args.caption)
    if args.caption:
        return Voice.designed(args.caption)
    return None


def build_options(args: argparse.Namespace):
    from .synthesizer import SynthesisOptions

    return SynthesisOptions(
        steps=args.steps,
        schedule=args.schedule,
        seed=args.seed,
        seconds=args.seconds,
        tail_trim=not args.no_tail_trim,
    )


def load_from_args(args: argparse.Namespace):
    from .synthesizer import load_synthesizer

    return load_synthesizer(
        args.model,
        codec=args.codec,
        tokenizer=args.tokenizer,
        backend=args.backend,
        device=args.device,
        dtype=args.dtype,
        tiny_random=args.tiny_random or False,
    )


def open_cache(directory: str | None, *, must_exist: bool = False, **kwargs: Any):
    from .cache import INDEX_NAME, PhraseCache, default_cache_dir

    path = Path(directory).expanduser() if directory else default_cache_dir()
    if must_exist and not (path / INDEX_NAME).is_file():
        raise CacheError(
            f"there is no phrase cache at {path}",
            hint="fill one with `irodori-speaker prebuild phrases.txt --cache DIR`",
        )
    return PhraseCache(path, **kwargs)


def play_audio(audio: Any, sample_rate: int, device: str | None = None, hostapi: str | None = None) -> str:
    """Play float32 mono audio on a sound device (by name, as `devices` lists it) and wait.

    Returns the device's name. Raises AudioError when there is no device or it fails.
    """
    import numpy as np

    from .outputs import Block, SoundDeviceOutput, Track
    from .playback import resample

    out = SoundDeviceOutput(device, hostapi=hostapi)
    out.open()
    try:
        x = resample(np.ascontiguousarray(audio, dtype=np.float32).reshape(-1), sample_rate, out.sample_rate)
        track = Track(0)
        out.push(Block(track, x, last=True))
        limit = time.monotonic() + len(x) / out.sample_rate + out.latency + 3.0
        while not track.done:
            err = out.check()
            if err is not None:
                raise err if isinstance(err, AudioError) else AudioError(f"playback failed: {err}")
            if time.monotonic() > limit:
                raise AudioError(f"output {out.name!r} stopped consuming audio (no clock?)")
            time.sleep(0.02)
        time.sleep(out.latency)  # the last block is handed over, not yet heard
        info = out.device_info or {}
        return f"{info.get('name', out.name)} ({info.get('hostapi', '?')})"
    finally:
        out.close()


# ---- say -----------------------------------------------------------------------------------------


def cmd_say(args: argparse.Namespace) -> int:
    import soundfile as sf

    if not args.output and not args.play:
        raise InputError("say needs -o FILE or --play", hint="irodori-speaker say 'こんにちは' -o hello.wav")
    synth = load_from_args(args)
    voice = build_voice(args)
    options = build_options(args)
    hit = False
    progress = Progress("synthesising")
    try:
        if args.cache is not None:
            with open_cache(args.cache or None) as cache:
                line, hit = cache.render(synth, args.text, voice, options, progress=progress, source="say")
            audio, rec, rate = line.audio, line.record, line.sample_rate
        else:
            result = synth.synthesize(args.text, voice, options, progress=progress)
            audio, rec, rate = result.audio, result.record, result.sample_rate
    finally:
        progress.close()
    for w in rec.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        sf.write(str(out), audio, rate, subtype="PCM_16")
    if args.play:
        play_audio(audio, rate, device=args.output_device, hostapi=args.hostapi)
    dest = f" -> {args.output}" if args.output else ""
    if hit:
        print(f"{rec.audio_seconds:.2f} s of audio from the phrase cache, seed {rec.seed}{dest}")
        return EXIT_OK
    total = rec.compute_seconds
    rtf = total / rec.audio_seconds if rec.audio_seconds else float("nan")
    print(f"{rec.audio_seconds:.2f} s of audio in {total:.2f} s (RTF {rtf:.3f}), seed {rec.seed}{dest}")
    return EXIT_OK


# ---- prebuild ------------------------------------------------------------------------------------


def cmd_prebuild(args: argparse.Namespace) -> int:
    from .cache import format_size
    from .prebuild import load_phrases, prebuild

    phrases = load_phrases(args.phrases)
    if not phrases:
        raise InputError(f"{args.phrases} has no phrases", hint="one phrase per line; # starts a comment")
    synth = load_from_args(args)
    if synth.note:
        print(f"note: {synth.note}", file=sys.stderr)
    voice = build_voice(args)
    with open_cache(args.cache, max_bytes=args.max_bytes, audio_format=args.audio_format) as cache:
        progress = Progress("prebuilding", enabled=False if args.quiet else None)

        def show(done: int, total: int, eta: float | None, res: Any) -> None:
            note = "" if res is None else res.phrase.text
            progress(done, total, eta, note)

        try:
            report = prebuild(synth, cache, phrases, voice=voice, options=build_options(args), progress=show)
        finally:
            progress.close()
        stats = cache.stats()
    for r in report.failed:
        where = r.phrase.where or r.phrase.text
        print(f"failed: {where}: {r.error}", file=sys.stderr)
    print(report.summary())
    print(f"cache {stats.directory}: {stats.entries} entries, {format_size(stats.bytes)}")
    if report.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK if not report.failed else EXIT_ERROR


# ---- cache ---------------------------------------------------------------------------------------


def cmd_cache_stats(args: argparse.Namespace) -> int:
    from .cache import format_size

    with open_cache(args.cache, must_exist=True) as cache:
        s = cache.stats()
    if args.json:
        print(json.dumps(s.as_dict(), ensure_ascii=False, indent=2))
        return EXIT_OK
    rate = "n/a" if math.isnan(s.hit_rate) else f"{100 * s.hit_rate:.1f}%"
    print(f"directory   {s.directory}")
    print(f"entries     {s.entries} ({s.audio_seconds:.1f} s of audio)")
    print(f"size        {format_size(s.bytes)} of {format_size(s.max_bytes)}")
    print(f"lookups     {s.hits} hits, {s.misses} misses (hit rate {rate})")
    print(f"stores      {s.stores}; evicted {s.evictions}; dropped as damaged {s.dropped}")
    return EXIT_OK


def cmd_cache_list(args: argparse.Namespace) -> int:
    with open_cache(args.cache, must_exist=True) as cache:
        rows = cache.entries(limit=args.limit, order=args.sort)
    for e in rows:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
        print(f"{e.key[:12]}  {e.seconds:6.2f} s  {e.hits:5d} hits  {used}  {e.source:<8}  {e.text}")
    return EXIT_OK


def cmd_cache_verify(args: argparse.Namespace) -> int:
    with open_cache(args.cache, must_exist=True) as cache:
        progress = Progress("verifying")
        try:
            report = cache.verify(repair=not args.no_repair, on_entry=progress)
        finally:
            progress.close()
    for key, text, why in report.bad:
        action = "dropped" if report.repaired else "bad"
        print(f"{action}: {key[:12]} {text!r}: {why}", file=sys.stderr)
    extra = ""
    if report.repaired and (report.orphans_removed or report.temp_removed):
        extra = f"; removed {report.orphans_removed} orphan and {report.temp_removed} temp files"
    print(f"checked {report.checked} entries: {report.ok} ok, {len(report.bad)} damaged{extra}")
    return EXIT_OK if report.clean else EXIT_ERROR


def cmd_cache_clear(args: argparse.Namespace) -> int:
    from .cache import format_size

    with open_cache(args.cache, must_exist=True) as cache:
        n, size = cache.clear()
    print(f"removed {n} entries ({format_size(size)}) from {cache.directory}")
    return EXIT_OK


# ---- devices -------------------------------------------------------------------------------------


def tone(seconds: float = 1.0, frequency: float = 440.0, rate: int = 48_000, level: float = 0.2):
    """A sine test tone with 20 ms raised-cosine edges (no click)."""
    import numpy as np

    n = max(1, round(seconds * rate))
    t = np.arange(n) / rate
    x = (level * np.sin(2 * np.pi * frequency * t)).astype(np.float32)
    edge = min(n // 2, round(0.02 * rate))
    if edge:
        ramp = (0.5 - 0.5 * np.cos(np.linspace(0, np.pi, edge))).astype(np.float32)
        x[:edge] *= ramp
        x[-edge:] *= ramp[::-1]
    return x


def cmd_devices(args: argparse.Namespace) -> int:
    from .outputs import find_output_device, list_output_devices

    devices = list_output_devices()
    try:
        default = find_output_device(None)
    except AudioError:
        default = None
    if args.tone is not None:
        if not (0 < args.seconds <= 30):
            raise InputError(f"--seconds must be in (0, 30], got {args.seconds}")
        name = args.tone or None
        played = play_audio(tone(args.seconds, args.frequency), 48_000, device=name, hostapi=args.hostapi)
        print(f"played a {args.seconds:g} s {args.frequency:g} Hz tone on {played}")
        return EXIT_OK
    if args.json:
        for d in devices:
            d["default"] = default is not None and d["index"] == default["index"]
        print(json.dumps(devices, ensure_ascii=False, indent=2))
        return EXIT_OK
    if not devices:
        print("no output devices (PortAudio sees none)")
        return EXIT_ERROR
    names = [d["name"] for d in devices]
    for d in devices:
        mark = "*" if default is not None and d["index"] == default["index"] else " "
        shared = names.count(d["name"]) > 1
        api = f" --hostapi {d['hostapi']!r}" if shared else ""
        print(
            f"{mark} {d['name']!r} ({d['hostapi']}){api}  "
            f"{d['channels']} ch, {d['samplerate']:.0f} Hz  [index {d['index']}, may change]"
        )
    print("* = default. Choose one by name: --output-device NAME, or Speaker(output=NAME).")
    return EXIT_OK


# ---- bench ---------------------------------------------------------------------------------------

# The news5 sentences (benchmarks/data/news5.json), so the benchmark runs from an installed package.
NEWS5 = (
    "次のニュースだよっ！",
    "今日の東京は朝から青空が広がり、日中の最高気温は二十五度近くまで上がる見込みです。",
    "政府は新しい経済対策を発表し、子育て世帯への給付金や電気料金の補助を来月から全国で順次始めると明らかにしました。",
    "大型の台風が週末にかけて沖縄地方に接近する予報です。",
    "プロ野球では地元チームが九回裏に逆転サヨナラ勝ちしました。",
)


def bench_sentences(path: str | None) -> tuple[list[str], str]:
    if path is None:
        return list(NEWS5), "news5 (built in)"
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read benchmark sentences {path}: {e}") from e
    sentences = doc.get("sentences") if isinstance(doc, dict) else doc
    if not isinstance(sentences, list) or not all(isinstance(s, str) and s.strip() for s in sentences):
        raise InputError(f"{path}: expected {{'sentences': [text, ...]}} or a list of texts")
    name = doc.get("name", Path(path).stem) if isinstance(doc, dict) else Path(path).stem
    return sentences, str(name)


def run_bench(
    synth: Any,
    sentences: Sequence[str],
    voice: Any,
    options: Any,
    repeat: int = 1,
    on_row: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Per sentence: generation time, audio seconds, RTF and time to first audio (streamed).

    With `repeat` > 1 the times are medians over the repeats. `on_row` sees each row as
    soon as it is measured.
    """
    rows = []
    for i, text in enumerate(sentences, 1):
        gens, firsts, audio_s = [], [], 0.0
        for _ in range(repeat):
            t0 = time.perf_counter()
            stream = synth.stream(text, voice, options)
            first = None
            samples = 0
            try:
                for chunk in stream:
                    if first is None:
                        first = time.perf_counter() - t0
                    samples += len(chunk)
            finally:
                stream.close()
            gens.append(time.perf_counter() - t0)
            firsts.append(first if first is not None else gens[-1])
            audio_s = samples / synth.sample_rate
        gen = statistics.median(gens)
        rows.append(
            {
                "index": i,
                "chars": len(text),
                "audio_s": audio_s,
                "gen_s": gen,
                "rtf": gen / audio_s if audio_s else math.inf,
                "ttfa_s": statistics.median(firsts),
                "text": text,
            }
        )
        if on_row is not None:
            on_row(rows[-1])
    return rows


def bench_totals(rows: Sequence[dict]) -> dict:
    gen = sum(r["gen_s"] for r in rows)
    audio = sum(r["audio_s"] for r in rows)
    return {
        "chars": sum(r["chars"] for r in rows),
        "audio_s": audio,
        "gen_s": gen,
        "rtf": gen / audio if audio else math.inf,
        "ttfa_s": statistics.mean(r["ttfa_s"] for r in rows) if rows else math.nan,
    }


def _device_name(synth: Any) -> str:
    import torch

    dev = getattr(synth, "device", None)
    if dev is not None and getattr(dev, "type", "") == "cuda":
        return f"{dev} ({torch.cuda.get_device_name(dev)})"
    if dev is not None and getattr(dev, "type", "") == "cpu":
        return f"cpu ({torch.get_num_threads()} threads)"
    return str(dev)


def cmd_bench(args: argparse.Namespace) -> int:
    import platform

    import torch

    if args.repeat < 1 or args.warmup < 0:
        raise InputError("--repeat must be >= 1 and --warmup >= 0")
    sentences, name = bench_sentences(args.sentences)
    synth = load_from_args(args)
    voice = build_voice(args)
    options = build_options(args)
    if options.seed is None:
        import dataclasses

        options = dataclasses.replace(options, seed=0)
    for _ in range(args.warmup):
        synth.prewarm(voice)
    preset = synth.preset
    steps = options.steps if options.steps is not None else preset.steps
    schedule = options.schedule or preset.schedule
    model_fp = (synth.fingerprints.get("model") or "?")[:12]
    header = {
        "benchmark": name,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "device": _device_name(synth),
        "preset": preset.name,
        "dtype": str(preset.dtype).replace("torch.", ""),
        "model": args.model or ("tiny-random" if args.tiny_random else "default (v2)"),
        "model_sha256": model_fp,
        "steps": steps,
        "schedule": schedule,
        "seed": options.seed,
        "repeat": args.repeat,
        "warmup": args.warmup,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
    }
    if synth.note:
        print(f"note: {synth.note}", file=sys.stderr)
    print(
        f"{name} on {header['device']}, {header['dtype']}, {steps} steps {schedule}, seed {options.seed}; "
        f"model {header['model']} [{model_fp}]; {header['date']}"
    )
    print(f"{'#':>3} {'chars':>5} {'audio s':>8} {'gen s':>7} {'RTF':>6} {'TTFA s':>7}  text")

    def show(r: dict) -> None:
        text = r["text"] if len(r["text"]) <= 24 else r["text"][:23] + "…"
        print(
            f"{r['index']:>3} {r['chars']:>5} {r['audio_s']:>8.2f} {r['gen_s']:>7.3f} "
            f"{r['rtf']:>6.3f} {r['ttfa_s']:>7.3f}  {text}",
            flush=True,
        )

    rows = run_bench(synth, sentences, voice, options, args.repeat, on_row=show)
    totals = bench_totals(rows)
    t = totals
    print(
        f"{'all':>3} {t['chars']:>5} {t['audio_s']:>8.2f} {t['gen_s']:>7.3f} {t['rtf']:>6.3f} "
        f"{t['ttfa_s']:>7.3f}  (RTF = total generation / total audio; TTFA mean)"
    )
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps({**header, "rows": rows, "totals": totals}, ensure_ascii=False, indent=2), "utf-8"
        )
        print(f"wrote {out}")
    return EXIT_OK


# ---- convert-codec -------------------------------------------------------------------------------


def cmd_convert_codec(args: argparse.Namespace) -> int:
    from .engine.codec import convert_codec
    from .engine.sources import CODEC_REPO, resolve

    src = resolve(args.source or CODEC_REPO, "codec")
    out = convert_codec(src, args.output)
    print(f"wrote {out} (folded weights, loads without pickle)")
    return EXIT_OK


# ---- quantize ------------------------------------------------------------------------------------


def cmd_quantize(args: argparse.Namespace) -> int:
    from .engine.sources import resolve
    from .quant.quantize import quantize_checkpoint

    src = resolve(args.model, "model")
    calibration = None
    if args.calibration_file:
        lines = Path(args.calibration_file).read_text(encoding="utf-8").splitlines()
        calibration = [t.strip() for t in lines if t.strip() and not t.lstrip().startswith("#")]
        if not calibration:
            raise IrodoriError(f"{args.calibration_file}: no sentences in the calibration file")
    tokenizer = None
    if args.method == "gptq":
        from .engine.checkpoint import config_from_metadata, read_header
        from .engine.sources import TOKENIZER_REPO

        cfg, _ = config_from_metadata(read_header(src)[0], str(src))
        tokenizer = resolve(args.tokenizer or cfg.text_tokenizer_repo or TOKENIZER_REPO, "tokenizer")
    t0 = time.perf_counter()
    report = quantize_checkpoint(
        src,
        args.output,
        method=args.method,
        calibration_texts=calibration,
        checkpoint_format=args.format,
        symmetric=not args.asym,
        fallback=args.fallback,
        tokenizer=tokenizer,
        device=args.device or "cpu",
        report_errors=not args.no_report,
    )
    if not args.no_report:
        print(report.table())
    out = Path(args.output)
    print(
        f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB, {args.method}, {time.perf_counter() - t0:.1f} s)"
    )
    return EXIT_OK


# ---- the parser ----------------------------------------------------------------------------------

Command = Callable[[argparse.Namespace], int]


def _sub(sub: Any, name: str, help: str, description: str) -> argparse.ArgumentParser:
    return sub.add_parser(
        name,
        help=help,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="irodori-speaker",
        description="Japanese speech for livestream bots, on our own PyTorch Irodori-TTS engine.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = _sub(
        sub,
        "say",
        "synthesise one line to a WAV file or the speakers",
        "Synthesise TEXT to a 48 kHz WAV file (-o) and/or play it (--play).\n\n"
        "  irodori-speaker say 'こんにちは' -o hello.wav\n"
        "  irodori-speaker say 'こんにちは' --play --output-device 'Speakers'",
    )
    p.add_argument("text", help="the Japanese text to speak")
    p.add_argument("-o", "--output", help="write a 16-bit 48 kHz WAV file here")
    p.add_argument("--play", action="store_true", help="play through the default (or --output-device) device")
    add_output_flags(p)
    add_model_flags(p)
    add_voice_flags(p)
    add_sampling_flags(p)
    add_cache_flags(p, optional=True)
    p.set_defaults(func=cmd_say)

    p = _sub(
        sub,
        "prebuild",
        "render stock phrases into the phrase cache",
        "Render every phrase of PHRASES into the phrase cache, skipping those already there\n"
        "(and valid). PHRASES is a .txt file (one phrase a line, lines starting with # are\n"
        "comments) or a .yaml file (phrases with their own seed/steps/seconds/voice; see\n"
        "docs/cache.md). Cached lines use a fixed seed: the phrase's, --seed, else 0.\n"
        "Safe to interrupt and re-run: only what is missing is rendered. A phrase that\n"
        "fails is reported and the others go on; the exit status is 1 if any failed.\n\n"
        "  irodori-speaker prebuild phrases.txt --voice aoi.wav --cache ./phrase-cache",
    )
    p.add_argument("phrases", help="phrase file: .txt (one a line) or .yaml/.yml")
    add_cache_flags(p)
    p.add_argument(
        "--max-bytes", help="size limit of the cache's audio, e.g. 500M, 2G (default: the cache's, 2 GiB)"
    )
    p.add_argument(
        "--audio-format",
        choices=["f32", "flac"],
        default="f32",
        help="how new entries are stored: f32 = exact raw float (default), "
        "flac = 24-bit, about half the size",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_model_flags(p)
    add_voice_flags(p)
    add_sampling_flags(
        p, seed_help="seed for phrases that do not set one (default: 0; cached lines need one)"
    )
    p.set_defaults(func=cmd_prebuild)

    p = _sub(
        sub,
        "cache",
        "look into the phrase cache: stats, list, verify, clear",
        "Inspect or maintain a phrase cache directory (several processes may use it at once).",
    )
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION")
    csub.required = True
    c = _sub(csub, "stats", "entries, size, hits and misses", "Entries, size and lifetime hit/miss counts.")
    add_cache_flags(c)
    c.add_argument("--json", action="store_true", help="print the numbers as JSON")
    c.set_defaults(func=cmd_cache_stats)
    c = _sub(csub, "list", "the entries, most recently used first", "List entries (key, length, hits, text).")
    add_cache_flags(c)
    c.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    c.add_argument(
        "--sort", choices=["last_used", "hits", "bytes", "created"], default="last_used", help="order"
    )
    c.set_defaults(func=cmd_cache_list)
    c = _sub(
        csub,
        "verify",
        "check every entry's audio against its checksum",
        "Read every entry and check its size and sha256; drop damaged entries (they are\n"
        "re-rendered on next use) and remove leftover temp and orphan files.\n"
        "Exit status 1 if anything was damaged.",
    )
    add_cache_flags(c)
    c.add_argument("--no-repair", action="store_true", help="only report; change nothing")
    c.set_defaults(func=cmd_cache_verify)
    c = _sub(csub, "clear", "remove every entry", "Remove every entry and reset the counters.")
    add_cache_flags(c)
    c.set_defaults(func=cmd_cache_clear)

    p = _sub(
        sub,
        "devices",
        "list sound outputs (stable names) or play a test tone",
        "List the sound output devices PortAudio sees, by the names --output-device and\n"
        "Speaker(output=...) take (indexes change when devices come and go; names do not).\n\n"
        "  irodori-speaker devices\n"
        "  irodori-speaker devices --tone              # on the default device\n"
        "  irodori-speaker devices --tone 'Speakers'   # on a named one",
    )
    p.add_argument(
        "--tone",
        nargs="?",
        const="",
        metavar="NAME",
        help="play a test tone on device NAME (default: the default device)",
    )
    p.add_argument("--hostapi", help="host API of the device when a name is offered by several")
    p.add_argument("--seconds", type=float, default=1.0, help="tone length (default 1 s)")
    p.add_argument("--frequency", type=float, default=440.0, help="tone frequency in Hz (default 440)")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=cmd_devices)

    p = _sub(
        sub,
        "bench",
        "the news5 speed benchmark on this machine",
        "Read the five news5 sentences (or --sentences FILE) and print, per sentence, the\n"
        "generation time, the audio seconds, RTF (generation / audio) and time to first\n"
        "audio (streamed decode), plus totals. The model is prewarmed first (--warmup).\n\n"
        "  irodori-speaker bench --backend cuda\n"
        "  irodori-speaker bench --tiny-random --backend cpu    # offline check",
    )
    p.add_argument("--sentences", help="a JSON file {'sentences': [...]} (default: the built-in news5)")
    p.add_argument("--repeat", type=int, default=1, help="runs per sentence; times are medians (default 1)")
    p.add_argument("--warmup", type=int, default=1, help="prewarm runs before timing (default 1)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    add_model_flags(p)
    add_voice_flags(p)
    add_sampling_flags(p, seed_help="noise seed (default: 0, so runs compare)")
    p.set_defaults(func=cmd_bench)

    p = _sub(
        sub,
        "convert-codec",
        "convert the codec's weights.pth to a pickle-free safetensors file",
        "One-time conversion of the DACVAE weights.pth (weight norm folded).",
    )
    p.add_argument("source", nargs="?", help="weights.pth path or repo id (default: the released codec repo)")
    p.add_argument("-o", "--output", required=True, help="destination .safetensors file")
    p.set_defaults(func=cmd_convert_codec)

    p = _sub(
        sub,
        "quantize",
        "write an int4 checkpoint (the Irodori-TTS-Lite format) from a float one",
        "Quantise a DiT checkpoint to int4 in the format of the int4 releases (GPTQ-packed\n"
        "block Linears, RTN-packed text embedding, the rest fp16), loadable by --model.\n"
        "GPTQ calibrates on the model's real activations over Japanese sentences (built-in,\n"
        "or --calibration-file) and needs the text tokenizer; RTN needs nothing.\n"
        "Prints each packed layer's output error on held-out sentences, RTN vs GPTQ.\n\n"
        "  irodori-speaker quantize model.safetensors -o model-int4.safetensors\n"
        "  irodori-speaker quantize v2 -o v2-int4.safetensors --method rtn",
    )
    p.add_argument("model", help="float DiT checkpoint: path, hf://org/repo/file, repo id or alias")
    p.add_argument("-o", "--output", required=True, help="destination int4 .safetensors file")
    p.add_argument("--method", choices=["gptq", "rtn"], default="gptq", help="rounding (default gptq)")
    p.add_argument("--tokenizer", help="tokenizer.json for GPTQ calibration (default: the model's)")
    p.add_argument("--calibration-file", help="calibration sentences, one a line (# comments)")
    p.add_argument(
        "--format",
        choices=["gptq", "gptq_v2"],
        default="gptq",
        help="zero-point storage: gptq = v1 (z-1, the release's), gptq_v2",
    )
    p.add_argument("--asym", action="store_true", help="asymmetric groups (default symmetric, z=8)")
    p.add_argument(
        "--fallback",
        choices=["keep", "rtn"],
        default="keep",
        help="a layer calibration cannot cover: keep it fp16 (default) or round it with RTN",
    )
    p.add_argument("--device", help="where calibration and rounding run (default cpu; cuda is faster)")
    p.add_argument("--no-report", action="store_true", help="skip the held-out error table")
    p.set_defaults(func=cmd_quantize)

    from .server.command import add_parser as add_serve_parser
    from .text.dict_command import add_parser as add_dict_parser

    add_serve_parser(sub, add_model_flags)
    add_dict_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except IrodoriError as e:
        msg = super(IrodoriError, e).__str__()
        print(f"error: {msg}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `irodori-speaker cache list | head`
        with_devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(with_devnull, sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
