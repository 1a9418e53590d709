"""Which speech-length estimator fits Japanese speech best?

Proxy for real speech: pyopenjtalk's own HTS voice (``pyopenjtalk.tts``, offline with
pyopenjtalk-plus), leading and trailing silence trimmed (-40 dB below the peak, 10 ms
frames). Estimators compared on ~50 varied sentences (incl. benchmarks/data/news5.json):

- ``baseline``: len/4.5 + 1.0 s clamped to [4, 30] (the heuristic this project replaces)
- ``chars-fit``: a * chars + b, fitted by least squares, plus a margin = the 95th
  percentile of the fit's shortfalls (so about 5 % of lines come out short)
- ``morae-fit`` (pyopenjtalk morae) and ``kana-fit`` (the fallback mora count):
  morae / rate + pauses * pause_s + b, fitted the same way
- ``default:<method>``: `estimate_seconds` with the library's defaults

Fitted rows are also scored leave-one-out (fit on the others, predict the one left out).
"short" = estimate below the speech (speech would be cut off); "tail" = mean seconds of
excess where the estimate is longer.

Run: ``python benchmarks/duration_estimate.py``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
from pathlib import Path

import numpy as np

from irodori_speaker.text.length import count_morae, count_pauses, estimate_seconds
from irodori_speaker.text.split import measure

SENTENCES = [
    "はい。",
    "えっ？",
    "ありがとう！",
    "おはよう！",
    "うん、そうだね。",
    "やったー！",
    "ただいま。",
    "みなさん、こんばんは！今日も配信に来てくれてありがとう。",
    "コメント読みますね、「今日のゲームは何ですか？」だって。",
    "今日はホラーゲームをやっていこうと思います。",
    "ちょっと待って、今のは本当にびっくりした……",
    "スーパーチャットありがとうございます！とても嬉しいです。",
    "それじゃあ、そろそろ寝る時間なので、今日の配信はここまでにします。",
    "明日の夜八時から、また一緒に遊びましょうね。",
    "えへへ、褒められるとちょっと照れちゃうな。",
    "このボス、何回やっても倒せないんだけど、どうしたらいいと思う？",
    "次のアップデートでは新しいキャラクターが追加されるみたいです。",
    "今日の最高気温は32度、湿度は80%です。",
    "価格は1,980円で、送料は無料です。",
    "会議は午後3時15分から始まります。",
    "YouTubeとTwitchで同時配信しています。",
    "Pythonのバージョン3.12をインストールしました。",
    "2024年の売上は前年比で15%増加しました。",
    "AIの技術は日々進化しています。",
    "コンピューターのメモリーが足りないみたいです。",
    "アイスクリームとチョコレートケーキ、どっちがいい？",
    "経済産業省は再生可能エネルギー導入促進策を発表した。",
    "国際宇宙ステーションへの物資輸送計画が承認された。",
    "昔々、ある山奥の小さな村に、とても働き者のおじいさんとおばあさんが仲良く暮らしていました。",
    "研究チームによると、新しい治療法は従来の方法に比べて副作用が少なく、"
    "患者の負担を大きく減らすことができるということです。",
    "駅前の再開発工事は来年の春に完了する予定で、完成後には商業施設や図書館、"
    "子育て支援センターなどが入る複合ビルが誕生します。",
    "気象庁によりますと、前線の影響で西日本を中心に大気の状態が非常に不安定となり、"
    "局地的に雷を伴った激しい雨が降るおそれがあります。",
    "今日もがんばろうね😊",
    "大好きだよ♡",
    "楽しみ！！！",
    "え、マジで！？",
    "うーん……どうしようかなぁ。",
    "本当にそれでいいんですか？",
    "すごい、完璧だね！",
    "静かにしてください。",
    "きょうはとてもいいてんきなので、さんぽにいきましょう。",
    "わたしのなまえはいろどりです、よろしくね。",
    "あしたはあめがふるかもしれないから、かさをもっていってね。",
    "東京、大阪、名古屋、福岡の四都市で開催されます。",
    "第一に安全、第二に品質、第三に効率です。",
]


NEWS5_JSON = Path(__file__).resolve().parent / "data" / "news5.json"


def _news5() -> list[str]:
    return list(json.loads(NEWS5_JSON.read_text(encoding="utf-8"))["sentences"])


def speech_seconds(text: str) -> float:
    """Length of pyopenjtalk's HTS rendering of `text`, edge silence trimmed."""
    with contextlib.redirect_stdout(io.StringIO()):
        import pyopenjtalk
    wav, sr = pyopenjtalk.tts(text)
    x = np.asarray(wav, dtype=np.float64)
    hop = sr // 100
    frames = len(x) // hop
    rms = np.sqrt(np.mean(x[: frames * hop].reshape(frames, hop) ** 2, axis=1))
    voiced = np.nonzero(rms > rms.max() * 10 ** (-40 / 20))[0]
    return float((voiced[-1] - voiced[0] + 1) * hop / sr)


def _fit(features: np.ndarray, y: np.ndarray, q: float = 95.0) -> tuple[np.ndarray, float]:
    """Least squares y ~ features @ w (features include a ones column), plus a margin."""
    w, *_ = np.linalg.lstsq(features, y, rcond=None)
    shortfall = y - features @ w
    return w, float(np.percentile(shortfall, q))


def _scores(est: np.ndarray, y: np.ndarray) -> dict[str, float]:
    err = est - y
    over = err[err > 0]
    return {
        "mae": float(np.mean(np.abs(err))),
        "short_pct": float(100 * np.mean(err < 0)),
        "worst_short": float(max(0.0, -err.min())),
        "tail": float(over.mean()) if len(over) else 0.0,
    }


def _loo(features: np.ndarray, y: np.ndarray, floor: float) -> np.ndarray:
    pred = np.empty_like(y)
    for k in range(len(y)):
        keep = np.arange(len(y)) != k
        w, margin = _fit(features[keep], y[keep])
        pred[k] = min(30.0, max(floor, float(features[k] @ w) + margin))
    return pred


def _chars_for(seconds: float, texts: list[str], sel: np.ndarray) -> float:
    """Characters at which the default estimate reaches `seconds`, at the long lines' density."""
    picked = [t for t, keep in zip(texts, sel) if keep]
    per_char = sum(estimate_seconds(t, cap_s=30.0) for t in picked) / sum(measure(t) for t in picked)
    return seconds / per_char


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--floor", type=float, default=1.0, help="floor for the fitted estimators")
    args = ap.parse_args()

    news = _news5()
    texts = SENTENCES + news
    y = np.array([speech_seconds(t) for t in texts])
    chars = np.array([measure(t) for t in texts], dtype=float)
    raw_len = np.array([len(t) for t in texts], dtype=float)
    pauses = np.array([count_pauses(t) for t in texts], dtype=float)
    ones = np.ones_like(y)
    morae = {
        m: np.array([count_morae(t, method=m) for t in texts], dtype=float) for m in ("openjtalk", "kana")
    }

    rows: list[tuple[str, str, dict[str, float], dict[str, float] | None]] = []
    baseline = np.clip(raw_len / 4.5 + 1.0, 4.0, 30.0)
    rows.append(("baseline len/4.5+1 [4,30]", "-", _scores(baseline, y), None))

    designs = {
        "chars-fit": np.stack([chars, ones], 1),
        "morae-fit (openjtalk)": np.stack([morae["openjtalk"], pauses, ones], 1),
        "kana-fit": np.stack([morae["kana"], pauses, ones], 1),
    }
    for name, x in designs.items():
        w, margin = _fit(x, y)
        est = np.clip(x @ w + margin, args.floor, 30.0)
        if name == "chars-fit":
            params = f"{1 / w[0]:.2f} chars/s, b {w[1]:+.2f}, margin {margin:.2f}"
        else:
            params = f"{1 / w[0]:.2f} morae/s, pause {w[1]:.3f} s, b {w[2]:+.2f}, margin {margin:.2f}"
        rows.append((name, params, _scores(est, y), _scores(_loo(x, y, args.floor), y)))

    for method in ("openjtalk", "kana", "chars"):
        est = np.array([estimate_seconds(t, method=method) for t in texts])
        rows.append((f"default:{method}", "library defaults", _scores(est, y), None))

    print(f"# duration estimate vs pyopenjtalk HTS speech ({len(texts)} sentences)")
    print(f"# python {platform.python_version()}, {platform.machine()}, numpy {np.__version__}")
    print(
        f"# speech: mean {y.mean():.2f} s, min {y.min():.2f}, max {y.max():.2f}; "
        f"chars/s {chars.sum() / y.sum():.2f}, morae/s {morae['openjtalk'].sum() / y.sum():.2f}"
    )
    long = chars >= 30
    print(
        f"# lines of >= 30 chars: {chars[long].sum() / y[long].sum():.2f} chars/s of speech, "
        f"so 15 s holds about {15 * chars[long].sum() / y[long].sum():.0f} chars; the default estimate "
        f"reaches 15 s at about {_chars_for(15.0, texts, long):.0f} chars"
    )
    head = (
        f"{'estimator':28s} {'MAE s':>6s} {'short%':>6s} {'worst':>6s} {'tail s':>6s}"
        f"   {'LOO MAE/short%':>15s}  params"
    )
    print(head)
    print("-" * len(head))
    for name, params, s, loo in rows:
        loo_s = f"{loo['mae']:6.2f} / {loo['short_pct']:4.1f}" if loo else " " * 15
        print(
            f"{name:28s} {s['mae']:6.2f} {s['short_pct']:6.1f} {s['worst_short']:6.2f} {s['tail']:6.2f}"
            f"   {loo_s:>15s}  {params}"
        )
    news5_table(texts, y, news)


def news5_table(texts: list[str], y: np.ndarray, news: list[str]) -> None:
    """Per-sentence view of news5: the speech, the old heuristic and the default estimate."""
    if not news:
        return
    print()
    print(f"{'news5':8s} {'chars':>5s} {'speech':>6s} {'baseline':>8s} {'default':>7s}")
    tot = np.zeros(3)
    for k, t in enumerate(news):
        sp = float(y[texts.index(t)])
        base = min(30.0, max(4.0, len(t) / 4.5 + 1.0))
        est = estimate_seconds(t)
        tot += (sp, base, est)
        print(f"{f'[{k}]':8s} {len(t):5d} {sp:6.2f} {base:8.2f} {est:7.2f}")
    print(f"{'total':8s} {'':5s} {tot[0]:6.2f} {tot[1]:8.2f} {tot[2]:7.2f}")


if __name__ == "__main__":
    main()
