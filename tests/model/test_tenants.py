"""Tenants: who a pod counts against, what a limit holds back, what a quota guarantees, and in
what order tenants are drawn."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpusched.config import ConfigError, load_config
from gpusched.model import Pod
from gpusched.model.pod import Gang
from gpusched.model.tenants import TenantRule, Tenants, demand_of
from tests.factories import pod


def of(name: str, ns: str, gpus: int = 1, milli: int = 0, **labels: str) -> Pod:
    return replace(pod(name, gpus=gpus, milli=milli), namespace=ns, labels=tuple(labels.items()))


def member(name: str, ns: str, gang: str, gpus: int = 1) -> Pod:
    return replace(of(name, ns, gpus), gang=Gang(gang, 2))


T = Tenants(rules={"a": TenantRule(quota=2000, limit=4000), "b": TenantRule(quota=1000, weight=2.0)})


def test_a_pod_counts_against_its_label_else_its_namespace() -> None:
    labelled = Tenants(label="team")
    assert labelled.of(of("p", "ns1", team="vision")) == "vision"
    assert labelled.of(of("p", "ns1")) == "ns1"
    assert labelled.of(of("p", "ns1", team="")) == "ns1"
    assert Tenants().of(of("p", "ns1", team="vision")) == "ns1"


def test_nothing_configured_is_inactive_and_a_label_alone_is_active() -> None:
    assert not Tenants().active
    assert Tenants(label="team").active
    assert T.active


def test_usage_counts_gpu_demand_only() -> None:
    pods = [of("w", "a", 2), of("s", "a", 1, milli=250), of("cpu", "a", 0), of("x", "b", 1)]
    assert T.usage(pods) == {"a": 2250, "b": 1000}


def test_a_limit_holds_back_a_pod_past_it_as_things_are_and_says_how_far() -> None:
    pods = [of("p1", "a", 1), of("p2", "a", 2), of("p3", "a", 1), of("q", "b", 8)]
    admitted, held = T.admit(pods, {"a": 1000})
    assert admitted == pods  # each fits beside what a holds; together they are trim's to judge
    admitted, held = T.admit(pods, {"a": 3000})
    assert [p.name for p in admitted] == ["p1", "p3", "q"]
    assert held == {pods[1].key: "tenant a is at its GPU limit: it holds 3 of 4 GPUs and this pod asks for 2 more."}


def test_a_pod_or_gang_larger_than_its_tenants_whole_limit_is_told_so_not_that_the_tenant_is_at_it() -> None:
    big, gang = of("big", "a", 5), [member("m0", "a", "g", 3), member("m1", "a", "g", 2)]
    for unit in ([big], gang):
        admitted, held = T.admit(unit, {})  # a holds nothing: no GPU it frees would let them in
        assert admitted == []
        kind = "gang" if unit is gang else "pod"
        assert set(held.values()) == {
            f"this {kind} asks for 5 GPUs, more than tenant a's GPU limit of 4: it cannot be placed while that "
            "limit stands."
        }


def test_trim_drops_the_placed_pods_that_together_pass_a_limit_in_queue_order() -> None:
    pods = [of("p1", "a", 1), of("p2", "a", 2), of("p3", "a", 1), of("q", "b", 8)]
    assert T.trim(pods, {"a": 1000}) == {pods[2].key}  # 1 held + 1 + 2 = 4; p3 would make 5
    gang = [member("m0", "a", "g"), member("m1", "a", "g")]
    assert T.trim([*gang, of("p", "a", 1)], {"a": 3000}) == {m.key for m in gang}  # the gang whole; p fits


def test_seven_mig_sevenths_count_no_more_than_one_gpu() -> None:
    sevenths = [replace(pod(f"s{i}"), namespace="a", mig_profile="1g.10gb") for i in range(7)]
    limited = Tenants(rules={"a": TenantRule(quota=1000, limit=1000)})
    assert limited.trim(sevenths, {}) == set()
    assert sum(limited.usage(sevenths).values()) <= 1000


@pytest.mark.parametrize(
    ("profile", "milli"),
    [("1g.10gb", 142), ("3g.40gb", 428), ("7g.80gb", 1000), ("1g.6gb", 250), ("2g.12gb", 500), ("4g.24gb", 1000)],
)
def test_a_slice_is_the_same_gpu_demand_to_its_tenant_and_to_the_autoscaling_gauge(profile: str, milli: int) -> None:
    """Sevenths of a GPU, but fourths on the A30 (1g.6gb, 2g.12gb, 4g.24gb)."""
    p = Pod(name="m", namespace="a", cpu_milli=100, memory_mib=100, mig_profile=profile)
    assert (p.gpu_demand_milli, demand_of(p)) == (milli, milli)


def test_a_pod_holding_several_slices_and_a_gpu_counts_them_all_against_its_tenant() -> None:
    theirs = replace(pod("theirs", gpus=1), namespace="a", mig_held=(("1g.10gb", 2), ("3g.40gb", 1)))
    assert Tenants().usage([theirs]) == {"a": 1000 + 2 * 142 + 428}


def test_a_gang_is_judged_by_its_minimum_and_admitted_or_held_back_whole() -> None:
    gang = [member("m0", "a", "g"), member("m1", "a", "g"), member("m2", "a", "g")]  # minimum 2
    admitted, held = T.admit(gang, {"a": 3000})
    assert admitted == []
    assert set(held) == {m.key for m in gang}
    assert set(held.values()) == {
        "tenant a is at its GPU limit: it holds 3 of 4 GPUs and this gang's minimum (2 of its 3 members)"
        " asks for 2 more."
    }
    admitted, held = T.admit(gang, {"a": 2000})  # its minimum fits the limit, not every member
    assert admitted == gang
    assert not held
    whole = [replace(m, gang=Gang("g", 3)) for m in gang]
    _, held = T.admit(whole, {"a": 2000})
    assert "this gang asks for 3 more" in held[gang[0].key]


def test_a_gang_is_judged_by_its_cheapest_members_beside_those_running() -> None:
    gang = [member("big", "a", "g", 3), member("m1", "a", "g"), member("m2", "a", "g")]  # minimum 2
    admitted, _ = T.admit(gang, {"a": 2000})  # the two 1-GPU members fit; the 3-GPU one would not
    assert admitted == gang
    three = [replace(m, gang=Gang("g", 3)) for m in gang]
    _, held = T.admit(three, {})
    assert set(held.values()) == {
        "this gang asks for 5 GPUs, more than tenant a's GPU limit of 4: it cannot be placed while that limit stands."
    }
    beside = [replace(m, gang=Gang("g", 3).beside(1)) for m in gang]  # one more runs: 2 to go
    admitted, _ = T.admit(beside, {"a": 2000})
    assert admitted == beside
    _, held = T.admit(beside, {"a": 3000})
    assert set(held.values()) == {
        "tenant a is at its GPU limit: it holds 3 of 4 GPUs and this gang's minimum (2 of its 3 pending members)"
        " asks for 2 more."
    }


def test_trim_keeps_a_gangs_minimum_and_drops_its_members_beyond_it_first() -> None:
    gang = [member(f"m{i}", "a", "g") for i in range(4)]  # minimum 2
    late = of("p", "a", 1)
    # 2 for the gang's minimum, 1 for p, then 1 extra member: the fourth would pass the limit of 4.
    assert T.trim([*gang, late], {}) == {gang[3].key}
    assert T.trim([*gang, late], {"a": 1000}) == {gang[2].key, gang[3].key}
    assert T.trim([*gang, late], {"a": 2000}) == {gang[2].key, gang[3].key, late.key}
    assert T.trim([*gang, late], {"a": 3000}) == {m.key for m in gang}  # its minimum passes: all out; p fits
    mixed = [member("big", "a", "h", 2), member("s1", "a", "h"), member("s2", "a", "h")]
    assert T.trim(mixed, {"a": 1000}) == {mixed[0].key}  # the cheapest two make its minimum


def test_quota_guarantees_pods_in_order_and_a_gang_whole() -> None:
    pods = [of("p1", "a", 1), of("p2", "a", 2), of("p3", "a", 1), of("q", "b", 1), of("r", "b", 1)]
    assert T.guaranteed(pods, {}) == {pods[0].key, pods[2].key, pods[3].key}
    gang = [member("m0", "b", "g"), member("m1", "b", "g")]
    assert T.guaranteed(gang, {}) == set()  # 2 GPUs, quota 1: neither member alone
    assert T.guaranteed([of("cpu", "a", 0)], {}) == set()  # no GPU: nothing to guarantee


def test_quota_guarantees_a_gangs_minimum_and_its_extras_only_as_they_fit_after_every_minimum() -> None:
    gang = [member(f"m{i}", "a", "g") for i in range(4)]  # minimum 2; a's quota: 2
    assert T.guaranteed(gang, {}) == {gang[0].key, gang[1].key}  # its minimum, not all 4
    assert T.guaranteed(gang, {"a": 1000}) == set()  # its minimum passes the quota
    roomy = Tenants(rules={"a": TenantRule(quota=4000)})
    late = of("p", "a", 1)
    # 2 for its minimum, 1 for p (in queue order after it), then 1 of its extras: the last passes.
    assert roomy.guaranteed([*gang, late], {}) == {gang[0].key, gang[1].key, late.key, gang[2].key}
    mixed = [member("big", "a", "h", 2), member("s1", "a", "h"), member("s2", "a", "h")]
    assert T.guaranteed(mixed, {}) == {mixed[1].key, mixed[2].key}  # the cheapest two make its minimum
    beside = [replace(m, gang=Gang("g", 3).beside(1)) for m in gang]  # one more runs: 2 to go
    assert T.guaranteed(beside, {"a": 1000}) == set()
    assert T.guaranteed(beside[:2], {}) == {beside[0].key, beside[1].key}


def test_a_gang_whose_minimum_asks_for_no_gpu_is_guaranteed_its_workers_as_the_quota_covers_them() -> None:
    # An elastic job: a launcher without a GPU starts it (minimum 1), its GPU workers join as they fit.
    launcher = replace(of("launcher", "a", 0), gang=Gang("job", 1))
    workers = [replace(of(f"w{i}", "a", 1), gang=Gang("job", 1)) for i in range(3)]
    job = [*workers, launcher]
    # a's quota is 2 GPUs: the launcher takes none of it, two workers are within it, the third not.
    assert T.guaranteed(job, {}) == {launcher.key, workers[0].key, workers[1].key}
    assert T.guaranteed(job, {"a": 2000}) == {launcher.key}  # the quota is spent: no worker reclaims


def test_tenants_below_quota_are_drawn_first_then_the_least_used_for_their_weight() -> None:
    assert T.order_key("a", 1999)[0] == 0
    assert T.order_key("a", 2000)[0] == 1
    assert T.order_key("a", 1999) < T.order_key("other", 0)  # below quota beats past it, however little used
    assert T.order_key("b", 2000) < T.order_key("other", 1500)  # weight 2: 1.0 against 1.5
    assert T.order_key("a", 500) < T.order_key("b", 500)  # a quarter of its quota against half


def test_borrowed_is_usage_past_quota() -> None:
    assert T.borrowed({"a": 3000, "b": 1000, "c": 500}) == {"a": 1000, "c": 500}


def test_the_config_section_turns_into_rules_in_thousandths() -> None:
    cfg = load_config(
        "tenants:\n  label: team\n  default: {limitGpus: 8}\n"
        "  quotas:\n    research: {quotaGpus: 2.5, limitGpus: 4, weight: 3}\n"
    )
    t = cfg.tenants.tenants()
    assert t.label == "team"
    assert t.rule("research") == TenantRule(2500, 4000, 3.0)
    assert t.rule("anyone") == TenantRule(0, 8000, 1.0)
    assert not load_config("").tenants.tenants().active


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        (
            "tenants: {quotas: {a: {quotaGpus: 4, limitGpus: 2}}}",
            "tenants.quotas.a: limitGpus (2) is below quotaGpus (4)",
        ),
        (
            "tenants: {quotas: {a: {quota: 4}}}",
            "tenants.quotas.a.quota: unknown key (known here: quotaGpus, limitGpus, weight)",
        ),
        ("tenants: {quotas: {a: {weight: 0}}}", "tenants.quotas.a.weight: Input should be greater than 0"),
        (
            "tenants: {default: {quotaGpus: -1}}",
            "tenants.default.quotaGpus: Input should be greater than or equal to 0",
        ),
        ("tenants: {reclaim: maybe}", "tenants.reclaim: Input should be a valid boolean"),
    ],
)
def test_bad_tenant_rules_are_refused_with_the_field(doc: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(doc)
    assert says in str(err.value)
