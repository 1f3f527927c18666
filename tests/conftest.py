"""Fixtures shared by every tier: logging kept from leaking between tests, and a real Prometheus
scraping a DCGM-format exporter (tests/promstack.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import structlog

from tests.promstack import DcgmExporter, Prometheus, PrometheusMissing, find_prometheus, start_prometheus


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """``gpusched`` run in process (``main``, the simulator) configures logging for the process;
    the next test finds it as it was, whatever the order tests run in."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture(autouse=True)
def _solves_take_their_time() -> Iterator[None]:
    """A daemon stopped in process (``run_daemon``) leaves new searches no time; the next test
    finds them as they were."""
    yield
    from gpusched.solver.solve import resume_solves

    resume_solves()


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
