"""Bounds of the web-config file that protect start-up and the workers: a bcrypt cost too high to
check in time is refused at start-up, naming the user, before anything is hashed."""
import bcrypt
import pytest

from monitor.config import ConfigError
from monitor.kit.web import webconfig
from monitor.kit.web.webconfig import MAX_BCRYPT_COST, basic_auth

SALT_AND_HASH = "R9h/cIPz0gi.URNNX3kh2OPST9/PgBkqquzi.Ss7KIUgO2t0jWMUW"  # 53 characters


@pytest.mark.parametrize("cost", [MAX_BCRYPT_COST + 1, 20, 31])
def test_a_bcrypt_cost_above_the_bound_is_refused_before_any_hashing(cost, monkeypatch):
    hashed_calls = []
    monkeypatch.setattr(bcrypt, "checkpw", lambda *a: hashed_calls.append(a) or False)
    monkeypatch.setattr(bcrypt, "hashpw", lambda *a: hashed_calls.append(a) or b"")
    users = {"alice": f"$2b$04${SALT_AND_HASH}", "prom": f"$2y${cost:02d}${SALT_AND_HASH}"}
    with pytest.raises(ConfigError) as err:
        basic_auth("/etc/headroom/web.yml", users)
    assert str(err.value).startswith(f"/etc/headroom/web.yml: basic_auth_users.prom: bcrypt cost {cost} is above "
                                     f"{MAX_BCRYPT_COST}")
    assert SALT_AND_HASH not in str(err.value)
    assert hashed_calls == [(b"x", f"$2b$04${SALT_AND_HASH}".encode())]  # alice's (cost 4) check only


def test_a_hash_within_the_bound_checks_passwords():
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    authorize = basic_auth("web.yml", {"prom": hashed})
    assert webconfig.MAX_BCRYPT_COST == 14
    assert not authorize("Basic cHJvbTp3cm9uZw==")  # prom:wrong
    assert authorize("Basic cHJvbTpwdw==")  # prom:pw


def test_a_good_credential_is_remembered_while_used_and_forgotten_when_idle(monkeypatch):
    from monitor.kit.web.auth import CACHE_SECONDS, BasicAuth
    now = [1000.0]
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))
    auth = BasicAuth({"prom": hashed}, bcrypt.hashpw(b"dummy", bcrypt.gensalt(rounds=4)), clock=lambda: now[0])
    checks = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, h: checks.append(h) or real(pw, h))
    good, wrong = "Basic cHJvbTpwdw==", "Basic cHJvbTp3cm9uZw=="
    assert not auth.known(good) and auth(good) and auth.known(good)
    for _ in range(5):  # scraped every 60 s: never checked again
        now[0] += 60.0
        assert auth(good)
    assert not auth(wrong) and not auth(wrong) and not auth.known(wrong)  # failures are never remembered
    assert len(checks) == 3
    now[0] += CACHE_SECONDS + 1  # unused past the cache time: checked again
    assert not auth.known(good) and auth(good) and len(checks) == 4


def test_each_client_address_gets_a_few_checks_then_one_every_two_seconds():
    from monitor.kit.web.auth import BURST, PER_SECOND, CheckThrottle
    now = [0.0]
    throttle = CheckThrottle(clock=lambda: now[0])
    assert [throttle.take("10.0.0.1") for _ in range(BURST + 2)] == [True] * BURST + [False, False]
    assert throttle.take("10.0.0.2")  # another address has its own checks
    now[0] += 1.0 / PER_SECOND
    assert throttle.take("10.0.0.1") and not throttle.take("10.0.0.1")
    throttle.give_back("10.0.0.1")  # a check that passed gives its token back
    assert throttle.take("10.0.0.1")
    small = CheckThrottle(max_clients=3, clock=lambda: now[0])
    for i in range(10):
        small.take(f"10.0.1.{i}")
    assert len(small._buckets) <= 3  # a bounded table, whatever the number of addresses


@pytest.mark.live  # starts `headroom run`
def test_the_daemon_refuses_a_cost_31_hash_at_once(tmp_path):
    import subprocess
    import sys
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prom: '$2b$31${SALT_AND_HASH}'\n")
    cfg = tmp_path / "headroom.yml"
    cfg.write_text("sources:\n  vllm:\n    targets: ['http://127.0.0.1:1/metrics']\n")
    # before the bound, start-up hashed once at cost 31 (over an hour) and did not hear SIGTERM
    done = subprocess.run([sys.executable, "-m", "monitor", "run", "--config.file", str(cfg),
                           "--web.config.file", str(web), "--web.listen-address", "127.0.0.1:0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"headroom: {web}: basic_auth_users.prom: bcrypt cost 31 is above 14, the most a "
                                   f"check can do in time (each step doubles it; start-up and every new login would "
                                   f"wait); hash the password again with a cost of 14 or less (htpasswd -B -C 12)")
