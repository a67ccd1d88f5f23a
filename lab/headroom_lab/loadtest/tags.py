"""What the load test adds to each request so a gateway can attribute it: request-body `metadata`
(LiteLLM reads `metadata.<key>`, e.g. with `custom_prometheus_metadata_labels: ["metadata.task_type"]`)
and HTTP headers (Envoy AI Gateway `metricsRequestHeaderAttributes`, llm-d
`x-llm-d-inference-fairness-id`, a gateway's own key header).

Values may name the call's task with placeholders, filled per call:
  {task_type}  the task type of the mix        {task}     the task id, "<session>-<number>"
  {session}    the session number              {call}     the call's index within its task
e.g. `--metadata task_type={task_type} --metadata session_id={task}` or `--header 'agent-session-id: {task}'`.

A header or metadata key whose name looks like a credential (the family of `_SECRET_NAME`: *auth*,
*key*, *token*, *secret*, cookie, password, *jwt*, *assertion*, *signature*, sig, hmac, bearer, cert,
private) is a secret: its value is sent verbatim and never printed, logged or written to the report.
"""
from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from typing import Any

PLACEHOLDERS = ("task_type", "task", "session", "call")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110)
# A credential by its name's family, not a list of names: authentication (Authorization,
# Proxy-Authorization), keys and tokens (X-Api-Key, apikey, X-Access-Token, user_api_key), secrets,
# cookies, passwords (passphrase, pwd), signed assertions (X-Jwt-Assertion, SAML), signatures and
# MACs (Signature, X-Amz-Signature, X-Hub-Sig, X-Hmac), bearer values, certificates, private values.
_SECRET_NAME = re.compile(r"auth|key|token|secret|cookie|pass|pwd|credential|jwt|assert|signature|hmac|bearer|"
                          r"cert|private|(?:^|[-_.])sig(?:$|[-_.])", re.IGNORECASE)
REDACTED = "<redacted>"


def _check_template(value: str, what: str) -> str:
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
    except ValueError as exc:
        raise ValueError(f"{what}: {exc} (write {{{{ and }}}} for literal braces)") from None
    bad = [f for f in fields if f not in PLACEHOLDERS]
    if bad:
        raise ValueError(f"{what}: unknown placeholder {{{bad[0]}}}; known: "
                         + ", ".join("{" + p + "}" for p in PLACEHOLDERS))
    return value


def is_secret(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def parse_metadata(items: list[str]) -> dict[str, str]:
    """`--metadata key=value` items -> {key: value template}; a credential-like key's value is
    taken verbatim (no template), never shown."""
    out: dict[str, str] = {}
    for item in items:
        k, sep, v = item.partition("=")
        k = k.strip()
        if not sep or not k:
            raise ValueError(f"--metadata {item!r}: expected key=value (e.g. task_type={{task_type}})")
        if k in out:
            raise ValueError(f"--metadata {k}: given twice")
        out[k] = v if is_secret(k) else _check_template(v, f"--metadata {k}")
    return out


def parse_headers(items: list[str]) -> dict[str, str]:
    """`--header 'Name: value'` items -> {name: value template}; the value of a credential-like
    header never appears in an error."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not _HEADER_NAME.match(name):
            shown = name if _HEADER_NAME.match(name) else "the header"
            raise ValueError(f"--header {shown}: expected 'Name: value' with an HTTP header name")
        if any(c in value for c in "\r\n\0"):
            raise ValueError(f"--header {name}: the value holds a line break or NUL")
        if name.lower() in (n.lower() for n in out):
            raise ValueError(f"--header {name}: given twice")
        out[name] = value if is_secret(name) else _check_template(value, f"--header {name}")
    return out


@dataclass(frozen=True)
class Tags:
    metadata: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def secrets(self) -> tuple[str, ...]:
        """The values of credential-like headers and metadata keys (cut out of every error text)."""
        return tuple(v for table in (self.metadata, self.headers) for k, v in table.items() if is_secret(k) and v)

    def shown(self) -> dict[str, Any]:
        """For the report: metadata and headers as given, the values of credential-like names redacted."""
        return {"metadata": {k: (REDACTED if is_secret(k) else v) for k, v in self.metadata.items()},
                "headers": {k: (REDACTED if is_secret(k) else v) for k, v in self.headers.items()}}

    def for_call(self, task_type: str, task: str, session: int, call: int) -> tuple[dict, dict]:
        """(metadata, headers) of one call, placeholders filled (credential headers sent verbatim)."""
        values = {"task_type": task_type, "task": task, "session": session, "call": call}
        meta = {k: (v if is_secret(k) else v.format(**values)) for k, v in self.metadata.items()}
        heads = {k: (v if is_secret(k) else v.format(**values)) for k, v in self.headers.items()}
        return meta, heads
