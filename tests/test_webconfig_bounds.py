"""Bounds of the web-config file that protect start-up and the workers: a bcrypt cost too high to
check in time is refused at start-up, naming the user, before anything is hashed."""
import bcrypt
import pytest

from monitor.config import ConfigError
from monitor.export import webconfig
from monitor.export.webconfig import MAX_BCRYPT_COST, basic_auth

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
