from datetime import timedelta

import pytest
from pydantic import ValidationError

from backend.config import Settings, format_duration, parse_duration, settings_problems


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        (90, 90),
        ("90s", 90),
        ("15m", 900),
        ("12h", 43200),
        ("1h30m", 5400),
        ("2d", 172800),
        (" 5M ", 300),
    ],
)
def test_durations_are_read_as_people_write_them(text: object, seconds: int) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "h", "12x", "1h30", "abc", True, None, [1]])
def test_a_malformed_duration_says_what_is_expected(text: object) -> None:
    with pytest.raises(ValueError, match="must be a duration such as 30s, 15m, 12h or 1h30m"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["-5h", -1])
def test_a_negative_duration_is_refused(text: object) -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(43200, "12h"), (5400, "1h30m"), (45, "45s"), (0, "0s"), (90061, "1d1h1m1s")],
)
def test_durations_are_written_in_their_shortest_form(seconds: int, text: str) -> None:
    assert format_duration(timedelta(seconds=seconds)) == text


def test_every_setting_is_an_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASTRAEUS_DATABASE_URL", "postgresql://db.example/astraeus")
    monkeypatch.setenv("ASTRAEUS_PORT", "9000")
    monkeypatch.setenv("ASTRAEUS_LEASE_TIME", "2m")
    settings = Settings()
    assert settings.resolved_database_url == "postgresql://db.example/astraeus"
    assert settings.port == 9000
    assert settings.lease_time == timedelta(minutes=2)
    assert not settings.is_embedded
    assert not settings.should_migrate_on_start


def test_the_embedded_default_is_sqlite_in_the_data_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.delenv("ASTRAEUS_DATABASE_URL", raising=False)
    monkeypatch.setenv("ASTRAEUS_DATA_DIR", str(tmp_path))
    settings = Settings()
    assert settings.resolved_database_url == f"sqlite:///{tmp_path}/astraeus.db"
    assert settings.is_embedded
    assert settings.should_migrate_on_start


def test_leases_must_be_checked_more_often_than_every_half_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a check that finds the previous one over half a lease ago renews every lease (the
    # database was away): a slower scheduling pass would never let a lease expire
    monkeypatch.setenv("ASTRAEUS_LEASE_TIME", "8s")
    monkeypatch.setenv("ASTRAEUS_SCHEDULER_INTERVAL", "4s")
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert settings_problems(refused.value) == [
        "ASTRAEUS_SCHEDULER_INTERVAL must be under half of ASTRAEUS_LEASE_TIME "
        "(4s is not under half of 8s)"
    ]
    monkeypatch.setenv("ASTRAEUS_SCHEDULER_INTERVAL", "3s")
    assert Settings().scheduler_interval == timedelta(seconds=3)


def test_a_refused_setting_is_named_by_its_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ASTRAEUS_LEASE_TIME", "soon")
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert settings_problems(refused.value) == [
        "ASTRAEUS_LEASE_TIME: must be a duration such as 30s, 15m, 12h or 1h30m"
    ]


def test_the_webhook_allow_list_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().webhook_allow == ()
    monkeypatch.setenv("ASTRAEUS_WEBHOOK_ALLOW", "10.20.0.0/16, 127.0.0.1,fd00::/8")
    assert [str(n) for n in Settings().webhook_allow] == [
        "10.20.0.0/16",
        "127.0.0.1/32",
        "fd00::/8",
    ]
    monkeypatch.setenv("ASTRAEUS_WEBHOOK_ALLOW", "10.1.2.3/8")
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert settings_problems(refused.value) == [
        "ASTRAEUS_WEBHOOK_ALLOW: '10.1.2.3/8' is not a network such as 10.0.0.0/8: "
        "10.1.2.3/8 has host bits set"
    ]


def test_the_cli_finds_the_embedded_servers_token_where_the_server_keeps_it() -> None:
    # astra imports nothing of the server (import contract), so it writes the default itself.
    from backend.cli.astra.client import EMBEDDED_DATA_DIR
    from backend.config import default_data_dir

    assert default_data_dir() == EMBEDDED_DATA_DIR
