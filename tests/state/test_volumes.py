"""Whether a pod's claims let it be bound: every refusal names the claim and what to do."""

from __future__ import annotations

from dataclasses import replace

from gpusched.model import Node
from gpusched.model.affinity import NodeSelector, Requirement, selects
from gpusched.state.volumes import ClaimRecord, Claims, StorageClassRecord, VolumeRecord


def claims(*records: ClaimRecord, volumes: tuple[VolumeRecord, ...] = ()) -> Claims:
    c = Claims()
    c.replace_claims(list(records))
    c.replace_volumes(list(volumes))
    return c


def test_a_claim_bound_to_a_volume_any_node_can_use_is_fine() -> None:
    c = claims(ClaimRecord("ns", "data", "pv-1", bound=True), volumes=(VolumeRecord("pv-1"),))
    assert c.problem("ns/p", "uid-p", ("data",)) == ""
    assert c.problem("ns/p", "uid-p", ()) == ""


def test_each_claim_that_blocks_binding_is_named_with_the_reason() -> None:
    c = claims(
        ClaimRecord("ns", "ok", "pv-1", bound=True),
        ClaimRecord("ns", "waiting"),
        ClaimRecord("ns", "going", "pv-1", bound=True, deleting=True),
        ClaimRecord("ns", "local", "pv-local", bound=True),
        ClaimRecord("ns", "orphan", "pv-gone", bound=True),
        volumes=(VolumeRecord("pv-1"), VolumeRecord("pv-local", error="required node affinity matches no node")),
    )
    assert c.problem("ns/p", "uid-p", ("ok", "missing")) == 'persistentvolumeclaim "missing" not found'
    assert c.problem("other/p", "uid-p", ("ok",)) == 'persistentvolumeclaim "ok" not found'  # claims are per namespace
    assert c.problem("ns/p", "uid-p", ("waiting",)) == (
        'pod has unbound immediate PersistentVolumeClaims ("waiting"); the pod is retried once the claim is bound'
    )
    assert c.problem("ns/p", "uid-p", ("going",)) == 'persistentvolumeclaim "going" is being deleted'
    assert c.problem("ns/p", "uid-p", ("local",)) == (
        'persistentvolume "pv-local" of claim "local": required node affinity matches no node'
    )
    assert c.problem("ns/p", "uid-p", ("orphan",)) == 'persistentvolume "pv-gone" of claim "orphan" not found'


def test_a_claim_to_be_provisioned_for_the_pods_node_holds_the_pod_to_where_it_can_be() -> None:
    zone_a = (Requirement("zone", "In", ("a",)),)
    c = claims(
        ClaimRecord("ns", "new", storage_class="fast"),
        ClaimRecord("ns", "chosen", storage_class="fast", selected_node="n1"),
        ClaimRecord("ns", "ok", "pv-1", bound=True),
        volumes=(VolumeRecord("pv-1", affinity=((Requirement("rack", "In", ("r1",)),),)),),
    )
    c.replace_classes([StorageClassRecord("fast", "disk.example.com", wait_for_consumer=True, topology=(zone_a,))])
    assert c.problem("ns/p", "uid-p", ("new", "chosen", "ok")) == ""
    assert c.to_bind("ns", ("new", "chosen", "ok")) == ("new", "chosen")
    assert c.unchosen("ns", ("new", "chosen", "ok")) == ("new",)
    assert c.selector("ns", ("new", "ok")) == ((Requirement("rack", "In", ("r1",)),),)  # the bound volume's
    assert c.provision_selector("ns", ("new",)) == (zone_a,)
    n1 = Requirement("metadata.name", "In", ("n1",), field=True)
    assert c.provision_selector("ns", ("new", "chosen")) == ((*zone_a, n1),)
    c.selecting["ns/new"] = "n2"  # being provisioned for a pod in flight: its node, not the class's zone
    assert c.unchosen("ns", ("new",)) == ()
    assert c.provision_selector("ns", ("new",)) == ((Requirement("metadata.name", "In", ("n2",), field=True),),)
    assert c.upsert_class(StorageClassRecord("fast", "disk.example.com"))  # now Immediate: waited for
    assert c.to_bind("ns", ("new",)) == ()
    assert c.problem("ns/p", "uid-p", ("new",)).startswith("pod has unbound immediate PersistentVolumeClaims")
    assert c.delete_class("fast")
    assert c.problem("ns/p", "uid-p", ("new",)) == 'storageclass.storage.k8s.io "fast" not found'


def test_updates_report_whether_anything_placement_sees_changed() -> None:
    c = Claims()
    assert c.upsert_claim(ClaimRecord("ns", "d"))
    assert not c.upsert_claim(ClaimRecord("ns", "d"))
    assert c.upsert_claim(ClaimRecord("ns", "d", "pv", bound=True))
    assert c.problem("ns/p", "uid-p", ("d",)) == 'persistentvolume "pv" of claim "d" not found'
    assert c.upsert_volume(VolumeRecord("pv"))
    assert not c.upsert_volume(VolumeRecord("pv"))
    assert c.problem("ns/p", "uid-p", ("d",)) == ""
    assert c.delete_volume("pv")
    assert not c.delete_volume("pv")
    assert c.delete_claim("ns/d")
    assert not c.delete_claim("ns/d")
    assert c.problem("ns/p", "uid-p", ("d",)) == 'persistentvolumeclaim "d" not found'


def test_an_ephemeral_volumes_claim_must_be_the_pods_own() -> None:
    c = claims(
        ClaimRecord("ns", "p-scratch", "pv-1", bound=True, owner="uid-p"),
        ClaimRecord("ns", "q-scratch", "pv-1", bound=True, owner="uid-old-q"),
        volumes=(VolumeRecord("pv-1"),),
    )
    assert c.problem("ns/p", "uid-p", ("p-scratch",), ("p-scratch",)) == ""
    assert c.problem("ns/q", "uid-q", ("q-scratch",), ("q-scratch",)) == (
        'persistentvolumeclaim "q-scratch" was not created for pod ns/q (the pod is not its owner)'
    )
    assert c.problem("ns/q", "uid-q", ("q-scratch",)) == ""  # mounted by name, any owner will do


RWOP = (
    "node(s) unavailable due to PersistentVolumeClaim with ReadWriteOncePod access mode already in-use by another pod"
)


def test_a_read_write_once_pod_claim_another_pod_uses_is_refused_naming_that_pod() -> None:
    c = claims(
        ClaimRecord("ns", "solo", "pv-1", bound=True, one_pod=True),
        ClaimRecord("ns", "shared", "pv-2", bound=True),
        volumes=(VolumeRecord("pv-1"), VolumeRecord("pv-2")),
    )
    users = {"ns/solo": ("ns/holder", "uid-h"), "ns/shared": ("ns/holder", "uid-h")}
    refused = c.problem("ns/p", "uid-p", ("shared", "solo"), users=users)
    assert refused == (
        'persistentvolumeclaim "solo" has access mode ReadWriteOncePod and pod ns/holder uses it '
        f"({RWOP}); the pod is retried when that pod is gone"
    )
    assert c.problem("ns/p", "uid-p", ("shared",), users=users) == ""  # other access modes are shared
    assert c.problem("ns/p", "uid-p", ("solo",), users={}) == ""  # nobody uses it
    assert c.problem("ns/p", "uid-p", ("solo",)) == ""
    assert c.problem("ns/holder", "uid-h", ("solo",), users=users) == ""  # its own claim
    # An earlier pod of the same name (a StatefulSet's, still terminating) is another pod.
    assert c.problem("ns/holder", "uid-new", ("solo",), users=users) == (
        'persistentvolumeclaim "solo" has access mode ReadWriteOncePod and an earlier pod ns/holder (UID uid-h) '
        f"uses it ({RWOP}); the pod is retried when that pod is gone"
    )


def test_a_claim_that_cannot_be_bound_is_told_before_another_pod_using_a_read_write_once_pod_one() -> None:
    c = claims(
        ClaimRecord("ns", "solo", "pv-1", bound=True, one_pod=True),
        ClaimRecord("ns", "waiting", one_pod=True),
        volumes=(VolumeRecord("pv-1"),),
    )
    users = {"ns/solo": ("ns/holder", "uid-h")}
    assert c.problem("ns/p", "uid-p", ("solo", "waiting"), users=users).startswith(
        'pod has unbound immediate PersistentVolumeClaims ("waiting")'
    )


def test_a_pod_is_held_to_the_nodes_every_volume_it_mounts_may_be_used_on() -> None:
    zone_a = (Requirement("zone", "In", ("a",)),)
    either = ((Requirement("host", "In", ("n1",)),), (Requirement("host", "In", ("n2",)),))
    c = claims(
        ClaimRecord("ns", "shared", "pv-nfs", bound=True),
        ClaimRecord("ns", "disk", "pv-zonal", bound=True),
        ClaimRecord("ns", "scratch", "pv-local", bound=True),
        volumes=(VolumeRecord("pv-nfs"), VolumeRecord("pv-zonal", (zone_a,)), VolumeRecord("pv-local", either)),
    )
    assert c.problem("ns/p", "uid-p", ("shared", "disk", "scratch")) == ""  # any of them: still placeable
    assert c.selector("ns", ("shared",)) == ()
    assert c.selector("ns", ("shared", "disk")) == (zone_a,)
    # Both: in zone a, and on n1 or n2.
    assert c.selector("ns", ("disk", "scratch")) == (zone_a + either[0], zone_a + either[1])
    assert c.selector("other", ("disk",)) == ()  # claims are per namespace


def test_a_claim_matches_the_volumes_made_beforehand_as_kube_schedulers_volume_binding_does() -> None:
    gi = 1 << 30
    rwo = frozenset({"ReadWriteOnce"})
    claim = ClaimRecord("ns", "d", storage_class="local", uid="u1", request=50 * gi, modes=rwo)

    def pv(name: str, **kw: object) -> VolumeRecord:
        base: dict[str, object] = {"storage_class": "local", "capacity": 100 * gi, "modes": rwo, "available": True}
        return VolumeRecord(name, **(base | kw))  # type: ignore[arg-type]

    c = claims(
        claim,
        volumes=(
            pv("fits-large", capacity=500 * gi),
            pv("fits"),
            pv("small", capacity=10 * gi),
            pv("other-class", storage_class="fast"),
            pv("read-many-only", modes=frozenset({"ReadOnlyMany"})),
            pv("block", block=True),
            pv("released", available=False),
            pv("taken", claim="ns/other"),
            pv("unreadable", error="bad affinity"),
        ),
    )
    c.replace_classes([StorageClassRecord("local", "kubernetes.io/no-provisioner", wait_for_consumer=True)])
    assert [v.name for v in c.candidates(claim)] == ["fits", "fits-large"]  # smallest first
    c.reserved["fits"] = "ns/someone"  # being bound for a pod in flight
    assert [v.name for v in c.candidates(claim)] == ["fits-large"]
    labelled = replace(claim, selector=(Requirement("tier", "In", ("fast",)),))
    assert c.candidates(labelled) == []
    c.upsert_volume(pv("pre-bound-small", claim="ns/d", capacity=gi))
    assert [v.name for v in c.candidates(claim)] == ["fits-large"]  # its own, too small, is passed over
    c.upsert_volume(pv("pre-bound", claim="ns/d", claim_uid="u1", available=False))
    assert [v.name for v in c.candidates(claim)] == ["pre-bound"]  # its own, alone
    assert c.candidates(replace(claim, selected_node="n1")) == []  # a volume is being provisioned for it


def test_two_claims_that_match_one_volume_hold_the_pod_to_nodes_with_a_volume_for_each() -> None:
    gi = 1 << 30
    rwo = frozenset({"ReadWriteOnce"})

    def on(node: str) -> NodeSelector:
        return ((Requirement("kubernetes.io/hostname", "In", (node,)),),)

    def pv(name: str, node: str, size: int) -> VolumeRecord:
        return VolumeRecord(name, on(node), storage_class="local", capacity=size * gi, modes=rwo, available=True)

    small = ClaimRecord("ns", "small", storage_class="local", request=10 * gi, modes=rwo)
    large = ClaimRecord("ns", "large", storage_class="local", request=80 * gi, modes=rwo)
    c = claims(
        small,
        large,
        # n1: one disk either claim fits; n2: one disk each; n3: two disks only the small claim fits.
        volumes=(pv("n1-a", "n1", 100), pv("n2-a", "n2", 20), pv("n2-b", "n2", 100), pv("n3-a", "n3", 20)),
    )
    c.replace_classes([StorageClassRecord("local", "kubernetes.io/no-provisioner", wait_for_consumer=True)])
    nodes = [Node(n, 8000, 32768, labels={"kubernetes.io/hostname": n}) for n in ("n1", "n2", "n3", "n4")]
    alone = c.provision_selector("ns", ("large", "small"))  # each claim weighed alone: n1 looks fine
    assert [n.name for n in nodes if selects(alone, n)] == ["n1", "n2"]
    both_claims = c.provision_selector("ns", ("large", "small"), lambda: nodes)
    assert [n.name for n in nodes if selects(both_claims, n)] == ["n2"]
    # As kube-scheduler hands them out: the smaller claim first, each the smallest volume left.
    assert c.by_size([large, small], nodes[1]) == {"ns/small": "n2-a", "ns/large": "n2-b"}
    assert c.by_size([large, small], nodes[0]) is None
    # A class that provisions takes the claim a volume is missing for, within its topology.
    c.upsert_class(StorageClassRecord("local", "disk.example.com", wait_for_consumer=True, topology=on("n1")))
    assert c.by_size([large, small], nodes[0]) == {"ns/small": "n1-a"}
    fits = c.provision_selector("ns", ("large", "small"), lambda: nodes)
    assert [n.name for n in nodes if selects(fits, n)] == ["n1", "n2"]
    # No node with a volume for each: the pod fits none.
    c.replace_classes([StorageClassRecord("local", "kubernetes.io/no-provisioner", wait_for_consumer=True)])
    c.delete_volume("n2-b")
    assert not any(selects(c.provision_selector("ns", ("large", "small"), lambda: nodes), n) for n in nodes)


def test_csi_attachments_are_counted_per_driver_and_handle_as_kube_scheduler_counts_them() -> None:
    c = claims(
        ClaimRecord("ns", "ebs", "pv-1", bound=True),
        ClaimRecord("ns", "gp2-new", storage_class="gp2"),
        ClaimRecord("ns", "local-new", storage_class="local"),
        volumes=(VolumeRecord("pv-1", driver="ebs.csi.aws.com", handle="vol-1"),),
    )
    c.replace_classes(
        [
            StorageClassRecord("gp2", "kubernetes.io/aws-ebs", wait_for_consumer=True),  # migrated to the CSI driver
            StorageClassRecord("local", "kubernetes.io/no-provisioner", wait_for_consumer=True),
        ]
    )
    needs = c.attachments("ns", ("ebs", "gp2-new", "local-new"))
    assert needs == {("ebs.csi.aws.com", "vol-1"), ("ebs.csi.aws.com", "ns/gp2-new")}
    assert c.set_limits("n1", {"ebs.csi.aws.com": 2})
    assert not c.set_limits("n1", {"ebs.csi.aws.com": 2})
    c.set_limits("n2", {"ebs.csi.aws.com": 2})
    attached = {"n1": {("ebs.csi.aws.com", "vol-1")}, "n2": {("ebs.csi.aws.com", "vol-9")}}
    assert c.over_limit(needs, attached) == ["n2"]  # on n1 vol-1 is attached already: one new of two
    # A node over its limit already takes a pod whose volumes are all attached there.
    over = {"n1": {("ebs.csi.aws.com", f"vol-{i}") for i in range(1, 4)}}
    assert c.over_limit({("ebs.csi.aws.com", "vol-1")}, over) == []
    assert c.over_limit(needs, over, only=("n1",)) == ["n1"]
