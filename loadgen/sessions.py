"""One level of multi-turn sessions: each session's turns in order, each turn resending the session's history.

A turn's request is built when the previous answer has arrived: on the completions API the prompt is the previous
prompt, its answer, a newline and the new user text (so the previous prompt is a prefix of the next); on the chat
API the messages are the earlier user and assistant messages and the new user message. A failed turn ends its
session (there is no answer to build on). Concurrency N keeps N sessions going at once; a rate starts sessions at
the given arrival offsets, each running its turns back to back, with ``max_concurrency`` capping requests in flight.
Each turn's record says how many prompt tokens the previous turn sent (``reused_tokens``): what the prefix cache
may serve.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

import httpx

from loadgen.stats import RequestRecord
from loadgen.workloads import Session

__all__ = ["Build", "Send", "SessionLevel"]

ChatMessages = list[dict[str, str]]
Build = Callable[[str | ChatMessages, int], httpx.Request]
"""Builds a streamed request from a completions prompt or chat messages and the output tokens to ask for."""
Send = Callable[[httpx.Request, RequestRecord, list[str] | None], Awaitable[None]]
"""Sends one request, fills its record and appends the answer's text pieces to the list, when given."""
Stopped = Literal["count", "duration", "cancelled"]


class SessionLevel:
    """The sessions of one level and their records (see the module docstring)."""

    def __init__(
        self,
        sessions: Sequence[Session],
        *,
        build: Build,
        send: Send,
        chat: bool,
        stop: asyncio.Event,
        duration_s: float | None,
    ) -> None:
        self.sessions = list(sessions)
        self.build = build
        self.send = send
        self.chat = chat
        self.stop = stop
        self.records: list[RequestRecord] = []
        self.origin = time.perf_counter()
        self.deadline = self.origin + duration_s if duration_s else None
        self.expired = False
        self._first_index = [0]
        for session in self.sessions:
            self._first_index.append(self._first_index[-1] + len(session.turns))

    def _may_start(self) -> bool:
        if self.stop.is_set():
            return False
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            self.expired = True
            return False
        return True

    async def run_session(self, number: int, slots: asyncio.Semaphore | None = None) -> None:
        """Every turn of session ``number`` in order, each after the previous answer."""
        session = self.sessions[number]
        text = ""
        messages: ChatMessages = []
        previous: RequestRecord | None = None
        for turn, user in enumerate(session.turns):
            if not self._may_start():
                return
            if self.chat:
                messages = [*messages, {"role": "user", "content": user.text}]
                body: str | ChatMessages = messages
            else:
                text = f"{text}\n{user.text}" if text else user.text
                body = text
            record = RequestRecord(
                index=self._first_index[number] + turn,
                arrival=time.perf_counter(),
                prompt_tokens=user.prompt_tokens + (previous.prompt_tokens if previous else 0),
                expected_output_tokens=user.output_tokens,
                reused_tokens=previous.prompt_tokens if previous else 0,
            )
            self.records.append(record)
            answer: list[str] = []
            request = self.build(body, user.output_tokens)
            if slots is None:
                await self.send(request, record, answer)
            else:
                async with slots:
                    await self.send(request, record, answer)
            if not record.success:
                return
            if self.chat:
                messages = [*messages, {"role": "assistant", "content": "".join(answer)}]
            else:
                text += "".join(answer)
            previous = record

    async def run_concurrency(self, workers: int) -> tuple[list[RequestRecord], float, float, Stopped]:
        """``workers`` sessions at once, each worker taking the next session when its own ends."""
        work = iter(range(len(self.sessions)))

        async def worker() -> None:
            for number in work:
                if not self._may_start():
                    return
                await self.run_session(number)

        await asyncio.gather(*(worker() for _ in range(max(1, workers))))
        return self._finish()

    async def run_rate(
        self, offsets: Sequence[float], cap: int | None
    ) -> tuple[list[RequestRecord], float, float, Stopped]:
        """Session ``i`` starts at ``offsets[i]`` seconds; at most ``cap`` requests in flight (None: no cap)."""
        slots = asyncio.Semaphore(cap) if cap else None
        tasks: list[asyncio.Task[None]] = []
        for number, offset in enumerate(offsets[: len(self.sessions)]):
            due = self.origin + offset
            if self.deadline is not None and due >= self.deadline:
                self.expired = True
                break
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            if self.stop.is_set():
                break
            tasks.append(asyncio.create_task(self.run_session(number, slots)))
        if tasks:
            await asyncio.gather(*tasks)
        return self._finish()

    def _finish(self) -> tuple[list[RequestRecord], float, float, Stopped]:
        duration = max(time.perf_counter() - self.origin, 1e-9)
        stopped: Stopped = "cancelled" if self.stop.is_set() else "duration" if self.expired else "count"
        self.records.sort(key=lambda record: record.index)
        return self.records, self.origin, duration, stopped
