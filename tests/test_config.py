"""The solver configuration document: defaults, overrides and the errors a bad one gives."""

from __future__ import annotations

import pydantic
import pytest

from gpusched.config import ConfigError, GpuschedConfig, load_config, parse_config, read_yaml_documents
from gpusched.kube.configmap import ConfigMapHandler
from gpusched.solver.params import Limits, SolverParams, Weights


@pytest.mark.parametrize("text", ["", "{}", "# nothing set\n", "weights: {}\nsolver: {}\n"])
def test_empty_document_gives_the_solver_defaults(text: str) -> None:
    cfg = load_config(text)
    assert cfg.solver_params() == SolverParams()
    assert cfg.solver_params(seed=9) == SolverParams(seed=9)
    assert (cfg.batching.max_size, cfg.batching.max_wait_seconds) == (64, 0.5)


def test_none_means_defaults() -> None:
    assert parse_config(None) == GpuschedConfig()


def test_overrides_use_camel_case_keys() -> None:
    cfg = load_config(
        """
weights:
  placedGpu: 5
  placedPods: 6
  fragmentation: 7
  activeNodes: 8
  packing: 9
  keepHint: 12
  migPartition: 13
  islandSpill: 14
  gangDomains: 15
  preferredAffinity: 11
  workConserving: false
solver:
  timeLimitSeconds: 2.5
  workers: 4
  candidatesPerPod: 10
  relativeGap: 0.05
batching:
  maxSize: 8
  maxWaitSeconds: 0.1
"""
    )
    params = cfg.solver_params(seed=42)
    weights = Weights(
        placed_gpu=5,
        placed_pods=6,
        fragmentation=7,
        active_nodes=8,
        packing=9,
        keep_hint=12,
        mig_partition=13,
        island_spill=14,
        gang_domains=15,
        preferred_affinity=11,
        work_conserving=False,
    )
    assert params == SolverParams(weights, Limits(2.5, 4, 10, 0.05), seed=42)
    assert (cfg.batching.max_size, cfg.batching.max_wait_seconds) == (8, 0.1)


def test_partial_override_keeps_other_defaults() -> None:
    params = load_config("weights:\n  fragmentation: 0\n").solver_params()
    assert params.weights == Weights(fragmentation=0)
    assert params.limits == Limits()


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("solvr: {}\n", "solvr"),
        ("weights:\n  placedGPU: 1\n", "weights.placedGPU"),
        ("solver:\n  timeLimit: 1\n", "solver.timeLimit"),
        ("batching:\n  maxSize: 4\n  window: 2\n", "batching.window"),
    ],
)
def test_unknown_key_is_rejected_naming_its_path(text: str, path: str) -> None:
    with pytest.raises(ConfigError, match=rf"^config: {path}: unknown key \(known here: [a-zA-Z, ]+\)$"):
        load_config(text)


def test_an_unknown_key_lists_the_keys_known_in_its_place() -> None:
    with pytest.raises(ConfigError) as info:
        load_config("solver:\n  timeLimit: 1\n")
    assert str(info.value) == (
        "config: solver.timeLimit: unknown key (known here: timeLimitSeconds, workers, candidatesPerPod, relativeGap)"
    )
    known = "weights, solver, batching, utilisation, headroom, tenants, consolidation, mig"
    with pytest.raises(ConfigError, match=rf"^config: solvr: unknown key \(known here: {known}\)$"):
        load_config("solvr: {}\n")


@pytest.mark.parametrize(
    ("text", "path", "reason"),
    [
        ("solver:\n  workers: 0\n", "solver.workers", "greater than or equal to 1"),
        ("solver:\n  workers: 65\n", "solver.workers", "less than or equal to 64"),
        ("solver:\n  timeLimitSeconds: 0\n", "solver.timeLimitSeconds", "greater than 0"),
        ("solver:\n  relativeGap: 1.5\n", "solver.relativeGap", "less than or equal to 1"),
        ("weights:\n  placedGpu: -1\n", "weights.placedGpu", "greater than or equal to 0"),
        ("weights:\n  packing: lots\n", "weights.packing", "valid integer"),
        ("weights:\n  fragmentation: 1.5\n", "weights.fragmentation", "valid integer (got 1.5)"),
        ("weights:\n  placedGpu: true\n", "weights.placedGpu", "valid integer (got True)"),
        (
            "weights:\n  packing: '3'\n",
            "weights.packing",
            "valid integer (got the string '3'; write it without quotes)",
        ),
        ("batching:\n  quickStart: 1\n", "batching.quickStart", "valid boolean (got 1; write true or false)"),
        ("batching:\n  maxWaitSeconds: 61\n", "batching.maxWaitSeconds", "less than or equal to 60"),
        ("weights: [1, 2]\n", "weights", "expected a mapping of keys under it (got [1, 2])"),
        (
            "headroom:\n  toleratedTaints: ['nvidia.com/gpu present']\n",
            "headroom.toleratedTaints.0",
            "is not a taint key: write the key only (as nvidia.com/gpu)",
        ),
        ("tenants:\n  label: team=a\n", "tenants.label", "is not a label key: write the key only"),
    ],
)
def test_bad_value_is_rejected_naming_field_and_reason(text: str, path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(text, source="configmap gpusched/solver")
    message = str(info.value)
    assert message.startswith(f"configmap gpusched/solver: {path}: ")
    assert reason in message


def test_bad_value_error_shows_the_input() -> None:
    with pytest.raises(ConfigError, match=r"solver\.workers: .*\(got 0\)"):
        load_config("solver:\n  workers: 0\n")


def test_every_bad_field_is_reported() -> None:
    with pytest.raises(ConfigError) as info:
        load_config("solver:\n  workers: 0\n  extra: 1\nweights:\n  packing: -2\n")
    message = str(info.value)
    for path in ("solver.workers", "solver.extra: unknown key", "weights.packing"):
        assert path in message


@pytest.mark.parametrize("text", ["weights: [\n", "weights:\n  placedGpu: 1\n bad: 2\n", "a: b: c\n"])
def test_yaml_syntax_error(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^cm: not valid YAML: "):
        load_config(text, source="cm")


@pytest.mark.parametrize(("text", "kind"), [("- a\n- b\n", "list"), ("42\n", "int"), ("hello\n", "str")])
def test_top_level_must_be_a_mapping(text: str, kind: str) -> None:
    with pytest.raises(ConfigError, match=rf"^config: expected a mapping at the top level, got {kind}$"):
        load_config(text)


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown key"):
        parse_config({"nope": 1})


def test_config_is_frozen() -> None:
    cfg = load_config("")
    with pytest.raises(pydantic.ValidationError):
        cfg.solver.workers = 3


def test_numbers_yaml_reads_as_strings_and_merge_keys_are_taken() -> None:
    text = "solver: {relativeGap: 1e-3}\nbatching: {<<: {maxSize: 8, maxWaitSeconds: 0.2}, maxSize: 9}\n"
    cfg = load_config(text)  # YAML 1.1 reads 1e-3 as a string; a merged key may be overridden
    assert (cfg.solver.relative_gap, cfg.batching.max_size, cfg.batching.max_wait_seconds) == (0.001, 9, 0.2)
    with pytest.raises(ConfigError, match=r"solver\.timeLimitSeconds: expected a number, not a boolean"):
        load_config("solver: {timeLimitSeconds: true}\n")


def test_a_key_given_twice_is_refused_naming_it_and_its_line() -> None:
    text = "solver:\n  workers: 2\nweights:\n  packing: 3\nsolver:\n  workers: 64\n"
    with pytest.raises(ConfigError) as info:
        load_config(text, source="configmap gpusched/solver")
    message = str(info.value)
    assert message.startswith("configmap gpusched/solver: not valid YAML: ")
    assert message.endswith("'solver' is given twice (line 5, column 1)")  # one line, where it is
    with pytest.raises(ConfigError, match=r"'packing' is given twice"):
        load_config("weights: {packing: 3, packing: 4}\n")


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ("weights: {placedGpu: 1e3}", "(got '1e3'; write a whole number, such as 1000)"),
        ("solver: {workers: nan}", "(got 'nan'; write a whole number, such as 1000)"),
        ('weights: {placedGpu: "3"}', "(got the string '3'; write it without quotes)"),
    ],
)
def test_a_number_yaml_read_as_a_string_is_told_what_to_write(doc: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(doc)
    assert says in str(info.value)


def test_a_tolerated_taint_written_as_kubectl_takes_it_is_read_as_its_key() -> None:
    # Older versions took the whole string as the key, which matched no taint: headroom kept
    # nothing.  A document from then must still load (a new replica would not start otherwise).
    cfg = parse_config({"headroom": {"toleratedTaints": ["nvidia.com/gpu=present:NoSchedule", "dedicated:NoSchedule"]}})
    assert cfg.headroom.tolerated_taints == ["nvidia.com/gpu", "dedicated"]


DEEP = "solver: " + "[" * 1000 + "]" * 1000


def test_a_document_nested_too_deeply_is_refused_with_a_config_error() -> None:
    with pytest.raises(ConfigError, match="nested too deeply to read"):
        load_config(DEEP, "cm")
    with pytest.raises(ConfigError, match="nested too deeply to read"):
        read_yaml_documents(DEEP, "file")


def test_the_configmap_handler_refuses_a_deeply_nested_document_and_keeps_the_last_config() -> None:
    got: list[object] = []
    handler = ConfigMapHandler("ns", "cfg", got.append)
    handler.apply("MODIFIED", {"metadata": {"name": "cfg", "resourceVersion": "7"}, "data": {"config.yaml": DEEP}})
    assert not got
    assert "nested too deeply to read" in handler.rejected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "solver:\n  timeLimitSeconds: 2024-02-30\n",
            "cannot read '2024-02-30' as a date: day is out of range for month",
        ),
        ("solver:\n  workers: !!int four\n", "cannot read 'four' as a whole number"),
        ("batching:\n  quickStart: !!bool maybe\n", "cannot read 'maybe' as true or false"),
        ("solver:\n  relativeGap: !!float\n", "cannot read '' as a number"),
        ("solver:\n  timeLimitSeconds: !!timestamp soon\n", "cannot read 'soon' as a date"),
        ("solver:\n  workers: " + "1" * 5000 + "\n", "as a whole number: it has 5000 digits"),
    ],
)
def test_a_value_yaml_cannot_build_is_refused_naming_its_line(text: str, says: str) -> None:
    """PyYAML reports these with ValueError, KeyError, IndexError or AttributeError, not as YAML
    errors: they escaped as such, failing the ConfigMap watch into a relist loop."""
    with pytest.raises(ConfigError) as info:
        load_config(text, "cm")
    message = str(info.value)
    assert message.startswith("cm: not valid YAML: cannot read ")
    assert says in message
    assert "(line 2, column " in message  # where it is
    with pytest.raises(ConfigError, match="not valid YAML: cannot read"):
        read_yaml_documents(text, "file")


def test_the_configmap_handler_refuses_a_value_yaml_cannot_build_and_keeps_the_last_config() -> None:
    got: list[object] = []
    handler = ConfigMapHandler("ns", "cfg", got.append)
    typo = "solver:\n  timeLimitSeconds: 2024-02-30\n"
    handler.apply("MODIFIED", {"metadata": {"name": "cfg", "resourceVersion": "8"}, "data": {"config.yaml": typo}})
    assert not got
    assert "cannot read '2024-02-30' as a date" in handler.rejected


def test_a_value_an_error_shows_is_cut_short_however_large_aliases_make_it() -> None:
    """YAML aliases let a few lines hold a list of millions of strings (each line ten times the
    one before): the error showed all of it, a size growing tenfold a line, enough at nine lines
    to exhaust the scheduler's memory with one ConfigMap."""
    lines = ["anchors:", "  x0: &x0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 10)}]" for i in range(1, 6)]
    text = "\n".join(lines) + "\nheadroom:\n  models: *x5\n"
    with pytest.raises(ConfigError) as info:
        load_config(text)
    assert "headroom.models.0: Input should be a valid string (got [[" in str(info.value)
    assert len(str(info.value)) < 5_000


def test_an_idle_threshold_at_or_above_the_busy_one_is_refused_naming_both() -> None:
    with pytest.raises(ConfigError, match=r"idlePercent \(95\) must be below busyPercent \(90\)"):
        parse_config({"utilisation": {"idlePercent": 95, "busyPercent": 90}})
    assert parse_config({"utilisation": {"idlePercent": 10, "busyPercent": 90}}).utilisation.idle_percent == 10
