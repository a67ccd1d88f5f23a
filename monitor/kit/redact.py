"""Text from elsewhere made fit for a log line, a page or the API (issue 38).

- `redact_urls(text)`: every `scheme://user:password@host` in free text loses its user information
  (`scheme://***@host`), whatever else the text says (an argument echoed back, an error message).
- `scrub(text, secrets)`: upstream text (an error body, a warning) capped to `limit` characters and
  with each configured secret (a token, a password, a tenant header's value) replaced wherever it
  appears, also base64-encoded as in a Basic header; control characters are escaped, so one line
  stays one line. A 30 MB error became a 30 MB log line per refit, and a server echoing its request
  put the tenant and the token in the log and the snapshot.
"""
from __future__ import annotations

import base64
import re
from typing import Iterable, Optional

UPSTREAM_LIMIT = 512  # characters of upstream text kept in a log line or a source's detail
MASK = "***"

_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@?#]*@")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def redact_urls(text: str) -> str:
    """`text` with the user information of every URL in it masked."""
    return _USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)


def scrub(text: object, secrets: Iterable[Optional[str]] = (), limit: int = UPSTREAM_LIMIT) -> str:
    """Upstream `text` fit for a log line: secrets masked, URLs' user information masked, control
    characters escaped, at most `limit` characters (and how many more there were)."""
    raw = text if isinstance(text, str) else str(text)
    forms = sorted({f for s in secrets if s for f in (s, base64.b64encode(s.encode()).decode())}, key=len, reverse=True)
    longest = len(forms[0]) if forms else 0
    window = limit * 4 + longest  # more than is kept: masks shorten the text
    head = raw[:window]
    for form in forms:
        head = head.replace(form, MASK)
    if len(raw) > window and longest:
        head = head[:-longest]  # a secret cut in two at the window's end is not shown in part
    head = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", redact_urls(head))
    if len(head) > limit or len(raw) > window:
        return head[:limit] + f"... ({len(raw)} characters)"
    return head
