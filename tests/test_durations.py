"""One duration grammar (trajstore/durations.py) for every flag, setting and option that takes a duration: the same
text means the same time wherever it is given, text needs its unit (but in a setting named ``…_S`` and an object
store timeout, whose unit is seconds), and the same mistake is refused naming the flag, setting or key."""

from __future__ import annotations

from datetime import timedelta

import pytest

from trajstore.api.settings import ServiceSettings
from trajstore.cli import parser
from trajstore.durations import seconds, text
from trajstore.errors import InputError
from trajstore.operations.vacuum import parse_duration
from trajstore.settings import Settings
from trajstore.storage.location import limits_of

GIVEN = [("500ms", 0.5), ("90s", 90.0), ("30m", 1800.0), ("1.5h", 5400.0), ("7d", 604800.0), ("2w", 1209600.0),
         ("3 sec", 3.0), ("2min", 120.0)]


@pytest.mark.parametrize("given, want", GIVEN)
def test_the_same_text_is_the_same_time_everywhere(given: str, want: float) -> None:
    assert seconds(given) == want
    assert parse_duration(given) == want  # vacuum(older_than=…)
    assert parser.duration(given) == want  # --older-than
    assert ServiceSettings.from_env({"TRAJSTORE_SQL_TIMEOUT_S": given}).sql_timeout_s == want  # TRAJSTORE_*_S
    assert Settings.from_env({"TRAJSTORE_S3_TIMEOUT_S": given}).s3_timeout_s == want
    assert ServiceSettings.from_env({"TRAJSTORE_COMMIT_INTERVAL": given}).commit_interval == want  # serve's interval
    assert limits_of({"timeout": given}, Settings()).timeout_s == want  # storage_options timeout


def test_numbers_and_timedeltas_are_seconds() -> None:
    assert seconds(12) == 12.0 and seconds(0.25) == 0.25 and seconds(timedelta(hours=2)) == 7200.0
    assert parse_duration(90) == 90.0 and limits_of({"timeout": 2}, Settings()).timeout_s == 2.0


def test_text_needs_its_unit_where_seconds_are_not_the_named_unit() -> None:
    """``--older-than 60`` meant minutes once: a deletion refuses to guess; a setting named ``…_S`` is seconds."""
    with pytest.raises(InputError, match="older_than: expected a duration such as 7d"):
        parse_duration("60")
    assert Settings.from_env({"TRAJSTORE_S3_TIMEOUT_S": "5"}).s3_timeout_s == 5.0
    assert limits_of({"timeout": "5"}, Settings()).timeout_s == 5.0  # a timeout's unit: seconds, as always


@pytest.mark.parametrize("value", [604800.0, 5400.0, 90.0, 0.5, 0.0, 86400.0 * 3])
def test_text_reads_back_as_the_same_time(value: float) -> None:
    assert seconds(text(value)) == value


@pytest.mark.parametrize("bad", ["a week", "7 days", "-1s", "", "1e3s", "s", "-5"])
def test_a_mistake_names_where_it_was_given(bad: str) -> None:
    with pytest.raises(InputError, match="older_than: "):
        parse_duration(bad)
    with pytest.raises(InputError, match="TRAJSTORE_S3_TIMEOUT_S: "):
        Settings.from_env({"TRAJSTORE_S3_TIMEOUT_S": bad})
    with pytest.raises(InputError, match="TRAJSTORE_COMMIT_INTERVAL: "):
        ServiceSettings.from_env({"TRAJSTORE_COMMIT_INTERVAL": bad})
    with pytest.raises(InputError, match="storage_options: connect_timeout: "):
        limits_of({"connect_timeout": bad}, Settings())
    with pytest.raises(Exception, match="expected a duration such as 7d"):
        parser.duration(bad)


def test_a_timeout_must_be_longer_than_nothing() -> None:
    assert parse_duration("0s") == 0.0  # vacuum: keep nothing older than now
    with pytest.raises(InputError, match=r"storage_options: timeout: must be a duration > 0s"):
        limits_of({"timeout": "0s"}, Settings())
