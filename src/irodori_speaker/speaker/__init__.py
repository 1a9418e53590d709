"""The Speaker: an asyncio runtime that turns lines of text into gapless, interruptible speech.

    async with Speaker(output="null") as s:
        await s.say("こんにちは！")

`facade.py` is the `Speaker`; the parts it owns are described there. Importing this package
loads no torch.
"""

from .facade import Speaker
from .lines import LineOptions, Priority
from .utterance import Utterance, UtteranceState

__all__ = ["LineOptions", "Priority", "Speaker", "Utterance", "UtteranceState"]
