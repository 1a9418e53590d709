"""Calibration for GPTQ: run the float model on calibration items and capture each target Linear's inputs.

`capture_hessians` accumulates ``H = 2 X^T X / rows`` per layer through forward pre-hooks while `run_item`
runs the model on each item; `capture_inputs` keeps the inputs themselves (held-out error report).
`make_sampler_runner` is the default `run_item`: the engine's sampler on one `CalibrationItem`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from ...text.length import estimate_seconds
from ...text.normalize import normalize_or_raise
from ..model import TextToLatentRFDiT
from ..sampler import SamplerConfig, draw_noise, sample

__all__ = [
    "DEFAULT_CALIBRATION_TEXTS",
    "DEFAULT_HELDOUT_TEXTS",
    "CalibrationItem",
    "RunItem",
    "capture_hessians",
    "capture_inputs",
    "make_sampler_runner",
]


@dataclass
class CalibrationItem:
    """One calibration utterance: text; optional reference latent (T, latent_dim), caption, seconds."""

    text: str
    ref_latent: torch.Tensor | None = None
    caption: str | None = None
    seconds: float | None = None


RunItem = Callable[[object], object]


def _linear_input(args: tuple) -> torch.Tensor:
    x = args[0]
    return x.detach().reshape(-1, x.shape[-1])


def capture_hessians(
    model: nn.Module,
    names: Iterable[str],
    items: Iterable[object],
    run_item: RunItem,
    *,
    device: torch.device | str | None = None,
) -> dict[str, tuple[torch.Tensor, int]]:
    """H = 2 X^T X / rows (fp32) and the row count per named Linear, from inputs seen while `run_item`
    runs the model on each calibration item (under no_grad)."""
    acc: dict[str, list] = {}
    hooks = []
    for name in names:
        mod = model.get_submodule(name)

        def hook(_m, args, name=name):
            x = _linear_input(args).to(torch.float32)
            if device is not None:
                x = x.to(device)
            slot = acc.get(name)
            if slot is None:
                slot = acc[name] = [torch.zeros(x.shape[1], x.shape[1], device=x.device), 0]
            slot[0].addmm_(x.t(), x)
            slot[1] += x.shape[0]

        hooks.append(mod.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            for item in items:
                run_item(item)
    finally:
        for h in hooks:
            h.remove()
    return {name: (2.0 * h / max(rows, 1), rows) for name, (h, rows) in acc.items()}


def capture_inputs(
    model: nn.Module,
    names: Iterable[str],
    items: Iterable[object],
    run_item: RunItem,
    *,
    rows_per_call: int = 64,
    max_rows: int = 1024,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """A seeded random sample of each named module's input rows (fp32, CPU), for held-out error checks."""
    gen = torch.Generator().manual_seed(seed)
    got: dict[str, list[torch.Tensor]] = {}
    count: dict[str, int] = {}
    hooks = []
    for name in names:

        def hook(_m, args, name=name):
            if count.get(name, 0) >= max_rows:
                return
            x = _linear_input(args).to(torch.float32).cpu()
            take = min(rows_per_call, x.shape[0], max_rows - count.get(name, 0))
            idx = torch.randperm(x.shape[0], generator=gen)[:take]
            got.setdefault(name, []).append(x[idx])
            count[name] = count.get(name, 0) + take

        hooks.append(model.get_submodule(name).register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            for item in items:
                run_item(item)
    finally:
        for h in hooks:
            h.remove()
    return {name: torch.cat(parts) for name, parts in got.items()}


def make_sampler_runner(
    model: TextToLatentRFDiT,
    tokenizer,
    *,
    caption_tokenizer=None,
    num_steps: int = 8,
    schedule: str = "sway",
    seed: int = 0,
    max_seconds: float = 12.0,
) -> RunItem:
    """A `run_item` that synthesises one `CalibrationItem` (or str) with the engine's sampler: text and
    optional reference/caption conditions, duration from the v3 predictor or the text-length estimate,
    `num_steps` steps with the default CFG, so activations at every t and every CFG branch are seen."""
    cfg = model.cfg
    dev = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    sampler = SamplerConfig(steps=num_steps, schedule=schedule)

    def run(item) -> torch.Tensor:
        it = item if isinstance(item, CalibrationItem) else CalibrationItem(str(item))
        text = normalize_or_raise(it.text)
        ids, mask = tokenizer.batch([text], max_len=getattr(cfg, "max_text_len", None) or 256)
        ref = mask_r = None
        if it.ref_latent is not None:
            ref = it.ref_latent.to(dev, dtype)[None]
            mask_r = torch.ones(ref.shape[:2], dtype=torch.bool, device=dev)
        cap = cap_mask = None
        if it.caption is not None and caption_tokenizer is not None:
            cap, cap_mask = caption_tokenizer.batch([normalize_or_raise(it.caption)])
            cap, cap_mask = cap.to(dev), cap_mask.to(dev)
        conds = model.encode_conditions(ids.to(dev), mask.to(dev), ref, mask_r, cap, cap_mask)
        if it.seconds is not None:
            seconds = it.seconds
        elif getattr(cfg, "use_duration_predictor", False):
            seconds = float(torch.expm1(model.predict_log_frames(conds).float())[0]) / 25.0
        else:
            seconds = estimate_seconds(text)
        frames = int(min(max(round(seconds * 25), 13), round(max_seconds * 25)))
        noise = draw_noise(seed, 1, frames, cfg.latent_dim, device=dev)
        return sample(model, conds, noise, sampler)

    return run


DEFAULT_CALIBRATION_TEXTS: tuple[str, ...] = (
    "今日はいい天気ですね。散歩に行きませんか？",
    "本日の東京の最高気温は三十二度の予想です。熱中症に十分注意してください。",
    "えっ、本当に？それはびっくりだよ！",
    "配信を見てくれてありがとう！また明日も遊びに来てね。",
    "次のニュースです。政府は新しい経済対策を発表しました。",
    "うーん、ちょっと難しいけど、がんばってみるね。",
    "この商品は三千九百八十円、送料は無料です。",
    "ごめんなさい、聞き取れませんでした。もう一度お願いできますか？",
    "わあ、すごい！初めて見た！",
    "電車が遅れております。ご迷惑をおかけして申し訳ございません。",
    "私の名前はアイリです。よろしくお願いします。",
    "明日の会議は午前十時から、第二会議室で行います。",
    "ふふっ、それは秘密だよ。",
    "桜の花が満開になり、公園は多くの花見客でにぎわっています。",
    "えーと、次はどのゲームをやろうかな。みんなはどれがいい？",
    "このボタンを押すと、設定画面が開きます。",
    "静かな夜ですね。星がとてもきれいです。",
    "よっしゃー！ついにクリアしたぞ！",
    "お問い合わせは、平日の午前九時から午後五時までとなっております。",
    "それでは、今日のゲストをお呼びしましょう。どうぞ！",
    "ちょっと待って、今の話もう少し詳しく教えて。",
    "台風十号は、今夜遅くに九州南部に接近する見込みです。",
    "いただきます！このラーメン、めっちゃおいしい！",
    "残念ですが、本日の受付は終了いたしました。",
    "ねえねえ、聞いて聞いて！今日いいことがあったんだ。",
    "二〇二五年の売上高は、前年比で十二パーセント増加しました。",
    "大丈夫、ゆっくりでいいからね。",
    "右に曲がって、二つ目の信号を左です。",
    "みなさん、こんばんは。今夜も始まりました、深夜のラジオです。",
    "うそでしょ……信じられない。",
    "コメントありがとう！その質問、あとで答えるね。",
    "吾輩は猫である。名前はまだ無い。",
)

DEFAULT_HELDOUT_TEXTS: tuple[str, ...] = (
    "おはようございます。今日も一日がんばりましょう。",
    "この件については、改めてご連絡いたします。",
    "やったー！プレゼントありがとう！",
    "次の駅は新宿、新宿です。お出口は右側です。",
)
