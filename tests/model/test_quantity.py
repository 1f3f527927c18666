"""Kubernetes quantities: exact parsing and safe rounding."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpusched.model import QuantityError, cpu_milli, memory_mib, parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500m", Decimal("0.5")),
        ("2", Decimal(2)),
        ("1.5", Decimal("1.5")),
        ("16Gi", Decimal(16 * 2**30)),
        ("1Ki", Decimal(1024)),
        ("1k", Decimal(1000)),
        ("1e3", Decimal(1000)),
        ("1E", Decimal(10**18)),
        ("2M", Decimal(2 * 10**6)),
        ("+3", Decimal(3)),
        ("  4Mi  ", Decimal(4 * 2**20)),
        ("100n", Decimal("1e-7")),
        (7, Decimal(7)),
        (0.25, Decimal("0.25")),
    ],
)
def test_parse_quantity(text: str | int | float, expected: Decimal) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("500m", 500), ("1", 1000), ("1.5", 1500), ("2500m", 2500), (2, 2000), ("250u", 1)],
)
def test_cpu_milli(text: str | int, expected: int) -> None:
    assert cpu_milli(text) == expected


def test_cpu_requests_round_up_and_capacities_round_down() -> None:
    assert cpu_milli("0.0001") == 1
    assert cpu_milli("0.0001", round_up=False) == 0
    assert cpu_milli("1999u", round_up=False) == 1


@pytest.mark.parametrize(
    ("text", "up", "down"),
    [
        ("16Gi", 16384, 16384),
        ("128Mi", 128, 128),
        ("1", 1, 0),
        ("1G", 954, 953),  # 10^9 bytes is 953.67 MiB
        ("1536Ki", 2, 1),
    ],
)
def test_memory_mib_rounding(text: str, up: int, down: int) -> None:
    assert memory_mib(text) == up
    assert memory_mib(text, round_up=False) == down


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", ".", "5x", "Mi", "1 Gi", "1e", "--1", "1Gib"])
def test_malformed_quantity_is_rejected_with_the_text(text: str) -> None:
    with pytest.raises(QuantityError, match="invalid quantity"):
        parse_quantity(text)


@pytest.mark.parametrize("value", ["-1", "-500m", -1, -0.5])
def test_negative_quantity_is_rejected(value: str | int | float) -> None:
    with pytest.raises(QuantityError, match="must not be negative"):
        parse_quantity(value)


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_non_finite_number_is_rejected(value: float) -> None:
    with pytest.raises(QuantityError, match="finite"):
        cpu_milli(value)


def test_bool_is_not_a_quantity() -> None:
    with pytest.raises(QuantityError, match="number or string"):
        parse_quantity(True)


def test_quantity_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        memory_mib("lots")


@pytest.mark.parametrize(
    "value", ["1e1000000", "1e999999", "1e40", "8Ei", "9999999999999999999", 2**70, 1e300, "9e18", "2e12"]
)
def test_a_quantity_beyond_what_anything_holds_is_rejected_not_overflowed(value: str | int | float) -> None:
    with pytest.raises(QuantityError, match="too large"):
        cpu_milli(value)


def test_the_largest_quantities_still_parse() -> None:
    assert parse_quantity("7Ei") == Decimal(7 * 2**60)
    assert parse_quantity("1e-999999") == Decimal("1e-999999")
