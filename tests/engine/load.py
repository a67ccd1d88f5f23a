"""A small thread-based load driver for OpenAI-compatible /v1/completions endpoints (vLLM, LiteLLM).

Every request asks for exactly `max_tokens` generated tokens (`ignore_eos: true`, greedy), so the work
of a request is known in advance. Streaming requests ask for continuous usage stats, so each streamed
chunk says how many tokens were generated so far: a record knows, for any instant, whether the request
was in flight and how many tokens it had generated (what the tests need to compute tokens in flight).

Times are wall-clock epoch seconds (`time.time()`), the same clock as scrape timestamps.

    from engine.load import run_batch, ClosedLoop, token_prompt
    records = run_batch(url, max_tokens=[50, 120, 300] * 8)           # 24 at once, waits for all
    run = start_batch(url, max_tokens=[200] * 24)                      # same, in the background
    ...scrape while run.records fill...; run.join()
    loop = ClosedLoop(url, clients=16, duration=25, max_tokens=[60, 120]).start(); loop.join()
"""
from __future__ import annotations

import bisect
import itertools
import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import requests

Prompt = Union[str, list]  # text, or a list of token ids (sent as-is: no BOS is added by the engine)

FIRST_TOKEN_ID = 4  # ids 0-3 are the tiny tokenizer's special tokens (<s>, </s>, <pad>, <unk>)


def token_prompt(rng: random.Random, length: int, vocab_size: int = 512) -> list[int]:
    """`length` random token ids (no special tokens): an exact prompt length, and a random first
    block, so two prompts never share a prefix-cache block."""
    return [rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(length)]


WORDS = ("report summary meeting invoice customer policy travel budget schedule draft email "
         "translate search answer ticket approve review quarter team agent").split()


def text_prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


@dataclass
class RequestRecord:
    index: int
    max_tokens: int
    client: int = 0  # closed-loop client number
    start: float = 0.0  # request sent
    first_byte: Optional[float] = None  # first streamed chunk carrying output (TTFT end)
    end: Optional[float] = None  # response complete (or failed)
    status: Optional[int] = None
    error: Optional[str] = None
    prompt_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None
    finish_reason: Optional[str] = None
    # (time, generated tokens so far) per streamed chunk, ascending
    progress: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200

    @property
    def ttft(self) -> Optional[float]:
        return None if self.first_byte is None else self.first_byte - self.start

    @property
    def e2e(self) -> Optional[float]:
        return None if self.end is None else self.end - self.start

    def in_flight(self, t: float) -> bool:
        return self.start <= t and (self.end is None or t < self.end)

    def generated_at(self, t: float) -> int:
        """Tokens the client had received by time t (0 before the first chunk)."""
        if not self.progress or t < self.progress[0][0]:
            return 0
        i = bisect.bisect_right(self.progress, (t, float("inf"))) - 1
        return int(self.progress[i][1])


def completion_body(prompt: Prompt, max_tokens: int, model: str, stream: bool, extra: Optional[dict]) -> dict:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": int(max_tokens),
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if extra:
        body.update(extra)
    return body


def send_completion(
    base_url: str,
    prompt: Prompt,
    max_tokens: int,
    *,
    index: int = 0,
    client: int = 0,
    stream: bool = True,
    model: str = "tiny",
    headers: Optional[dict] = None,
    extra_body: Optional[dict] = None,
    timeout: float = 300.0,
    session: Optional[requests.Session] = None,
) -> RequestRecord:
    """POST one /v1/completions and record its client-side timeline. Never raises for HTTP or
    connection errors: they land in `record.error`."""
    rec = RequestRecord(index=index, max_tokens=int(max_tokens), client=client)
    http = session or requests
    url = base_url.rstrip("/") + "/v1/completions"
    body = completion_body(prompt, max_tokens, model, stream, extra_body)
    rec.start = time.time()
    try:
        with http.post(url, json=body, headers=headers, stream=stream, timeout=timeout) as resp:
            rec.status = resp.status_code
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {resp.text[:300]}"
            elif not stream:
                data = resp.json()
                usage = data.get("usage") or {}
                rec.prompt_tokens = usage.get("prompt_tokens")
                rec.completion_tokens = usage.get("completion_tokens")
                choices = data.get("choices") or [{}]
                rec.finish_reason = choices[0].get("finish_reason")
            else:
                _read_stream(resp, rec)
    except requests.RequestException as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
    except ValueError as exc:  # bad JSON in a body or chunk
        rec.error = f"bad response: {exc}"
    rec.end = time.time()
    return rec


def _read_stream(resp: requests.Response, rec: RequestRecord) -> None:
    for raw in resp.iter_lines(chunk_size=None):
        if not raw:
            continue
        line = raw.decode("utf-8", "replace")
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        chunk = json.loads(payload)
        now = time.time()
        if chunk.get("error"):
            rec.error = f"stream error: {chunk['error']}"
            break
        usage = chunk.get("usage") or {}
        choices = chunk.get("choices") or []
        if choices:
            if rec.first_byte is None:
                rec.first_byte = now
            if choices[0].get("finish_reason"):
                rec.finish_reason = choices[0]["finish_reason"]
        if usage.get("prompt_tokens") is not None:
            rec.prompt_tokens = usage["prompt_tokens"]
        if usage.get("completion_tokens") is not None:
            rec.completion_tokens = usage["completion_tokens"]
            if choices:  # the trailing usage-only chunk repeats the total: no new progress
                rec.progress.append((now, int(usage["completion_tokens"])))


class _Run:
    """Common part of a background load: records, start/join, errors."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.started_at: Optional[float] = None
        self.finished_at: Optional[float] = None

    def _add(self, rec: RequestRecord) -> None:
        with self._lock:
            self.records.append(rec)

    def snapshot(self) -> list[RequestRecord]:
        with self._lock:
            return list(self.records)

    def done(self) -> bool:
        return all(not t.is_alive() for t in self._threads)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until every request has finished, at most `timeout` seconds; whether they have."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self.done()

    def join(self, timeout: Optional[float] = None) -> list[RequestRecord]:
        if not self.wait(timeout):
            raise TimeoutError("load still running after join timeout")
        if self.finished_at is None:
            self.finished_at = time.time()
        return sorted(self.records, key=lambda r: (r.start, r.index))

    def errors(self) -> list[str]:
        return [r.error for r in self.snapshot() if r.error]

    def in_flight(self, t: float) -> list[RequestRecord]:
        return [r for r in self.snapshot() if r.in_flight(t)]


class BatchRun(_Run):
    """N requests with at most `concurrency` in flight (default: all N at once), in the background."""

    def __init__(self, base_url: str, max_tokens: Sequence[int], prompts: Optional[Sequence[Prompt]] = None,
                 concurrency: Optional[int] = None, **send_kwargs) -> None:
        super().__init__()
        self.base_url = base_url
        self.max_tokens = list(max_tokens)
        if prompts is None:
            rng = random.Random(len(self.max_tokens))
            prompts = [text_prompt(rng, rng.randint(5, 60)) for _ in self.max_tokens]
        if len(prompts) != len(self.max_tokens):
            raise ValueError("prompts and max_tokens differ in length")
        self.prompts = list(prompts)
        self.concurrency = concurrency or len(self.max_tokens)
        self.send_kwargs = send_kwargs
        self._next = itertools.count()
        self._go = threading.Event()

    def _worker(self, client: int) -> None:
        self._go.wait()  # every thread is up before the first request goes out: a real burst
        with requests.Session() as session:
            while True:
                with self._lock:
                    i = next(self._next)
                if i >= len(self.max_tokens):
                    return
                self._add(send_completion(self.base_url, self.prompts[i], self.max_tokens[i], index=i,
                                          client=client, session=session, **self.send_kwargs))

    def start(self) -> "BatchRun":
        for c in range(min(self.concurrency, len(self.max_tokens))):
            t = threading.Thread(target=self._worker, args=(c,), daemon=True, name=f"load-{c}")
            self._threads.append(t)
            t.start()
        self.started_at = time.time()
        self._go.set()
        return self


def start_batch(base_url: str, max_tokens: Sequence[int], prompts: Optional[Sequence[Prompt]] = None,
                concurrency: Optional[int] = None, **send_kwargs) -> BatchRun:
    return BatchRun(base_url, max_tokens, prompts, concurrency, **send_kwargs).start()


def run_batch(base_url: str, max_tokens: Sequence[int], prompts: Optional[Sequence[Prompt]] = None,
              concurrency: Optional[int] = None, timeout: float = 600.0, **send_kwargs) -> list[RequestRecord]:
    """Send len(max_tokens) completions, `concurrency` at a time (default all at once); wait for all."""
    return start_batch(base_url, max_tokens, prompts, concurrency, **send_kwargs).join(timeout)


class ClosedLoop(_Run):
    """`clients` threads, each sending its next request as soon as the previous one finished, until
    `duration` seconds have passed (requests in flight then are let finish) or `max_requests` were
    sent. Constant concurrency: the setting where Little's law is checked.

    `max_tokens` is a list cycled through per client (client c starts at offset c), or drawn at
    random per request with `random_lengths=True`; `prompt` is a callable (rng) -> Prompt, default a
    random text of 5-60 words. `stagger` delays client c's first request by a random 0..stagger
    seconds, so the clients do not move in lockstep."""

    def __init__(self, base_url: str, clients: int, duration: float, max_tokens: Sequence[int],
                 prompt: Optional[Callable[[random.Random], Prompt]] = None, max_requests: int = 10_000,
                 seed: int = 0, random_lengths: bool = False, stagger: float = 0.0,
                 **send_kwargs) -> None:
        super().__init__()
        if clients < 1 or duration <= 0 or not max_tokens:
            raise ValueError("need clients >= 1, duration > 0 and at least one max_tokens")
        self.base_url = base_url
        self.clients = clients
        self.duration = duration
        self.max_tokens = list(max_tokens)
        self.prompt = prompt or (lambda rng: text_prompt(rng, rng.randint(5, 60)))
        self.max_requests = max_requests
        self.seed = seed
        self.random_lengths = random_lengths
        self.stagger = stagger
        self.send_kwargs = send_kwargs
        self._counter = itertools.count()
        self._stop = threading.Event()
        self.deadline: Optional[float] = None

    def _worker(self, client: int) -> None:
        rng = random.Random(self.seed * 1000 + client)
        k = client
        if self.stagger > 0 and self._stop.wait(rng.uniform(0, self.stagger)):
            return
        with requests.Session() as session:
            while not self._stop.is_set() and time.time() < self.deadline:
                with self._lock:
                    i = next(self._counter)
                if i >= self.max_requests:
                    return
                if self.random_lengths:
                    mt = rng.choice(self.max_tokens)
                else:
                    mt = self.max_tokens[k % len(self.max_tokens)]
                    k += 1
                self._add(send_completion(self.base_url, self.prompt(rng), mt, index=i, client=client,
                                          session=session, **self.send_kwargs))

    def start(self) -> "ClosedLoop":
        self.started_at = time.time()
        self.deadline = self.started_at + self.duration
        for c in range(self.clients):
            t = threading.Thread(target=self._worker, args=(c,), daemon=True, name=f"closed-{c}")
            self._threads.append(t)
            t.start()
        return self

    def stop(self) -> None:
        """Send no further requests (those in flight finish)."""
        self._stop.set()
