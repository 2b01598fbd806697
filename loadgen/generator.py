"""The load generator: streaming OpenAI requests at a fixed concurrency or a request rate, swept over levels.

One run (:meth:`LoadGenerator.run`) does, in order:

1. discover the server: ``GET /v1/models`` (the served id and ``max_model_len``) and ``GET /version``, and refuse
   a workload that cannot fit (``input_len + output_len > max_model_len``) before sending any load;
2. build the workload's prompts for the warm-up and for every level (``loadgen.workloads``: distinct random
   prompts, a shared prefix, multi-turn sessions or a replayed trace), and serialise every request up front
   (a multi-turn session's later turns wait for the answer they resend), so the measured interval holds
   nothing but sending and reading;
3. warm up (results dropped), then measure each level in turn:

   - **concurrency** N: N workers send back to back; every request "arrives" at the level's start, as with
     ``vllm bench serve --request-rate inf --max-concurrency N``, so client queue time is the wait for a worker;
   - **rate** R: arrivals at R per second, Poisson (exponential gaps, seeded) or constant, optionally capped at
     ``max_concurrency`` requests in flight (the excess waits and that wait is the client queue time);

   - **trace**: one level, each request at its trace timestamp (``max_concurrency`` caps requests in flight);

   a level ends when its ``num_prompts`` requests are done, or, with ``duration_s``, when no new request may
   start (requests in flight finish and count); ``/metrics`` is read before and after each level for the
   server's prefix-cache hit rate (``loadgen.server_cache``);
4. summarise each level (``loadgen.stats``) and find the sweep's knee.

Measured requests go straight to the httpx transport's ``handle_async_request`` with pre-built
``httpx.Request`` objects; :class:`~loadgen.transport.StreamingTransport` (the default) stamps arrival
times in ``data_received``. Any other httpx transport works too, with stamps taken when the bytes are read.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import httpx

from loadgen.datasets import DatasetError, LocalTokenizer, ServerTokenCounter, TokenCounter, UsageTokenCounter
from loadgen.server_cache import level_cache_figures, level_server_counts, scrape_cache
from loadgen.sessions import ChatMessages, SessionLevel
from loadgen.sse import DONE, SseSplitter, read_chunk
from loadgen.stats import Knee, RequestRecord, SweepPoint, find_knee, summarize
from loadgen.transport import RECEIPT_CLOCK, StreamingTransport
from loadgen.workloads import WorkItem, Workload, arrival_offsets, build_workload, trace_offsets
from shared.domain.errors import PermanentError
from shared.messages import BenchmarkRequest

__all__ = ["GENERATOR", "BenchmarkResult", "BenchmarkSetupError", "LoadGenerator", "PointResult", "Target"]

GENERATOR = "tpuctl-bench/1"
_ERROR_BODY_BYTES = 2048


class BenchmarkSetupError(PermanentError):
    """The benchmark cannot start: bad target or workload. Says which field and how to fix it."""


@dataclass(frozen=True)
class Target:
    """The server to load and how to talk to it."""

    base_url: str
    endpoint: Literal["chat", "completions"] = "completions"
    model: str | None = None
    """Served model id; None takes the first one ``/v1/models`` lists."""
    api_key: str | None = field(default=None, repr=False)

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"


@dataclass
class PointResult:
    """One measured level: its records and metrics."""

    mode: Literal["concurrency", "rate"]
    level: float
    max_concurrency: int | None
    request_rate: float | None
    """Offered rate (req/s); None for concurrency levels (vLLM's ``inf``)."""
    records: list[RequestRecord]
    origin: float
    duration_s: float
    stopped_by: Literal["count", "duration", "cancelled"]
    metrics: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Flat and JSON-able: the level's settings, then vLLM-keyed metrics (floats rounded)."""
        head: dict[str, Any] = {
            "mode": self.mode,
            "level": int(self.level) if self.mode == "concurrency" else self.level,
            "max_concurrency": self.max_concurrency,
            "request_rate": self.request_rate if self.request_rate is not None else "inf",
            "num_prompts": len(self.records),
            "stopped_by": self.stopped_by,
        }
        for key, value in self.metrics.items():
            head[key] = round(value, 4) if isinstance(value, float) else value
        return head

    def sweep_point(self) -> SweepPoint:
        return SweepPoint(
            level=self.level,
            request_throughput=float(self.metrics.get("request_throughput", 0.0)),
            mean_e2el_ms=float(self.metrics.get("mean_e2el_ms", 0.0)),
            completed=int(self.metrics.get("completed", 0)),
            failed=int(self.metrics.get("failed", 0)),
            arrival_rate=self.metrics.get("arrival_rate") if self.mode == "rate" else None,
            completion_rate=self.metrics.get("completion_rate") if self.mode == "rate" else None,
        )


@dataclass
class BenchmarkResult:
    """A whole run: settings, server, dataset, every level, and the knee."""

    request: BenchmarkRequest
    target: Target
    model: str
    server: dict[str, Any]
    dataset: dict[str, Any]
    warmup: dict[str, Any]
    started_at: datetime
    finished_at: datetime
    points: list[PointResult]
    knee: Knee
    cancelled: bool = False

    def failures(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for point in self.points:
            for cause, count in point.metrics.get("failures", {}).items():
                total[cause] = total.get(cause, 0) + count
        return dict(sorted(total.items()))

    def as_dict(self) -> dict[str, Any]:
        """The structured result published with ``benchmark.completed`` (no per-request lists)."""
        return {
            "generator": GENERATOR,
            "endpoint": self.target.endpoint,
            "model": self.model,
            "server": self.server,
            "request": self.request.model_dump(mode="json", exclude={"prompts", "trace"}),
            "dataset": self.dataset,
            "warmup": self.warmup,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat(),
            "cancelled": self.cancelled,
            "points": [point.as_dict() for point in self.points],
            "knee": self.knee.as_dict(),
            "failures": self.failures(),
        }

    def records_jsonl(self) -> Iterator[str]:
        """One JSON line per measured request, tagged with its level."""
        for number, point in enumerate(self.points):
            for record in point.records:
                yield json.dumps({"point": number, "level": point.level, **record.as_dict(point.origin)})


class LoadGenerator:
    """Runs :class:`~shared.messages.BenchmarkRequest` workloads against one OpenAI-compatible server."""

    def __init__(
        self,
        target: Target,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        token_counter: TokenCounter | None = None,
        tokenizer_file: Path | None = None,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        connect_timeout_s: float = 10.0,
        text_salt: int | None = None,
        server_counts: bool = False,
    ) -> None:
        """``text_salt`` fixes the prompts' texts across runs (tests); None draws one per run, so a run never
        finds its prompts in the server's prefix cache from an earlier run with the same seed. ``server_counts``
        adds each level's ``/metrics`` deltas of requests succeeded and tokens (``level_server_counts``)."""
        if not target.base_url.startswith(("http://", "https://")):
            raise BenchmarkSetupError(f"base_url: {target.base_url!r} must start with http:// or https://")
        self.target = target
        self._transport = transport or StreamingTransport(connect_timeout_s=connect_timeout_s)
        self._token_counter = token_counter
        self._tokenizer_file = tokenizer_file
        self._wall_clock = wall_clock
        self._connect_timeout_s = connect_timeout_s
        self._text_salt = text_salt
        self._server_counts = server_counts
        self._headers = {"content-type": "application/json", "accept": "text/event-stream"}
        if target.api_key:
            self._headers["authorization"] = f"Bearer {target.api_key}"
        self._stop = asyncio.Event()
        self._timeout_s = 600.0

    def stop(self) -> None:
        """Ask a running :meth:`run` to start no more requests; those in flight finish, and the result says so."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called (a later :meth:`run` measures nothing)."""
        return self._stop.is_set()

    # --- one run ---------------------------------------------------------------------------------------------

    async def run(
        self,
        request: BenchmarkRequest,
        *,
        prompt_entries: Sequence[tuple[str, int | None]] | None = None,
        on_point: Callable[[PointResult], None] | None = None,
    ) -> BenchmarkResult:
        """Run every level of ``request``; ``prompt_entries`` overrides ``request.prompts`` (a prompt file)."""
        self._timeout_s = request.request_timeout_s
        started = self._wall_clock()
        timeout = httpx.Timeout(30.0, connect=self._connect_timeout_s)
        async with httpx.AsyncClient(
            base_url=self.target.base_url, headers=self._headers, transport=self._transport, timeout=timeout
        ) as client:
            model, server = await self._discover(client, request)
            levels = _levels(request)
            entries = list(prompt_entries or [(text, None) for text in request.prompts])
            workload = await self._workload(client, model, request, entries, len(levels))
            cache_before = await scrape_cache(client)
            if cache_before is not None:
                server.update(prefix_caching=cache_before.enabled, block_size=cache_before.block_size)
            warm = [
                self._build(client, model, item.prompt.text, item.prompt.output_tokens, request)
                for item in workload.warm
            ]
            warm_level = levels[0] if _mode(request) == "concurrency" else 1
            warmup = await self._warm_up(warm, workload.warm, warm_level)
            points: list[PointResult] = []
            for number, level in enumerate(levels):
                if self._stop.is_set():
                    break
                before = await scrape_cache(client)
                point = await self._run_level(client, model, request, level, workload, number)
                after = await scrape_cache(client)
                point.metrics.update(level_cache_figures(before, after, point.records))
                if self._server_counts:
                    point.metrics.update(level_server_counts(before, after))
                points.append(point)
                if on_point is not None:
                    on_point(point)
        knee = find_knee([point.sweep_point() for point in points], _mode(request))
        return BenchmarkResult(
            request=request,
            target=self.target,
            model=model,
            server=server,
            dataset=workload.describe(),
            warmup=warmup,
            started_at=started,
            finished_at=self._wall_clock(),
            points=points,
            knee=knee,
            cancelled=self._stop.is_set(),
        )

    async def _discover(self, client: httpx.AsyncClient, request: BenchmarkRequest) -> tuple[str, dict[str, Any]]:
        try:
            response = await client.get("/v1/models")
        except httpx.HTTPError as exc:
            raise BenchmarkSetupError(
                f"base_url: {self.target.base_url} did not answer GET /v1/models ({type(exc).__name__}); "
                "is the server up and listening there?"
            ) from exc
        if response.status_code == 401:
            raise BenchmarkSetupError("api_key: the server answered 401 to GET /v1/models (give the right API key)")
        if response.status_code != 200:
            raise BenchmarkSetupError(f"base_url: GET /v1/models answered {response.status_code}")
        cards = [card for card in response.json().get("data", []) if isinstance(card, dict)]
        ids = [str(card.get("id")) for card in cards]
        model = self.target.model or (ids[0] if ids else "")
        if not model or model not in ids:
            raise BenchmarkSetupError(f"model: {model or '<none>'!r} is not served here (served: {', '.join(ids)})")
        card = cards[ids.index(model)]
        max_model_len = card.get("max_model_len")
        server: dict[str, Any] = {"model": model, "max_model_len": max_model_len, "version": None}
        try:
            version = await client.get("/version")
            if version.status_code == 200:
                server["version"] = version.json().get("version")
        except (httpx.HTTPError, ValueError):
            server["version"] = None
        problem = request.context_problem(max_model_len, "the server's") if isinstance(max_model_len, int) else None
        if problem:
            raise BenchmarkSetupError(problem)
        return model, server

    async def _counter(self, client: httpx.AsyncClient, model: str) -> TokenCounter:
        if self._token_counter is not None:
            return self._token_counter
        if self._tokenizer_file is not None:
            try:
                return LocalTokenizer(self._tokenizer_file)
            except (DatasetError, OSError, ValueError):
                pass  # fall back to the server's tokenizer
        server = ServerTokenCounter(client, model)
        if await server.available():
            return server
        return UsageTokenCounter(client, model)

    async def _workload(
        self,
        client: httpx.AsyncClient,
        model: str,
        request: BenchmarkRequest,
        entries: list[tuple[str, int | None]],
        levels: int,
    ) -> Workload:
        counter = await self._counter(client, model)
        if request.dataset == "prompts" and not entries:
            raise BenchmarkSetupError("benchmark.prompts: the prompts dataset needs prompts (or a prompt file)")
        salt = self._text_salt if self._text_salt is not None else random.SystemRandom().randrange(2**31)
        text_seed = (request.seed * 1_000_003 + salt) % 2**31
        return await build_workload(counter, request, entries, levels, text_seed=text_seed)

    def _build(
        self,
        client: httpx.AsyncClient,
        model: str,
        prompt: str | ChatMessages,
        output_tokens: int,
        request: BenchmarkRequest,
    ) -> httpx.Request:
        """A streamed request: ``prompt`` is the completions prompt, or (chat) a user text or the messages."""
        body: dict[str, Any] = {"model": model}
        if self.target.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            body["max_completion_tokens"] = output_tokens
        else:
            body["prompt"] = prompt
            body["max_tokens"] = output_tokens
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        if request.ignore_eos:
            body["ignore_eos"] = True
        if request.temperature is not None:
            body["temperature"] = request.temperature
        built = client.build_request("POST", self.target.path, content=json.dumps(body).encode())
        if isinstance(self._transport, StreamingTransport):
            StreamingTransport.prepare(built)
        return built

    async def _warm_up(self, built: list[httpx.Request], items: list[WorkItem], level: float) -> dict[str, Any]:
        if not built:
            return {"requests": 0, "failed": 0}
        point = await self._concurrency_level(built, items, max(1, min(int(level), len(built))), None)
        failed = [record for record in point[0] if not record.success]
        if len(failed) == len(built):
            causes = sorted({record.error for record in failed})
            raise BenchmarkSetupError(
                f"warmup_requests: every warm-up request failed ({', '.join(causes)}: {failed[0].detail[:200]}); "
                "check the endpoint, model and API key"
            )
        return {"requests": len(built), "failed": len(failed)}

    async def _run_level(
        self,
        client: httpx.AsyncClient,
        model: str,
        request: BenchmarkRequest,
        level: float,
        workload: Workload,
        number: int,
    ) -> PointResult:
        mode = _mode(request)
        cap = int(level) if mode == "concurrency" else request.max_concurrency
        if request.workload == "multi_turn":
            sessions = SessionLevel(
                workload.sessions[number],
                build=lambda body, tokens: self._build(client, model, body, tokens, request),
                send=self._send,
                chat=self.target.endpoint == "chat",
                stop=self._stop,
                duration_s=request.duration_s,
            )
            if mode == "concurrency":
                records, origin, duration, stopped = await sessions.run_concurrency(int(level))
            else:
                offsets = arrival_offsets(len(sessions.sessions), level, request.arrival, request.seed + number)
                records, origin, duration, stopped = await sessions.run_rate(offsets, cap)
        else:
            items = workload.levels[number]
            built = [self._build(client, model, item.prompt.text, item.prompt.output_tokens, request) for item in items]
            if mode == "concurrency":
                records, origin, duration, stopped = await self._concurrency_level(
                    built, items, int(level), request.duration_s
                )
            else:
                offsets = (
                    trace_offsets(request.trace)
                    if request.workload == "trace"
                    else arrival_offsets(len(built), level, request.arrival, request.seed + number)
                )
                records, origin, duration, stopped = await self._rate_level(
                    built, items, offsets, cap, request.duration_s
                )
            _credit_reuse(records, items)
        return PointResult(
            mode=mode,
            level=level,
            max_concurrency=cap,
            request_rate=None if mode == "concurrency" else level,
            records=records,
            origin=origin,
            duration_s=duration,
            stopped_by=stopped,
            metrics=_summary(records, duration, request),
        )

    async def _concurrency_level(
        self, built: list[httpx.Request], items: list[WorkItem], workers: int, duration_s: float | None
    ) -> tuple[list[RequestRecord], float, float, Literal["count", "duration", "cancelled"]]:
        records: list[RequestRecord] = []
        origin = time.perf_counter()
        deadline = origin + duration_s if duration_s else None
        work = iter(range(len(built)))
        expired = False

        async def worker() -> None:
            nonlocal expired
            for index in work:
                if self._stop.is_set():
                    return
                if deadline is not None and time.perf_counter() >= deadline:
                    expired = True
                    return
                prompt = items[index].prompt
                record = RequestRecord(
                    index=index,
                    arrival=origin,
                    prompt_tokens=prompt.prompt_tokens,
                    expected_output_tokens=prompt.output_tokens,
                )
                records.append(record)
                await self._send(built[index], record)

        await asyncio.gather(*(worker() for _ in range(max(1, workers))))
        duration = max(time.perf_counter() - origin, 1e-9)
        stopped: Literal["count", "duration", "cancelled"] = (
            "cancelled" if self._stop.is_set() else "duration" if expired else "count"
        )
        records.sort(key=lambda record: record.index)
        return records, origin, duration, stopped

    async def _rate_level(
        self,
        built: list[httpx.Request],
        items: list[WorkItem],
        offsets: list[float],
        cap: int | None,
        duration_s: float | None,
    ) -> tuple[list[RequestRecord], float, float, Literal["count", "duration", "cancelled"]]:
        """Request ``i`` arrives ``offsets[i]`` seconds after the level starts (Poisson, constant or a trace)."""
        records: list[RequestRecord] = []
        tasks: list[asyncio.Task[None]] = []
        slots = asyncio.Semaphore(cap) if cap else None
        origin = time.perf_counter()
        deadline = origin + duration_s if duration_s else None
        stopped: Literal["count", "duration", "cancelled"] = "count"
        for index, offset in enumerate(offsets[: len(built)]):
            due = origin + offset
            if deadline is not None and due >= deadline:
                stopped = "duration"
                break
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            if self._stop.is_set():
                stopped = "cancelled"
                break
            prompt = items[index].prompt
            record = RequestRecord(
                index=index,
                arrival=time.perf_counter(),
                prompt_tokens=prompt.prompt_tokens,
                expected_output_tokens=prompt.output_tokens,
            )
            records.append(record)
            tasks.append(asyncio.create_task(self._send_capped(slots, built[index], record)))
        if tasks:
            await asyncio.gather(*tasks)
        duration = max(time.perf_counter() - origin, 1e-9)
        return records, origin, duration, stopped

    async def _send_capped(
        self, slots: asyncio.Semaphore | None, request: httpx.Request, record: RequestRecord
    ) -> None:
        if slots is None:
            await self._send(request, record)
            return
        async with slots:
            if self._stop.is_set():
                record.start = time.perf_counter()
                record.error = "cancelled"
                return
            await self._send(request, record)

    # --- one request (the measured path) ---------------------------------------------------------------------

    async def _send(self, request: httpx.Request, record: RequestRecord, answer: list[str] | None = None) -> None:
        """Send one streamed request and fill ``record`` (and ``answer`` with the text pieces, when given); never
        raises except for cancellation."""
        record.start = start = time.perf_counter()
        last = start
        got_token = False
        itl = record.itl
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await self._transport.handle_async_request(request)
                try:
                    record.status = status = response.status_code
                    if status != 200:
                        record.error = f"http_{status}"
                        record.detail = await _error_text(response)
                        return
                    clock = response.extensions.get(RECEIPT_CLOCK)
                    splitter = SseSplitter()
                    stream = response.stream
                    assert isinstance(stream, httpx.AsyncByteStream)
                    async for raw in stream:
                        now = clock.received_at if clock is not None else time.perf_counter()
                        for payload in splitter.feed(raw):
                            if payload == DONE:
                                continue
                            info = read_chunk(payload)
                            if info.token:
                                if got_token:
                                    itl.append(now - last)
                                else:
                                    got_token = True
                                    record.ttft = now - start
                                    record.response_id = info.response_id
                                last = now
                                record.token_chunks += 1
                                if answer is not None:
                                    answer.append(info.text)
                            if info.completion_tokens is not None:
                                record.output_tokens = info.completion_tokens
                            if info.prompt_tokens is not None:
                                record.prompt_tokens = info.prompt_tokens
                            if info.error is not None:
                                record.error = "stream_error"
                                record.detail = info.error
                                return
                finally:
                    await response.aclose()
        except TimeoutError:
            record.error = "timeout"
            record.detail = f"no complete response within {self._timeout_s:g} s"
            return
        except asyncio.CancelledError:
            record.error = "cancelled"
            raise
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            record.error = "connect_error"
            record.detail = str(exc)[:300]
            return
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, ConnectionError) as exc:
            record.error = "disconnected"
            record.detail = str(exc)[:300] or type(exc).__name__
            return
        except ValueError as exc:
            record.error = "bad_chunk"
            record.detail = str(exc)[:300]
            return
        except httpx.HTTPError as exc:
            record.error = f"error_{type(exc).__name__}"
            record.detail = str(exc)[:300]
            return
        if not got_token:
            record.error = "no_tokens"
            record.detail = "the stream ended without a token (vLLM: 'Never received a valid chunk')"
            return
        record.success = True
        record.latency = last - start


async def _error_text(response: httpx.Response) -> str:
    stream = response.stream
    collected = b""
    if isinstance(stream, httpx.AsyncByteStream):
        async for piece in stream:
            collected += piece
            if len(collected) >= _ERROR_BODY_BYTES:
                break
    return collected[:_ERROR_BODY_BYTES].decode("utf-8", "replace")[:300]


def _mode(request: BenchmarkRequest) -> Literal["concurrency", "rate"]:
    """A trace's one level is open loop at its own arrivals: a rate level."""
    return "rate" if request.workload == "trace" else request.mode


def _levels(request: BenchmarkRequest) -> list[float]:
    if request.workload == "trace":
        span = request.trace_span_s()
        return [round(len(request.trace) / span, 6) if span > 0 else float(len(request.trace))]
    if request.mode == "concurrency":
        return [float(level) for level in request.concurrency]
    return [float(rate) for rate in request.request_rate]


def _summary(records: list[RequestRecord], duration: float, request: BenchmarkRequest) -> dict[str, Any]:
    slo = {
        name: value
        for name, value in (("ttft", request.slo_ttft_ms), ("tpot", request.slo_tpot_ms), ("e2el", request.slo_e2el_ms))
        if value is not None
    }
    return summarize(records, duration, percentiles=request.percentiles, slo_ms=slo or None) if records else {}


def _credit_reuse(records: list[RequestRecord], items: list[WorkItem]) -> None:
    """Each answered record's ``reused_tokens`` in the server's count: the text an earlier request began with and
    the special tokens (BOS) the server put before it (its prompt tokens less those the client counted)."""
    for record in records:
        reused = items[record.index].reused_tokens
        if record.success and reused:
            record.reused_tokens = reused + max(0, record.prompt_tokens - items[record.index].prompt.prompt_tokens)
