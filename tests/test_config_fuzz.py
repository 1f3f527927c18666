"""Fuzzing the reading of the solver configuration and of a price list: whatever YAML a person
writes into the ConfigMap or a file, reading it gives a configuration or a ``ConfigError`` (for a
price list a ``ValueError``) that says what is wrong, in a line, and quickly.  Anything else would
fail the ConfigMap watch into a relist loop, or end a command in a traceback."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from gpusched.config import ConfigError, GpuschedConfig, load_config, parse_config, read_yaml
from gpusched.metrics.cost import parse_prices

FUZZ = settings(
    max_examples=150,
    derandomize=True,  # the same examples on every run: a failure is one to fix, not a flake
    deadline=None,  # timed below, generously: the machine running the tests may be busy
    suppress_health_check=[HealthCheck.too_slow],
)
SLOW_S = 1.0
LONGEST = 10_000
"""No message may be longer: it goes into a log line and an Event."""

SECTIONS: dict[str, list[str]] = {
    (field.alias or name): [f.alias or n for n, f in field.annotation.model_fields.items()]
    for name, field in GpuschedConfig.model_fields.items()
    if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
}
"""Each section of the document with its keys, as written in YAML."""

SCALARS = [
    "0",
    "-1",
    "1",
    "1.5",
    "1e3",
    "1.0e+400",
    "-.inf",
    ".nan",
    "~",
    "true",
    "yes",
    "'5'",
    "[]",
    "{}",
    "[1, [2]]",
    "{a: 1}",
    "2001-12-14",
    "2024-02-30",
    "2024-13-01",
    "2001-12-14 25:00:00",
    "2001-12-14t21:59:43.10-25:00",
    "0x1F",
    "0o17",
    "1_000",
    "190:20:30",
    "123456789012345678901234567890",
    "9" * 5000,
    "0x" + "f" * 5000,
    "!!int four",
    "!!int",
    "!!float",
    "!!float x",
    "!!bool maybe",
    "!!timestamp soon",
    "!!binary aGVsbG8=",
    "!!binary @@",
    "!!set {a, b}",
    "!!str 5",
    "!!omap [a: 1]",
    "!!python/object:os.system x",
    "! x",
    "&a 1",
    "*a",
    "*missing",
    "<<: {}",
    "[" * 200 + "]" * 200,
    "x" * 5000,
]
"""Values as a person or a careless tool writes them: numbers YAML reads as strings or dates,
tags PyYAML builds or refuses, anchors, deep nesting, long values."""

KEYS = st.one_of(st.sampled_from(["x", "1", "~", "[a]", "? [a]", "2001-12-14", "<<"]), st.text(max_size=6))


@st.composite
def documents(draw: Any) -> str:
    """A solver document of known sections and keys (and some that are not), with values of
    ``SCALARS``."""
    lines = []
    for section in draw(st.lists(st.sampled_from([*SECTIONS, "bogus"]), max_size=4, unique=True)):
        if draw(st.integers(0, 4)) == 0:
            lines.append(f"{section}: {draw(st.sampled_from(SCALARS))}")
            continue
        lines.append(f"{section}:")
        known = [*SECTIONS.get(section, []), "x"]
        for key in draw(st.lists(st.sampled_from(known), max_size=4, unique=True)):
            if key in ("quotas", "default") and draw(st.booleans()):
                lines.append(f"  {key}:")
                lines.append(f"    {draw(KEYS)}:")
                for rule in draw(st.lists(st.sampled_from(["quotaGpus", "limitGpus", "weight", "x"]), max_size=3)):
                    lines.append(f"      {rule}: {draw(st.sampled_from(SCALARS))}")
            else:
                lines.append(f"  {key}: {draw(st.sampled_from(SCALARS))}")
    return "\n".join(lines) + "\n"


def read(fn: Callable[[], object], refusal: type[ValueError], source: str) -> None:
    """``fn()`` returns, or raises ``refusal`` with a message of a line that starts with
    ``source``; any other exception fails the test, as does taking ``SLOW_S`` or more."""
    start = time.perf_counter()
    message = ""
    try:
        fn()
    except refusal as exc:
        message = str(exc)
    elapsed = time.perf_counter() - start
    assert elapsed < SLOW_S, f"reading took {elapsed:.1f} s"
    if message:
        assert message.startswith(f"{source}: "), message
        assert len(message) <= LONGEST, f"a message of {len(message)} characters"


@FUZZ
@given(st.one_of(documents(), st.text(max_size=60)))
def test_a_document_gives_a_configuration_or_a_config_error(text: str) -> None:
    read(lambda: load_config(text, "cm"), ConfigError, "cm")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def decoded(draw: Any) -> dict[Any, Any]:
    """A decoded document of known sections and keys, with values of any type."""
    doc: dict[Any, Any] = {}
    for section in draw(st.lists(st.sampled_from([*SECTIONS, "bogus"]), max_size=4, unique=True)):
        keys = SECTIONS.get(section, ["x"])
        doc[section] = draw(
            st.one_of(_JSON, st.dictionaries(st.sampled_from(keys), _JSON, max_size=4)),
        )
    return doc


@FUZZ
@given(decoded())
def test_a_decoded_document_gives_a_configuration_or_a_config_error(doc: dict[Any, Any]) -> None:
    read(lambda: parse_config(doc, "cm"), ConfigError, "cm")


PRICE_VALUES = [*SCALARS, "{A100: 3}", "{A100: .nan}", "{A100: 1e3}", "{? [a]: 1}", "{1: 2}", "{~: 1}", "USD"]


@FUZZ
@given(
    st.lists(
        st.tuples(st.one_of(st.sampled_from(["currency", "default", "gpuHour"]), KEYS), st.sampled_from(PRICE_VALUES)),
        max_size=4,
    )
)
def test_a_price_list_gives_prices_or_a_value_error(items: list[tuple[str, str]]) -> None:
    text = "".join(f"{key}: {value}\n" for key, value in items)
    # A ConfigError, for YAML that cannot be read, is a ValueError too.
    read(lambda: parse_prices(read_yaml(text, "prices.yaml"), "prices.yaml"), ValueError, "prices.yaml")
