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


def _keys() -> dict[str, set[str]]:
    """Per section of the document, the keys it takes (as written)."""
    from pydantic import BaseModel

    out: dict[str, set[str]] = {}
    for section, field in GpuschedConfig.model_fields.items():
        model = field.default
        assert isinstance(model, BaseModel)
        out[section] = {f.alias or name for name, f in type(model).model_fields.items()}
    return out


def test_the_shipped_config_carries_every_key_at_its_default() -> None:
    import yaml

    data = yaml.safe_load(SHIPPED.read_text())
    assert {s: set(v) for s, v in data.items()} == _keys()
    assert load_config(SHIPPED.read_text()) == GpuschedConfig()


def test_the_readme_configuration_reference_has_a_row_for_every_key() -> None:
    readme = (SHIPPED.parents[1] / "README.md").read_text()
    rows = set(re.findall(r"^\| `([a-zA-Z]+\.[a-zA-Z]+)[.`]", readme, re.M))  # tenants.quotas.NAME.x: tenants.quotas
    missing = [f"{s}.{k}" for s, keys in _keys().items() for k in sorted(keys) if f"{s}.{k}" not in rows]
    assert not missing
