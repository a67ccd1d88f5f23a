"""The load test's --metadata / --header parsing and the printed summary (rounded figures; an
unconfident knee fit is printed as not found). Unit tests, hand-made inputs."""
from __future__ import annotations

import pytest

from headroom_lab.commands.loadtest import summary
from headroom_lab.loadtest.analyze import KNEE_MIN_CONFIDENCE
from headroom_lab.loadtest.client import _scrub
from headroom_lab.loadtest.tags import Tags, parse_headers, parse_metadata
from monitor.commands import cli


def test_metadata_and_headers_parse_and_fill_per_call():
    tags = Tags(parse_metadata(["task_type={task_type}", "session_id=s-{session}-{task}", "k=a=b"]),
                parse_headers(["agent-session-id: {task}", "X-Api-Key: abc{def}", "x-call: {call}"]))
    meta, heads = tags.for_call("email", "3-1", 3, 0)
    assert meta == {"task_type": "email", "session_id": "s-3-3-1", "k": "a=b"}
    assert heads == {"agent-session-id": "3-1", "X-Api-Key": "abc{def}", "x-call": "0"}  # a key is sent verbatim
    assert tags.secrets() == ("abc{def}",)
    assert tags.shown()["headers"] == {"agent-session-id": "{task}", "X-Api-Key": "<redacted>", "x-call": "{call}"}


@pytest.mark.parametrize("items, problem", [
    (["novalue"], "--metadata 'novalue': expected key=value"),
    (["=x"], "expected key=value"),
    (["a={user}"], "--metadata a: unknown placeholder {user}"),
    (["a=x", "a=y"], "--metadata a: given twice"),
    (["a={task"], "--metadata a:"),
])
def test_bad_metadata_names_the_item(items, problem):
    with pytest.raises(ValueError) as exc:
        parse_metadata(items)
    assert problem in str(exc.value)


def test_bad_headers_never_echo_a_credential():
    with pytest.raises(ValueError, match="expected 'Name: value'"):
        parse_headers(["no colon here"])
    with pytest.raises(ValueError, match="--header X-A: given twice"):
        parse_headers(["x-a: 1", "X-A: 2"])
    with pytest.raises(ValueError) as exc:
        parse_headers(["Authorization: Bearer sk-1\r\nX: y"])
    assert "line break" in str(exc.value) and "sk-1" not in str(exc.value)
    with pytest.raises(ValueError, match="unknown placeholder"):
        parse_headers(["x-task: {nope}"])


def test_scrub_removes_every_secret():
    assert _scrub("HTTP 401: bad key sk-1 and tok-2", ("sk-1", "tok-2")) == "HTTP 401: bad key <redacted> and <redacted>"
    assert _scrub("sk-1", "sk-1") == "<redacted>"
    # a secret across the 300-character cut is redacted before the cut, not half kept
    cut = _scrub("x" * 290 + "Bearer sk-0123456789abcdef", ("Bearer sk-0123456789abcdef",))
    assert "sk-" not in cut and "0123" not in cut and cut.endswith("<redacted>")
    # the header value is "Bearer TOKEN": a body echoing the bare token is redacted too
    assert _scrub("invalid token sk-abc", ("Bearer sk-abc",)) == "invalid token <redacted>"


def _rep(knee, fit, agreement=None):
    return {"counts": {"calls": 40, "succeeded": 39, "failed": 1, "timed_out": 0, "tasks": 20, "tasks_completed": 19},
            "knee": knee, "knee_fit": fit, "usable_capacity": {"concurrency": 7.04999, "calls_per_second": 3.14159},
            "operating_point": {"concurrency": 5.6399999, "basis": "knee", "margin": 0.2}, "agreement": agreement}


def test_an_unconfident_knee_fit_is_printed_as_not_found():
    fit = {"concurrency": 9.87654, "confidence": 0.3123}
    lines = summary(_rep(None, fit))
    assert lines[1] == (f"knee: not found (confidence 0.31 < {KNEE_MIN_CONFIDENCE:.2f}; the fit at 9.9 calls in "
                        f"flight is not used)")
    assert summary(_rep(None, None))[1] == "knee: not found (too few load levels to fit)"
    assert summary(_rep(fit | {"confidence": 0.8765}, fit | {"confidence": 0.8765}))[1] == \
        "knee: 9.9 calls in flight (confidence 0.88)"


def test_figures_are_rounded():
    agreement = {"succeeded": {"client": 39, "server": 39}, "queue_mean_seconds": {"client_estimate": 0.0123456,
                                                                                  "server": 2.2e-05}}
    lines = summary(_rep(None, None, agreement))
    assert lines[2] == "usable capacity at the SLO: 7.0 calls in flight, 3.14 calls/s"
    assert lines[3] == "recommended operating point: 5.6 calls in flight (knee, margin 20%)"
    assert lines[4] == "client vs server: succeeded 39 vs 39; mean queue 0.012 vs 2.2e-05 s"


def test_an_authorization_header_and_an_api_key_together_are_refused(tmp_path, capsys):
    mix = tmp_path / "mix.yaml"
    mix.write_text("task_types:\n  q: {tasks_per_second: 1, calls_per_task: 1, prompt_tokens: {mean: 10}, output_tokens: {mean: 4}}\n")
    key = tmp_path / "key"
    key.write_text("sk-file\n")
    rc = cli.main(["loadtest", "--target", "http://127.0.0.1:9", "--mix", str(mix), "--duration", "1s",
                   "--api-key-file", str(key), "--header", "Authorization: Bearer sk-header"])
    err = capsys.readouterr().err
    assert rc == 2 and "not both" in err and "sk-header" not in err and "sk-file" not in err


def test_the_html_report_says_an_unconfident_knee_was_not_used_and_what_each_request_carried():
    from test_loadtest_units import synthetic_run  # the synthetic run of the report's unit tests

    from headroom_lab.loadtest.analyze import analyze
    from headroom_lab.loadtest.report import render_html

    mix, plan, res = synthetic_run(knee=6)
    tags = Tags(parse_metadata(["task_type={task_type}"]), parse_headers(["Authorization: Bearer sk-9"]))
    rep = analyze(mix, plan, res, {"targets": ["http://h:1"], "seed": 1, "api_key": "none", **tags.shown()})
    rep["knee_fit"] = {**rep["knee_fit"], "confidence": 0.2}
    rep["knee"] = None
    page = render_html(rep, {})
    assert f"not found (confidence 0.20 &lt; {KNEE_MIN_CONFIDENCE:.2f}; the fit at" in page
    assert "metadata task_type={task_type}; header Authorization: &lt;redacted&gt;" in page
    assert "sk-9" not in page


@pytest.mark.parametrize("name", ["X-Jwt-Assertion", "Signature", "X-Amz-Signature", "X-Hub-Sig", "X-Hmac",
                                  "Proxy-Authorization", "X-Goog-Api-Key", "apikey", "X-Access-Token",
                                  "X-Client-Cert", "X-Bearer", "X-Passphrase", "X-Pwd", "X-Private-Id"])
def test_credential_like_headers_are_redacted_by_the_family_rule(name):
    tags = Tags({}, parse_headers([f"{name}: s3cr3t", "agent-session-id: {task}"]))
    assert tags.shown()["headers"] == {name: "<redacted>", "agent-session-id": "{task}"}
    assert tags.secrets() == ("s3cr3t",)


@pytest.mark.parametrize("key", ["user_api_key", "litellm_token", "jwt", "client_secret", "password"])
def test_credential_like_metadata_keys_are_redacted_and_sent_verbatim(key):
    tags = Tags(parse_metadata([f"{key}=sk-{{x}}1", "task_type={task_type}"]), {})
    assert tags.shown()["metadata"] == {key: "<redacted>", "task_type": "{task_type}"}
    assert tags.secrets() == ("sk-{x}1",)  # scrubbed from error texts too
    meta, _ = tags.for_call("email", "3-1", 3, 0)
    assert meta == {key: "sk-{x}1", "task_type": "email"}  # a credential is never a template
    assert _scrub("HTTP 401: bad key sk-{x}1", tags.secrets()) == "HTTP 401: bad key <redacted>"


def test_ordinary_tags_are_not_secrets():
    tags = Tags(parse_metadata(["task_type={task_type}", "session_id={task}"]),
                parse_headers(["agent-session-id: {task}", "x-llm-d-inference-fairness-id: {session}"]))
    assert tags.secrets() == () and "<redacted>" not in str(tags.shown())
