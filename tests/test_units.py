"""Quantity parsing: bits vs bytes, binary vs decimal prefixes, time units, wrong kinds."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conduit.errors import UnitError
from conduit.units import UNITS, Kind, format_quantity, kind_of_field, parse_quantity


@pytest.mark.parametrize(
    ("text", "kind", "expected"),
    [
        ("25 GB/s", "bandwidth", 25e9),
        ("400 Gb/s", "bandwidth", 50e9),
        ("400 Gbps", "bandwidth", 50e9),
        ("100 Gbit/s", "bandwidth", 12.5e9),
        ("1 GiB/s", "bandwidth", 2**30),
        ("80 GiB", "bytes", 80 * 2**30),
        ("80 GB", "bytes", 80e9),
        ("3.84 TB", "bytes", 3.84e12),
        ("2 TiB", "bytes", 2 * 2**40),
        ("2 us", "time", 2e-6),
        ("2 µs", "time", 2e-6),
        ("500 ns", "time", 5e-7),
        ("1.5 ms", "time", 1.5e-3),
        ("3 s", "time", 3.0),
        ("1e9", "bandwidth", 1e9),
        (12, "bytes", 12.0),
        (0.5, "time", 0.5),
    ],
)
def test_parse_known_quantities(text, kind, expected):
    assert parse_quantity(text, kind) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "kind", "fragment"),
    [
        ("80 GiB", "bandwidth", "bytes quantity, expected bandwidth"),
        ("25 GB/s", "bytes", "bandwidth quantity, expected bytes"),
        ("2 us", "bandwidth", "time quantity"),
        ("400 Gb", "bandwidth", "unknown unit"),  # a bare bit count is not a size we accept
        ("fast", "bandwidth", "cannot parse"),
        ("10 furlongs", "time", "unknown unit"),
        ("nan", "time", "cannot parse"),
        (True, "bytes", "boolean"),
        ([1], "bytes", "got list"),
        (float("inf"), "bytes", "not a finite"),
    ],
)
def test_parse_rejects_with_a_reason(text, kind, fragment):
    with pytest.raises(UnitError, match=fragment):
        parse_quantity(text, kind)


@given(
    value=st.floats(min_value=1e-3, max_value=1e6, allow_nan=False),
    unit=st.sampled_from(sorted(UNITS)),
)
def test_unit_round_trip(value, unit):
    """value + unit parses to value * scale, and back: the scale table is the single truth."""
    kind, scale = UNITS[unit]
    parsed = parse_quantity(f"{value!r} {unit}", kind)
    assert math.isclose(parsed / scale, value, rel_tol=1e-12)


@given(st.floats(min_value=1e-9, max_value=1e15, allow_nan=False), st.sampled_from(list(Kind)))
def test_formatted_quantity_parses_back(value, kind):
    """format_quantity's output is valid input, equal to 4 significant digits (3 for times)."""
    text = format_quantity(value, kind)
    assert math.isclose(parse_quantity(text, kind), value, rel_tol=5e-3)


def test_bits_and_bytes_differ_by_eight():
    assert parse_quantity("8 Gb/s", "bandwidth") == parse_quantity("1 GB/s", "bandwidth")


def test_field_kinds_from_names():
    assert kind_of_field("bandwidth") is Kind.BANDWIDTH
    assert kind_of_field("read_bandwidth") is Kind.BANDWIDTH
    assert kind_of_field("latency") is Kind.TIME
    assert kind_of_field("copy_launch_overhead") is Kind.TIME
    assert kind_of_field("memory") is Kind.BYTES
    assert kind_of_field("pinned_capacity") is Kind.BYTES
    assert kind_of_field("cores") is None
