"""Fixtures shared by every tier: a real Prometheus scraping a DCGM-format exporter (tests/promstack.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.promstack import DcgmExporter, Prometheus, PrometheusMissing, find_prometheus, start_prometheus


@pytest.fixture(scope="session")
def dcgm() -> Iterator[DcgmExporter]:
    """The DCGM-format exporter Prometheus scrapes; tests set utilisation on nodes of their own names."""
    exporter = DcgmExporter()
    exporter.start()
    try:
        yield exporter
    finally:
        exporter.stop()


@pytest.fixture(scope="session")
def prometheus(dcgm: DcgmExporter, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """One Prometheus per session, scraping ``dcgm`` every second.  In CI a missing binary fails."""
    try:
        binary = find_prometheus()
    except PrometheusMissing as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"Prometheus missing: {exc}", pytrace=False)
        pytest.skip(f"Prometheus missing: {exc}")
    prom = start_prometheus(tmp_path_factory.mktemp("prometheus"), dcgm.port, binary)
    try:
        yield prom
    finally:
        prom.stop()
