"""Which bound pods wake a parked pod: those its pod affinity follows or its spread counts."""

from __future__ import annotations

from dataclasses import replace

from gpusched.daemon.handlers import moved_selectors, waits_for
from gpusched.model.affinity import PodAffinityTerm, Requirement, Spread
from tests.factories import pod


def _select(key: str, value: str) -> tuple[Requirement, ...]:
    return (Requirement(key, "In", (value,)),)


def test_a_pod_wakes_followers_that_all_their_terms_select_it_for_and_spreads_that_count_it() -> None:
    terms = (PodAffinityTerm(_select("app", "db"), None, "zone"), PodAffinityTerm(_select("tier", "x"), None, "zone"))
    follower = replace(pod("f"), affinity=terms)
    assert waits_for(follower, replace(pod("a"), labels=(("app", "db"), ("tier", "x"))))
    assert not waits_for(follower, replace(pod("b"), labels=(("app", "db"),)))  # one term is not enough
    spread = replace(pod("s"), spread=(Spread(1, "zone", _select("app", "llm"), "default"),))
    assert waits_for(spread, replace(pod("c"), labels=(("app", "llm"),)))
    assert not waits_for(spread, replace(pod("d"), labels=(("app", "llm"),), namespace="other"))
    assert not waits_for(pod("plain"), replace(pod("e"), labels=(("app", "llm"),)))


def test_a_namespace_change_moves_only_the_selectors_that_now_pick_differently() -> None:
    team_a, tier = _select("team", "a"), (Requirement("tier", "Exists", ()),)
    exclude_b = (Requirement("team", "NotIn", ("b",)),)
    selectors = [team_a, tier, exclude_b, team_a]
    # A label added that no selector reads: nothing moves.
    assert moved_selectors(selectors, [({"team": "a"}, {"team": "a", "x": "1"})]) == set()
    # The namespace gains tier: only the selector asking for tier moves.
    assert moved_selectors(selectors, [({"team": "a"}, {"team": "a", "tier": "1"})]) == {tier}
    # A new namespace team=b: picked by none before (absent) nor after.
    assert moved_selectors(selectors, [(None, {"team": "b"})]) == set()
    # A namespace team=a deleted: every selector that picked it moves.
    assert moved_selectors(selectors, [({"team": "a"}, None)]) == {team_a, exclude_b}
