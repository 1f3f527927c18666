"""The process around the scheduler (``run_daemon``: tasks, signals, ordered shutdown) and
the one-shot readers behind ``gpusched explain`` and ``gpusched costs``."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import structlog

from gpusched.daemon.gauges import unmeasured
from gpusched.daemon.handlers import no_pod_group
from gpusched.daemon.scheduler import Scheduler, count_running_members
from gpusched.daemon.settings import BOUND_SELECTOR, SCHEDULER_NAME, DaemonSettings
from gpusched.daemon.volumes import gangs_sharing_new_claims, on_one_node
from gpusched.kube.client import ApiError, Kube, connect, segment
from gpusched.kube.convert import (
    PODGROUP_GROUP_VERSION,
    PODGROUP_RESOURCE,
    ConvertError,
    claim_record,
    csi_node_limits,
    gang_disagreements,
    namespace_labels,
    node_record,
    pod_group_record,
    pod_record,
    storage_class_record,
    volume_record,
)
from gpusched.metrics.cost import CostReport, Prices, cost_report
from gpusched.metrics.exporter import HealthServer
from gpusched.metrics.source import UtilisationSource
from gpusched.model import ClusterState, Pod
from gpusched.model.node import single_mig_profile, slices_of
from gpusched.solver.explain import explain, explain_gang, gang_fits
from gpusched.state.cache import Cache
from gpusched.state.records import HELD_REASONS, PodRecord
from gpusched.state.volumes import Claims

log = structlog.get_logger("gpusched.daemon")
T = TypeVar("T")


ACTING = ("schedule", "consolidate", "mig-restore", "keep-warm")
"""The daemon's loops that start work (batches, consolidation's evictions, MIG restores, the
warm connections): stopped first at shutdown, before the drain, so that none starts during it."""


class StartupError(Exception):
    """The daemon cannot start as configured; the message says what to change."""


async def run_daemon(settings: DaemonSettings) -> int:
    """Run until SIGTERM/SIGINT; the exit code for the process."""
    resume = getattr(sys.modules.get("gpusched.solver.solve"), "resume_solves", None)
    if resume is not None:  # a daemon stopped before in this process
        resume()
    kube = await connect(settings.kubeconfig, settings.context, settings.kube_qps, settings.kube_burst)
    sched: Scheduler | None = None
    try:
        sched = Scheduler(settings, kube)
        health = HealthServer(sched.metrics, host=settings.metrics_host, port=settings.metrics_port, ready=sched.ready)
        await health.start()
    except BaseException as exc:  # nothing started: close what was opened
        if sched is not None and sched.elector is not None:
            await sched.elector.kube.close()
        await kube.close()
        if isinstance(exc, OSError):  # the port is taken, or the host is not this machine's
            raise StartupError(
                f"cannot serve metrics on {settings.metrics_host}:{settings.metrics_port}: {exc.strerror or exc}; "
                "pass a free --metrics-port (0 picks one) or another --metrics-host"
            ) from None
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "started",
        identity=sched.identity,
        scheduler_name=settings.scheduler_name,
        metrics_port=health.port,
        leader_elect=settings.leader_elect,
    )
    named: dict[str, Coroutine[Any, Any, None]] = {r.name: r.run() for r in sched.reflectors}
    named = {f"watch-{k}": v for k, v in named.items()}
    named["schedule"] = sched.schedule_forever()
    named["keep-warm"] = sched.keep_warm()
    named["consolidate"] = sched.consolidator.forever()
    named["mig-restore"] = sched.mig.restore_forever()
    if sched.utilisation is not None:
        named["utilisation"] = sched.follow_utilisation()
    if sched.elector is not None:
        named["leader"] = sched.lead()
    tasks = {asyncio.create_task(coro, name=name) for name, coro in named.items()}
    stopper = asyncio.create_task(stop.wait(), name="stop-signal")
    code = 0
    try:
        done, _ = await asyncio.wait({*tasks, stopper}, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if t is not stopper:
                log.error("task ended; stopping", task=t.get_name(), error=repr(t.exception()))
                code = 1
    finally:
        # No new batches, nor evictions or relabelled nodes from the loops that act on their own.
        acting = [t for t in tasks if t.get_name() in ACTING]
        for t in acting:
            t.cancel()
        # A search in a worker thread would hold the exit up for its time limit.  (Not loaded: no
        # solve made; being loaded in a worker thread, without it yet: none begun either.)
        stop_solves = getattr(sys.modules.get("gpusched.solver.solve"), "stop_solves", None)
        if stop_solves is not None:
            stop_solves()
        await asyncio.gather(*acting, return_exceptions=True)
        await sched.drain(timeout=10.0)
        cut_off = sched.unfinished_binds()
        for t in [*sched.pending_tasks(), *tasks]:  # binds still waiting after the drain are dropped
            t.cancel()
        stopper.cancel()
        await asyncio.gather(*tasks, stopper, return_exceptions=True)
        await sched.give_up_lead(cut_off)
        if sched.elector is not None:
            await sched.elector.kube.close()
        await health.stop()
        await kube.close()
        log.info("stopped", code=code)
    return code


def _readable(
    read: Callable[[dict[str, Any]], T], objects: list[dict[str, Any]], what: str, notes: list[str]
) -> list[T]:
    """The records of ``objects`` that ``read`` can read; a line in ``notes`` for each other."""
    out = []
    for obj in objects:
        try:
            out.append(read(obj))
        except ConvertError as exc:
            notes.append(f"{what} ignored: {exc}")
    return out


async def _read_books(kube: Kube, namespaces: dict[str, dict[str, str]] | None, notes: list[str]) -> Cache:
    """The nodes and the pods bound to them, read once into books; a node that cannot be read
    is left out with a line in ``notes``."""
    cache = Cache()
    nodes, _ = await kube.list("/api/v1/nodes")
    cache.replace_nodes(_readable(node_record, nodes, "node", notes))
    bound, _ = await kube.list("/api/v1/pods", {"fieldSelector": BOUND_SELECTOR})
    cache.replace_pods(_readable(lambda o: pod_record(o, namespaces), bound, "bound pod", notes))
    return cache


async def explain_pod(
    kubeconfig: Path | None, context: str | None, namespace: str, name: str, scheduler_name: str = SCHEDULER_NAME
) -> tuple[str, int]:
    """Read the cluster once and explain one pod; the text and an exit code (0 fits, 1 does not, 2 error)."""
    kube = await connect(kubeconfig, context, 50.0, 100)
    try:
        pod_path = f"/api/v1/namespaces/{segment(namespace)}/pods/{segment(name)}"
        r = await kube.request("GET", pod_path)
        if r.status == 404:
            return f"pod {namespace}/{name} not found; name it as NAMESPACE/POD, or pass --namespace", 2
        if not r.ok:  # told with its fix, as any other read of the cluster
            raise r.error()
        if not isinstance(r.body, Mapping):  # a web page: the server is not an API server
            raise kube.not_kubernetes(pod_path, r)
        lines: list[str] = []
        try:
            namespaces: dict[str, dict[str, str]] | None = dict(
                namespace_labels(o) for o in (await kube.list("/api/v1/namespaces"))[0]
            )
        except Exception as exc:  # no read access to namespaces: such terms are explained as refused
            lines.append(f"note: namespaces not read ({exc}); a namespaceSelector cannot be resolved")
            namespaces = None
        try:
            rec = pod_record(r.body, namespaces)
        except ConvertError as exc:  # an object, but no pod's
            raise kube.not_kubernetes(pod_path, r, str(exc)) from None
        pod_groups: dict[str, int] | None = {}
        unread = ""
        if rec.pod.gang is not None:  # its minimum, and its peers', may be their PodGroup's
            pod_groups, unread = await _pod_groups(kube, namespace)
            rec = pod_record(r.body, namespaces, pod_groups)
        if rec.bound:
            node_gpus = f" on GPUs {','.join(map(str, rec.gpu_indices))}" if rec.gpu_indices else ""
            return f"pod {rec.key} is bound to {rec.node_name}{node_gpus}", 0
        if rec.deleting or rec.terminal:
            what = "is being deleted" if rec.deleting else f"has finished ({r.body.get('status', {}).get('phase')})"
            lines.append(f"pod {rec.key} {what}: no scheduler places it")
            return "\n".join(lines), 1
        if rec.scheduler != scheduler_name:
            lines.append(
                f"pod {rec.key} names scheduler {rec.scheduler!r}, not {scheduler_name!r}: {scheduler_name} does not "
                f"place it (spec.schedulerName: {scheduler_name} has it placed here; the field is set when a pod "
                "is created)"
            )
            return "\n".join(lines), 1
        if rec.error:
            lines.append(f"pod {rec.key} cannot be scheduled as written: {rec.error}")
            return "\n".join(lines), 1
        if rec.gated:
            gates = ", ".join(
                str(g.get("name")) for g in r.body["spec"].get("schedulingGates") or () if isinstance(g, dict)
            )
            lines.append(
                f"pod {rec.key} is gated ({gates}): no scheduler places it until its scheduling gates are removed"
            )
            return "\n".join(lines), 1
        cache = await _read_books(kube, namespaces, lines)
        claims: Claims | None = None
        if rec.claims:
            claims = await _read_claims(kube, namespace, lines)
            volumes = claims.problem(rec.key, rec.uid, rec.claims, rec.ephemeral_claims, cache.claim_users())
            if volumes:
                lines.append(f"pod {rec.key} cannot be bound: {volumes}")
                return "\n".join(lines), 1
            rec = replace(rec, pod=_held_to_volumes(rec, claims, cache))
            for claim_name in claims.to_bind(rec.pod.namespace, rec.claims):
                claim = claims.claim(f"{rec.pod.namespace}/{claim_name}")
                if claim is not None and claim.selected_node:
                    lines.append(
                        f'claim "{claim_name}" is being provisioned for node {claim.selected_node}: the pod goes '
                        "there, and is bound once the volume is (the claim's Events say how provisioning goes)"
                    )
        snap = cache.snapshot()
        p = rec.pod
        if p.mig_profile:
            want = f"one MIG {p.mig_profile} slice"
        elif p.num_gpu:
            want = f"{p.num_gpu} GPU" if p.gpu_milli == 1000 else f"{p.gpu_milli}/1000 of one GPU"
        else:
            want = "no GPU"
        if p.island:
            want += f", GPUs within one island ({p.island})"
        lines.append(f"pod {rec.key}: cpu {p.cpu_milli}m, memory {p.memory_mib}Mi, {want}")
        if p.gang is not None:
            lines.append(
                f"member of gang {p.gang.name} (at least {p.gang.min_members} members placed together, or none)"
            )
            if rec.pod_group and (pod_groups is None or rec.pod_group not in pod_groups):
                lines.append(f"note: {no_pod_group(rec.pod_group, unread)}")
        said = _last_word(r.body)
        if p.gang is not None:  # the gang is placed whole or not at all: its members are the answer
            answer, fits = await _gang_answer(
                kube, rec, namespaces, pod_groups, cache, snap.state, scheduler_name, claims, lines
            )
            lines.append(answer)
            if said and said[1] != answer:
                lines.append(f"the scheduler says (unschedulable since {said[0]}): {said[1]}\n{CAVEAT}")
            return "\n".join(lines), 0 if fits else 1
        e = explain(p, snap.state)
        if e.fits:
            mask = snap.state.pod_mask(p)
            fit = [snap.cluster.nodes[i].name for i in range(len(snap.cluster)) if mask[i]]
            lines.append(
                f"{e.fits}/{e.total} nodes can take it now: {', '.join(fit[:10])}{' ...' if len(fit) > 10 else ''}"
            )
        else:
            lines.append(e.message)
        if said and said[1] != e.message:
            lines.append(f"the scheduler says (unschedulable since {said[0]}): {said[1]}\n{CAVEAT}")
        return "\n".join(lines), 0 if e.fits else 1
    finally:
        await kube.close()


CAVEAT = (
    "(this command weighs capacity only; tenant limits, GPUs kept free, busy GPUs, MIG re-partitions, nodes "
    "a consolidation round is emptying and room held for preempting pods are the running scheduler's to weigh)"
)


async def _pod_groups(kube: Kube, namespace: str) -> tuple[dict[str, int] | None, str]:
    """The PodGroups of ``namespace``, by ``namespace/name``, with their minimum; None, and why,
    when they cannot be read (not served, or not granted), as the daemon would tell it."""
    path = f"/apis/{PODGROUP_GROUP_VERSION}/namespaces/{segment(namespace)}/podgroups"
    full = f"{PODGROUP_RESOURCE}/{PODGROUP_GROUP_VERSION.rpartition('/')[2]}"
    try:
        objects, _ = await kube.list(path)
    except ApiError as exc:
        if exc.status == 404:
            return None, f"the API server does not serve {full}"
        if exc.status == 403:
            return None, f"the RBAC does not grant reading {full}"
        raise
    table: dict[str, int] = {}
    for obj in objects:
        with contextlib.suppress(ConvertError):
            key, minimum = pod_group_record(obj)
            table[key] = minimum
    return table, ""


async def _read_claims(kube: Kube, namespace: str, notes: list[str]) -> Claims:
    """The claims (of every namespace: the pods on a node attach theirs; of ``namespace`` when
    no more may be read), the volumes and the storage classes, read once; a line in ``notes``
    for each that cannot be read."""
    claims = Claims()
    try:
        pvcs, _ = await kube.list("/api/v1/persistentvolumeclaims")
    except ApiError as exc:
        if exc.status != 403:
            raise
        notes.append(
            f"note: the claims of other namespaces not read ({exc}); the volumes their pods attach are not "
            "counted against the nodes' attach limits"
        )
        pvcs, _ = await kube.list(f"/api/v1/namespaces/{segment(namespace)}/persistentvolumeclaims")
    claims.replace_claims(_readable(claim_record, pvcs, "claim", notes))
    pvs, _ = await kube.list("/api/v1/persistentvolumes")
    claims.replace_volumes(_readable(volume_record, pvs, "volume", notes))
    classes, _ = await kube.list("/apis/storage.k8s.io/v1/storageclasses")
    claims.replace_classes(_readable(storage_class_record, classes, "storage class", notes))
    try:
        csi_nodes, _ = await kube.list("/apis/storage.k8s.io/v1/csinodes")
    except ApiError as exc:  # not granted: the limits are the running scheduler's to weigh
        notes.append(f"note: CSI nodes not read ({exc}); volume attach limits are not weighed")
        return claims
    for node, limits in _readable(csi_node_limits, csi_nodes, "CSI node", notes):
        claims.set_limits(node, limits)
    return claims


def _held_to_volumes(rec: PodRecord, claims: Claims, books: Cache) -> Pod:
    """``rec``'s pod held to where its claims can be had, and its CSI volumes attached within
    the drivers' limits beside those of the pods on ``books``, as the scheduler holds it."""
    ns = rec.pod.namespace
    return replace(
        rec.pod,
        volume_selector=claims.selector(ns, rec.claims),
        provision_selector=claims.provision_selector(ns, rec.claims, lambda: (n.node for n in books.nodes.values())),
        attach_selector=claims.attach_selector(ns, rec.claims, lambda: claims.attached(books.on_nodes())),
    )


async def _gang_answer(
    kube: Kube,
    rec: PodRecord,
    namespaces: dict[str, dict[str, str]] | None,
    pod_groups: dict[str, int] | None,
    books: Cache,
    state: ClusterState,
    scheduler_name: str,
    claims: Claims | None = None,
    notes: list[str] | None = None,
) -> tuple[str, bool]:
    """Whether ``rec``'s gang fits now, as the scheduler weighs a gang: at least its minimum of
    its pending members (read here) at once, its members already running counted toward its minimum and
    holding it to their topology domain, each held to where its claims can be had (``claims``,
    read here if a member mounts any and they were not); and the text that says so."""
    gang = rec.pod.gang
    assert gang is not None
    pending, _ = await kube.list(
        f"/api/v1/namespaces/{segment(rec.pod.namespace)}/pods", {"fieldSelector": "spec.nodeName="}
    )
    members = [rec.pod]
    mounting: list[tuple[Pod, tuple[str, ...]]] = [(rec.pod, rec.claims)]
    held_back = ""  # why a member was left out for its claims: told if the rest fall short
    for obj in pending:
        try:
            other = pod_record(obj, namespaces, pod_groups)
        except ConvertError:  # no name: no member of any gang
            continue
        g = other.pod.gang
        if other.key == rec.key or g is None or g.name != gang.name or other.scheduler != scheduler_name:
            continue
        if other.error or other.gated or other.deleting or other.terminal:  # not drawn: counted out
            continue
        if other.claims:  # a member held back by its claims is counted out, as the scheduler leaves it out
            if claims is None:
                claims = await _read_claims(kube, rec.pod.namespace, [] if notes is None else notes)
            problem = claims.problem(other.key, other.uid, other.claims, other.ephemeral_claims, books.claim_users())
            if problem:
                held_back = held_back or f"gang {gang.name}: member {other.key} cannot be bound: {problem}"
                continue
            members.append(_held_to_volumes(other, claims, books))
            mounting.append((other.pod, other.claims))
            continue
        members.append(other.pod)
    disagree = gang_disagreements(members)
    if disagree:
        return disagree[gang.name], False
    if claims is not None and (pinned := gangs_sharing_new_claims(mounting, claims)):
        members = [on_one_node(p, pinned) for p in members]  # as the scheduler places it
    members = count_running_members(members, books)  # as the scheduler counts them
    counted = members[0].gang or gang
    running = counted.running
    if held_back and len(members) < counted.min_members:  # short without it: its claims are why
        return held_back, False
    fit = gang_fits(members, state) if len(members) >= counted.min_members else 0
    if fit:
        n = len(members)
        which = f"its {n} pending member{'' if n == 1 else 's'}" if fit == n else f"{fit} of its {n} pending members"
        if running:
            return (
                f"gang {gang.name}: {which} {'fits' if fit == 1 else 'fit'} now beside the "
                f"{running} running (at least {gang.min_members} in all)"
            ), True
        least = "" if fit == n else f" (at least {gang.min_members} must)"
        return f"gang {gang.name}: {which} fit together now{least}", True
    return explain_gang(members[0], len(members), state), False


def _last_word(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """Since when the pod is unschedulable and what its ``PodScheduled=False`` condition (reason
    ``Unschedulable``, as a scheduler writes it, or ``TenantLimit``) says now, if it has one."""
    for c in (pod.get("status") or {}).get("conditions") or ():
        if (
            isinstance(c, Mapping)
            and c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") in HELD_REASONS
        ):
            return str(c.get("lastTransitionTime") or "an unknown time"), str(c.get("message") or "")
    return None


async def report_costs(
    kubeconfig: Path | None,
    context: str | None,
    prices: Prices,
    utilisation: UtilisationSource | None = None,
    idle_percent: float = 5.0,
    indices_honoured: bool = False,
) -> tuple[CostReport, list[str]]:
    """Read the cluster once (and, with ``utilisation``, Prometheus once): the cost report, and
    notes on what could not be read."""
    kube = await connect(kubeconfig, context, 50.0, 100)
    try:
        notes: list[str] = []
        cache = await _read_books(kube, None, notes)
    finally:
        await kube.close()
    view = None
    if utilisation is not None:
        if await utilisation.poll_once():
            view = utilisation.view
            if view is not None and view.names_none_of(cache.nodes):
                notes.append(
                    f"no node of the utilisation answer is a node of the cluster (label {utilisation.node_label!r} "
                    f"gave {', '.join(sorted(view.percent)[:3])}); nothing is counted idle: --utilisation-node-label "
                    "must name the label that holds the Kubernetes node name"
                )
                view = None
            elif view is not None and (strangers := view.strangers(cache.nodes)):
                notes.append(
                    f"{len(strangers)} name(s) in the utilisation answer are no node of the cluster "
                    f"({', '.join(strangers[:3])}): their GPUs are not measured; an exporter without NODE_NAME "
                    "labels its GPUs with its pod's name"
                )
            if view is not None and (missing := unmeasured(view.percent, cache)):
                notes.append(
                    f"{len(missing)} GPU node(s) are not in the utilisation answer ({', '.join(missing[:3])}): "
                    "their GPUs count as neither idle nor in use; is dcgm-exporter running there (a toleration "
                    "its DaemonSet lacks)?"
                )
        else:
            notes.append(f"{utilisation.error}; nothing is counted idle")
    sliced = sorted(n for n, rec in cache.nodes.items() if rec.node.gpu_count and slices_of(rec.node) > 1)
    if sliced:
        notes.append(
            f"{len(sliced)} node(s) time-slice their GPUs ({', '.join(sliced[:3])}): each GPU is counted once, "
            "its nvidia.com/gpu.replicas slices as parts of it, and a pod there is idle only when all the "
            "node's GPUs are"
        )
    single = sorted(n for n, rec in cache.nodes.items() if single_mig_profile(rec.node))
    if single:
        notes.append(
            f"{len(single)} node(s) advertise MIG instances as nvidia.com/gpu (single strategy: "
            f"{', '.join(single[:3])}): each is counted as its compute slices' part of a GPU, and none is "
            "counted idle"
        )
    products = {rec.node.gpu_model for rec in cache.nodes.values()}
    for name in prices.unmatched(products):
        notes.append(
            f"gpuHour.{name} names no GPU product of the cluster's nodes, so it prices nothing: use a "
            f"nvidia.com/gpu.product value of theirs ({', '.join(sorted(p for p in products if p)[:4]) or 'none'})"
        )
    placed = cache.placed()
    report = cost_report(
        cache.snapshot().cluster, placed, prices, view, idle_percent, cache.guessed_gpus(), indices_honoured
    )
    return report, notes
