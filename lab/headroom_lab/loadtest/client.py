"""One streamed model call against an OpenAI-compatible endpoint, timed at the client.

Time to first token (TTFT) ends at the first streamed chunk that carries a choice (vLLM sends the
first one when the first token is out; for chat that chunk may only carry the role). Usage comes
from the final chunk (`stream_options.include_usage`). The API key goes in the Authorization header
only; it is never put in a record, an error text or a log line; nor are the values of credential
headers given with --header (headroom_lab/loadtest/tags.py).
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from typing import Optional, Union
from urllib.parse import urlparse

import requests

WORDS = ("report summary meeting invoice customer policy travel budget schedule draft email translate "
         "search answer ticket approve review quarter team agent leave shipment finance notes action "
         "items capacity tool calls waits writes handbook staff reply room Thursday French").split()


class TargetError(ValueError):
    pass


def api_base(url: str) -> str:
    """`http://host:port[/prefix][/v1]` -> the base that /completions and /chat/completions hang off."""
    u = urlparse(url) if isinstance(url, str) else None
    if u is None or u.scheme not in ("http", "https") or not u.netloc:
        raise TargetError(f"--target must be an http(s) URL like http://127.0.0.1:8000, got {url!r}")
    if u.username or u.password:
        raise TargetError("--target must not carry credentials in the URL; use --api-key-file or --api-key-env")
    if u.query or u.fragment:
        raise TargetError(f"--target must be a base URL without query or fragment, got {url!r}")
    path = u.path.rstrip("/")
    for suffix in ("/chat/completions", "/completions"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
    if not path.endswith("/v1"):
        path += "/v1"
    return f"{u.scheme}://{u.netloc}{path}"


def make_prompt(mode: str, tokens: int, seed: int, id_range: tuple[int, int]):
    rng = random.Random(seed)
    if mode == "token_ids":
        return [rng.randrange(id_range[0], id_range[1]) for _ in range(tokens)]
    return " ".join(rng.choice(WORDS) for _ in range(tokens))


@dataclass
class CallRecord:
    session: int
    task: str  # "<session>-<number>"
    task_type: str
    klass: str
    call: int  # index of the call within its task
    attempt: int  # 0 = first try
    target: int  # index into the run's targets
    api: str
    planned_prompt_tokens: int
    planned_output_tokens: int
    start: float = 0.0  # epoch seconds (same clock as metric readings)
    first_token: Optional[float] = None
    end: Optional[float] = None
    status: Optional[int] = None
    error: Optional[str] = None  # reason: timeout, connect, http_4xx, http_5xx, http_429, stream
    detail: Optional[str] = None
    prompt_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None
    chunks: int = 0
    in_flight: int = 0  # calls of this run in flight when it was sent, itself included
    batch_active: bool = False  # a batch-class call was in flight when it was sent
    phase: str = "load"  # "probe" for the unloaded baseline calls
    priority: Optional[int] = None  # the engine priority sent in the body (None: none sent)

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200

    @property
    def ttft(self) -> Optional[float]:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def e2e(self) -> Optional[float]:
        return None if self.end is None else self.end - self.start

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["ttft"], d["e2e"] = self.ttft, self.e2e
        return d


@dataclass
class CallSpec:
    base: str
    api: str
    model: str
    prompt: object
    max_tokens: int
    timeout: float
    ignore_eos: bool = False
    temperature: float = 0.0
    headers: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)  # request-body `metadata` (LiteLLM), omitted when empty
    priority: Optional[int] = None  # request-body `priority` (vLLM, SGLang), omitted when None


def _scrub(text: str, secret: Union[None, str, tuple[str, ...]]) -> str:
    """At most 300 characters with every secret (the API key, credential header values) cut out."""
    for s in ((secret,) if isinstance(secret, str) else (secret or ())):
        if s:
            text = text.replace(s, "<redacted>")
            token = s.split()[-1] if s.split() else ""
            if token and token != s:  # "Bearer sk-...": a body echoing the bare token is cut too
                text = text.replace(token, "<redacted>")
    return text[:300]


def retryable(rec: CallRecord) -> bool:
    return rec.error in ("timeout", "connect", "http_5xx", "http_429", "stream")


def stream_call(http: requests.Session, spec: CallSpec, rec: CallRecord,
                secret: Union[None, str, tuple[str, ...]] = None,
                clock=time.time) -> CallRecord:
    """Send one streamed request; fills rec's times, status, usage and error reason."""
    if spec.api == "chat":
        url = spec.base + "/chat/completions"
        body = {"model": spec.model, "messages": [{"role": "user", "content": spec.prompt}]}
    else:
        url = spec.base + "/completions"
        body = {"model": spec.model, "prompt": spec.prompt}
    body.update({"max_tokens": spec.max_tokens, "stream": True, "temperature": spec.temperature,
                 "stream_options": {"include_usage": True}})
    if spec.ignore_eos:
        body["ignore_eos"] = True
    if spec.metadata:
        body["metadata"] = dict(spec.metadata)
    if spec.priority is not None:
        body["priority"] = int(spec.priority)
    deadline_s = spec.timeout
    rec.start = clock()
    resp = None
    try:
        resp = http.post(url, json=body, headers=spec.headers, stream=True,
                         timeout=(min(5.0, deadline_s), deadline_s))
        rec.status = resp.status_code
        if resp.status_code != 200:
            code = resp.status_code
            rec.error = "http_429" if code == 429 else ("http_5xx" if code >= 500 else "http_4xx")
            rec.detail = _scrub(f"HTTP {code}: {resp.text}", secret)
            return rec
        for line in resp.iter_lines(chunk_size=None, decode_unicode=False):
            now = clock()
            if now - rec.start > deadline_s:
                rec.error, rec.detail = "timeout", f"no complete answer within {deadline_s:g} s"
                return rec
            if not line or not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                rec.error, rec.detail = "stream", _scrub(f"unparsable chunk: {data[:80]!r}", secret)
                return rec
            if "error" in chunk and not chunk.get("choices"):
                rec.error, rec.detail = "stream", _scrub(f"error in stream: {chunk['error']}", secret)
                return rec
            rec.chunks += 1
            if chunk.get("choices") and rec.first_token is None:
                rec.first_token = now
            usage = chunk.get("usage")
            if usage:
                rec.prompt_tokens = usage.get("prompt_tokens", rec.prompt_tokens)
                rec.completion_tokens = usage.get("completion_tokens", rec.completion_tokens)
        else:
            pass
        if rec.first_token is None:
            rec.error, rec.detail = "stream", "stream ended without any output"
    except requests.exceptions.ConnectionError as exc:
        if rec.status is None:
            rec.error, rec.detail = "connect", _scrub(f"{type(exc).__name__}", secret)
        else:
            rec.error, rec.detail = "stream", _scrub(f"connection lost mid-stream: {type(exc).__name__}", secret)
    except requests.exceptions.Timeout:
        rec.error, rec.detail = "timeout", f"no answer within {deadline_s:g} s"
    except requests.exceptions.RequestException as exc:
        rec.error, rec.detail = "connect", _scrub(type(exc).__name__, secret)
    finally:
        rec.end = clock()
        if resp is not None:
            resp.close()
    return rec
