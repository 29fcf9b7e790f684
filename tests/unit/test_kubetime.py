"""Kubernetes time text: formatting and parsing round trips, table-tested."""

import pytest

from edgelet.api.kubetime import format_micro_time, format_time, parse_time


@pytest.mark.parametrize(
    "seconds, text, micro",
    [
        (0, "1970-01-01T00:00:00Z", "1970-01-01T00:00:00.000000Z"),
        (1_798_761_600.75, "2027-01-01T00:00:00Z", "2027-01-01T00:00:00.750000Z"),
        (1_780_000_000, "2026-05-28T20:26:40Z", "2026-05-28T20:26:40.000000Z"),
    ],
)
def test_format(seconds, text, micro):
    assert format_time(seconds) == text
    assert format_micro_time(seconds) == micro
    assert parse_time(text) == int(seconds)


@pytest.mark.parametrize("text", ["", "2026-01-01", "2026-01-01T00:00:00", "not a time"])
def test_parse_rejects_what_is_not_a_time(text):
    with pytest.raises(ValueError):
        parse_time(text)


def test_stamps_of_one_second_share_one_string_and_the_next_second_differs():
    first = format_time(1_780_000_000.1)
    assert format_time(1_780_000_000.9) is first  # statuses and events of one second hold one string
    assert format_time(1_780_000_001) == "2026-05-28T20:26:41Z"
    assert format_time(1_780_000_000.5) == first  # going back a second formats it again, correctly
