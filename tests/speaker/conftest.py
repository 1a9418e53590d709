"""Fixtures for the Speaker tests: run a coroutine with a hard timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest


@pytest.fixture
def run() -> Callable[[Awaitable[Any]], Any]:
    """Run a coroutine on a fresh event loop; fail (not hang) after 30 s."""

    def _run(coro: Awaitable[Any], timeout: float = 30.0) -> Any:
        async def guarded() -> Any:
            return await asyncio.wait_for(coro, timeout)

        return asyncio.run(guarded())

    return _run
