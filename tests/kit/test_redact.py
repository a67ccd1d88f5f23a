"""Upstream text made fit for a log line (monitor/kit/redact.py): capped, secrets and URL passwords masked."""
import base64

from monitor.kit.redact import UPSTREAM_LIMIT, redact_urls, scrub

TOKEN, TENANT = "tok-8d2f0a9b", "acme-tenant"


def test_secrets_are_masked_wherever_they_appear_also_base64():
    basic = base64.b64encode(TOKEN.encode()).decode()
    text = f"denied: X-Scope-OrgID={TENANT} Authorization: Bearer {TOKEN} basic {basic}\nsecond line"
    out = scrub(text, [TOKEN, TENANT, None, ""])
    assert TOKEN not in out and TENANT not in out and basic not in out
    assert out == "denied: X-Scope-OrgID=*** Authorization: Bearer *** basic ***\\x0asecond line"


def test_upstream_text_is_capped_and_a_secret_cut_at_the_cap_is_not_shown_in_part():
    huge = "y" * 30_000_000
    out = scrub(huge, [TOKEN])
    assert len(out) < UPSTREAM_LIMIT + 40 and out.endswith("... (30000000 characters)")
    for shift in range(len(TOKEN)):  # a secret at every offset around the window's end
        text = "z" * (UPSTREAM_LIMIT * 4 + shift) + TOKEN * 3 + "tail" * 1000
        out = scrub(text, [TOKEN])
        assert TOKEN[:6] not in out
    repeated = scrub(TOKEN * 1000, [TOKEN])  # masks shorten the text: still no part of a secret
    assert TOKEN[:4] not in repeated and len(repeated) <= UPSTREAM_LIMIT + 40


def test_every_url_loses_its_user_information():
    text = "from http://user:pw@prom:9090/api and HTTPS://only-user@h/x, keep https://h/?q=a@b"
    assert redact_urls(text) == "from http://***@prom:9090/api and HTTPS://***@h/x, keep https://h/?q=a@b"
