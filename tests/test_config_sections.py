"""A section of the solver document with every key left out takes the defaults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpusched.config import ConfigError, GpuschedConfig, load_config

SHIPPED = Path(__file__).resolve().parents[1] / "manifests" / "config.yaml"


def _comment_out(text: str, section: str) -> str:
    """``text`` with every key under ``section:`` commented out, as an admin would disable them."""
    out, inside = [], False
    for line in text.splitlines():
        if re.match(r"^\S", line):
            inside = line.startswith(f"{section}:")
        out.append("# " + line if inside and line.strip() and not re.match(r"^\S", line) else line)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("section", ["weights", "solver", "batching", "utilisation", "headroom"])
def test_the_shipped_document_with_a_section_commented_out_keeps_the_defaults(section: str) -> None:
    text = _comment_out(SHIPPED.read_text(), section)
    assert re.search(rf"^{section}:\s*$", text, re.M)  # the section is still there, empty
    cfg = load_config(text, source="ConfigMap gpusched-system/gpu-scheduler-config")
    assert getattr(cfg, section) == getattr(GpuschedConfig(), section)


def test_an_empty_section_beside_overrides() -> None:
    cfg = load_config("weights:\n  # fragmentation: 10\nsolver:\n  workers: 4\nbatching:\n")
    assert cfg.weights == GpuschedConfig().weights
    assert cfg.solver.workers == 4
    assert cfg.batching == GpuschedConfig().batching


@pytest.mark.parametrize("text", ["weights: 3\n", "solver: fast\n", "batching: [1]\n", "weights: false\n"])
def test_a_section_that_is_not_a_mapping_is_still_rejected(text: str) -> None:
    section = text.split(":", maxsplit=1)[0]
    with pytest.raises(ConfigError, match=rf"^config: {section}: "):
        load_config(text)
