"""What a Ray cluster holds, who holds it and what is free: the numbers behind sizing, refusing and waiting.

The pure part (:class:`Capacity`, :func:`holders_of`, :func:`check_request`, :func:`plan_trials`,
:func:`describe`) is shared: the Airflow side checks a request against a cluster's capacity before
it submits a job (from the dashboard's State API), the stages size their trials and workers to
what is free now and name what holds the rest (from inside the job, :func:`live_capacity`).

Who holds what: a Serve application's replicas (actors named ``ServeReplica:<app>:<deployment>``),
and every other job's placement groups (Tune trials, Ray Train worker groups) and actors outside
them. Actors inside a placement group are counted with their group, never twice.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable

MIN_CPU_SHARE = 0.05
"""The smallest CPU share a trial or a Ray Train worker reserves where the cluster is small or busy."""

CELLS_PER_THREAD = 1_000_000
"""Training rows x features that one thread handles: a trial takes one more thread per this many cells
(XGBoost's ``nthread``, torch's intra-op threads), up to the compute spec's CPUs per worker."""

TRIALS_PER_GPU = 4
"""Trials that share one GPU (each reserves this fraction of it): the search's models are small."""

SERVE_REPLICA_PREFIX = "ServeReplica:"


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds resources on the cluster: ``kind`` is ``serve`` (an application) or ``job``."""

    kind: str
    name: str
    cpus: float = 0.0
    gpus: float = 0.0


@dataclasses.dataclass(frozen=True)
class Capacity:
    """A cluster's CPUs and GPUs: in total, free now, each alive node's totals, and who holds the rest.

    ``autoscaling``: an autoscaler may add nodes, so a request above the totals may still be met.
    ``own_cpus`` and ``own_gpus``: what the job asking holds itself (its trials' or workers' placement
    groups that were granted), left out of ``holders``.
    """

    total_cpus: float
    total_gpus: float
    free_cpus: float
    free_gpus: float
    nodes: tuple[dict[str, float], ...] = ()
    holders: tuple[Holder, ...] = ()
    autoscaling: bool = False
    own_cpus: float = 0.0
    own_gpus: float = 0.0

    @classmethod
    def of_nodes(cls, nodes: Iterable[dict[str, Any]], *, available: dict[str, float] | None = None,
                 holders: Iterable[Holder] = (), autoscaling: bool = False,
                 own: tuple[float, float] = (0.0, 0.0)) -> "Capacity":
        """From the State API's alive nodes (``resources_total``) and the cluster's available resources."""
        totals = [node.get("resources_total") or {} for node in nodes if node.get("state", "ALIVE") == "ALIVE"]
        total_cpus = sum(float(t.get("CPU", 0)) for t in totals)
        total_gpus = sum(float(t.get("GPU", 0)) for t in totals)
        available = {"CPU": total_cpus, "GPU": total_gpus} if available is None else available
        return cls(total_cpus=total_cpus, total_gpus=total_gpus,
                   free_cpus=float(available.get("CPU", 0)), free_gpus=float(available.get("GPU", 0)),
                   nodes=tuple({name: float(amount) for name, amount in t.items()
                                if isinstance(amount, (int, float))} for t in totals),
                   holders=tuple(holders), autoscaling=autoscaling, own_cpus=own[0], own_gpus=own[1])


def _resources_of(resources: dict[str, Any] | None) -> tuple[float, float]:
    resources = resources or {}
    return float(resources.get("CPU", 0) or 0), float(resources.get("GPU", 0) or 0)


def holders_of(actors: Iterable[dict[str, Any]], placement_groups: Iterable[dict[str, Any]],
               job_names: dict[str, str] | None = None, own_job_id: str | None = None) -> list[Holder]:
    """Who holds CPUs or GPUs, from the State API's alive actors and created placement groups (detail rows).

    ``job_names`` maps a Ray job id to the name to show (its submission id); ``own_job_id``'s
    holdings are left out (a stage does not name itself). Largest holders first.
    """
    job_names = job_names or {}
    held: dict[tuple[str, str], list[float]] = {}

    def add(kind: str, name: str, cpus: float, gpus: float) -> None:
        if cpus or gpus:
            entry = held.setdefault((kind, name), [0.0, 0.0])
            entry[0] += cpus
            entry[1] += gpus

    for actor in actors:
        if actor.get("state") != "ALIVE" or actor.get("placement_group_id"):
            continue
        cpus, gpus = _resources_of(actor.get("required_resources"))
        class_name = str(actor.get("class_name") or "")
        if class_name.startswith(SERVE_REPLICA_PREFIX):
            add("serve", class_name[len(SERVE_REPLICA_PREFIX):].split(":")[0], cpus, gpus)
        elif actor.get("job_id") != own_job_id:
            add("job", job_names.get(actor.get("job_id"), str(actor.get("job_id"))), cpus, gpus)
    for group in placement_groups:
        if group.get("state") != "CREATED" or group.get("creator_job_id") == own_job_id:
            continue
        for bundle in group.get("bundles") or []:
            cpus, gpus = _resources_of(bundle.get("unit_resources"))
            job = group.get("creator_job_id")
            add("job", job_names.get(job, str(job)), cpus, gpus)
    holders = [Holder(kind, name, round(cpus, 4), round(gpus, 4)) for (kind, name), (cpus, gpus) in held.items()]
    return sorted(holders, key=lambda holder: (-holder.cpus, -holder.gpus, holder.kind, holder.name))


def _number(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") or "0"


def describe(capacity: Capacity, resource: str = "CPU") -> str:
    """What holds ``resource`` (``CPU`` or ``GPU``) and what is free, in one clause.

    ``1.25 CPU held by Serve apps a, b, c (0.75), job raysubmit_1 (0.5); 0.75 of 2 CPU free``
    """
    index = 0 if resource == "CPU" else 1
    total = capacity.total_cpus if index == 0 else capacity.total_gpus
    free = capacity.free_cpus if index == 0 else capacity.free_gpus
    amounts = [(holder, (holder.cpus, holder.gpus)[index]) for holder in capacity.holders]
    amounts = [(holder, amount) for holder, amount in amounts if amount > 0]
    free_text = f"{_number(free)} of {_number(total)} {resource} free"
    if not amounts:
        return f"nothing else holds {resource}; {free_text}"
    parts = []
    serve = [(holder, amount) for holder, amount in amounts if holder.kind == "serve"]
    if serve:
        names = ", ".join(holder.name for holder, _ in serve)
        parts.append(f"Serve app{'s' if len(serve) > 1 else ''} {names} ({_number(sum(a for _, a in serve))})")
    parts.extend(f"job {holder.name} ({_number(amount)})" for holder, amount in amounts if holder.kind == "job")
    held = sum(amount for _, amount in amounts)
    return f"{_number(held)} {resource} held by {', '.join(parts)}; {free_text}"


@dataclasses.dataclass(frozen=True)
class ResourceRequest:
    """``count`` bundles (workers, trials, an entrypoint) of ``cpus`` CPU + ``gpus`` GPU + ``custom`` each.

    ``setting`` names what to change when the cluster can never meet it.
    """

    what: str
    count: int
    cpus: float
    gpus: float = 0.0
    custom: dict[str, float] = dataclasses.field(default_factory=dict)
    setting: str = ""

    def bundle(self) -> dict[str, float]:
        return {"CPU": self.cpus, "GPU": self.gpus, **self.custom}

    def summary(self) -> str:
        need = " + ".join(f"{_number(amount)} {name}" for name, amount in self.bundle().items() if amount)
        return f"{self.count} {self.what}(s) x {need or 'nothing'}"


def check_request(capacity: Capacity, request: ResourceRequest) -> str | None:
    """Why ``request`` can never run on this cluster, with the numbers; None if it can.

    Each bundle must fit on one node, and all of them on the cluster at once. An autoscaling
    cluster may add nodes, so only a static one is judged (and one whose nodes were listed).
    """
    if capacity.autoscaling or not capacity.nodes:
        return None
    bundle = {name: float(amount) for name, amount in request.bundle().items() if amount}
    problem = None
    if not any(all(node.get(name, 0) >= amount for name, amount in bundle.items()) for node in capacity.nodes):
        largest = {name: max((node.get(name, 0) for node in capacity.nodes), default=0) for name in bundle}
        problem = (f"each {request.what} needs {_needs(bundle)}, but no node has that (the largest have "
                   f"{_needs(largest)})")
    else:
        for name, amount in bundle.items():
            total = sum(node.get(name, 0) for node in capacity.nodes)
            if request.count * amount > total:
                problem = (f"{request.count} {request.what}(s) x {_number(amount)} {name} = "
                           f"{_number(request.count * amount)} {name}, but the cluster has {_number(total)} {name} "
                           "in all")
                break
    if problem is None:
        return None
    return (f"{problem} (a static cluster: no autoscaler can add nodes). Lower {request.setting}, or run on a "
            "cluster with more resources")


def _needs(bundle: dict[str, float]) -> str:
    return " + ".join(f"{_number(amount)} {name}" for name, amount in bundle.items()) or "nothing"


def trial_threads(rows: int, features: int, most: float) -> int:
    """Threads one trial trains with: one per ``CELLS_PER_THREAD`` training cells, 1 to ``most``."""
    return max(1, min(int(most) or 1, math.ceil(rows * max(1, features) / CELLS_PER_THREAD)))


@dataclasses.dataclass(frozen=True)
class TrialPlan:
    """Each trial's reservation, the trials that run at once, and why (the manifest records it)."""

    cpus: float
    gpus: float
    threads: int
    max_concurrent: int
    reason: str


def _floor(value: float, step: float = 0.05) -> float:
    return round(math.floor(value / step + 1e-9) * step, 4)


def plan_trials(capacity: Capacity, *, threads: int, gpus: float, headroom: float,
                cpus_per_trial: float | None = None, max_concurrent: int | None = None) -> TrialPlan:
    """Size trials to what the cluster can give them now.

    A trial reserves the CPUs of its threads while the free CPUs, less ``headroom`` (Ray Data's),
    hold two such trials; on a smaller or busier cluster two trials share what is free in
    fractions (at least ``MIN_CPU_SHARE`` each; their threads still run). As many trials run at
    once as the free CPUs (less the headroom, where it leaves room for two) and GPUs hold.
    ``cpus_per_trial`` and ``max_concurrent`` given in the spec win.
    """
    free = capacity.free_cpus
    if cpus_per_trial is not None:
        cpus, why = float(cpus_per_trial), f"cpus_per_trial={_number(cpus_per_trial)} set in the spec"
    elif free - headroom >= 2 * threads:
        cpus, why = float(threads), (f"{threads} thread(s) per trial from the data's size, {_number(free)} CPU free "
                                     f"less {_number(headroom)} kept for Ray Data")
    else:
        cpus = max(MIN_CPU_SHARE, min(float(threads), _floor(free / 2)))
        why = (f"a small or busy cluster ({_number(free)} of {_number(capacity.total_cpus)} CPU free): two trials "
               f"share what is free, {_number(cpus)} CPU each, {threads} thread(s)")
    if max_concurrent is not None:
        at_once, how = max_concurrent, f"max_concurrent_trials={max_concurrent} set in the spec"
    else:
        usable = free - headroom if free - headroom >= 2 * cpus else free
        at_once = max(1, math.floor(usable / cpus + 1e-9))
        if gpus > 0:
            at_once = max(1, min(at_once, math.floor(capacity.free_gpus / gpus + 1e-9)))
        how = f"{at_once} at once"
    return TrialPlan(cpus=cpus, gpus=gpus, threads=threads, max_concurrent=at_once, reason=f"{why}; {how}")


def fit_workers(capacity: Capacity, workers: int, cpus: float) -> tuple[float, str | None]:
    """Each worker's CPUs: ``cpus`` while the free CPUs hold them all, else an equal share of what is
    free (at least ``MIN_CPU_SHARE``; the worker keeps its threads), and why it was cut."""
    if workers * cpus <= capacity.free_cpus + 1e-9:
        return cpus, None
    share = max(MIN_CPU_SHARE, _floor(capacity.free_cpus / workers))
    if share >= cpus:
        return cpus, None
    return share, (f"{workers} worker(s) x {_number(cpus)} CPU do not fit the {_number(capacity.free_cpus)} CPU free "
                   f"({describe(capacity)}): {_number(share)} CPU each")


def waiting_reason(capacity: Capacity, *, what: str, cpus: float, gpus: float = 0.0) -> str:
    """Why a trial or worker cannot start: what holds the resources and what each needs."""
    need = f"each {what} needs {_number(cpus)} CPU" + (f" + {_number(gpus)} GPU" if gpus else "")
    held = describe(capacity, "CPU")
    if gpus and capacity.free_gpus < gpus:
        held = f"{held}; {describe(capacity, 'GPU')}"
    return f"{held}; {need}"


def fixes(setting: str) -> str:
    """The real fixes for resources held by others, naming the stage's own ``setting``."""
    return ("delete the Serve applications you no longer need (the Ray ML page lists them) or wait for the "
            f"jobs named to end, lower {setting}, or give the cluster more CPUs (`make run RAY_CPUS=`, more "
            "or larger nodes)")


# -- live, inside a Ray job ----------------------------------------------------------------------


def live_capacity() -> Capacity:
    """The connected cluster's capacity now, with who holds what (called inside a Ray job, after ``ray.init``)."""
    import ray
    from ray.util.state import list_actors, list_jobs, list_placement_groups

    own_job = ray.get_runtime_context().get_job_id()
    try:
        actors = [actor.__dict__ if not isinstance(actor, dict) else actor
                  for actor in list_actors(filters=[("state", "=", "ALIVE")], detail=True, limit=10_000,
                                           raise_on_missing_output=False)]
        groups = [group.__dict__ if not isinstance(group, dict) else group
                  for group in list_placement_groups(filters=[("state", "=", "CREATED")], detail=True,
                                                     limit=10_000, raise_on_missing_output=False)]
        names = {}
        for job in list_jobs(raise_on_missing_output=False):
            job = job if isinstance(job, dict) else job.__dict__
            if job.get("job_id"):
                names[job["job_id"]] = job.get("submission_id") or job["job_id"]
        holders = holders_of(actors, groups, names, own_job_id=own_job)
        own = [_resources_of(bundle.get("unit_resources")) for group in groups
               if group.get("creator_job_id") == own_job for bundle in group.get("bundles") or []]
    except Exception:  # the State API is an explanation, not a condition: sizing goes on without it
        holders, own = [], []
    nodes = [{"state": "ALIVE", "resources_total": node.get("Resources", {})} for node in ray.nodes() if node.get("Alive")]
    return Capacity.of_nodes(nodes, available=ray.available_resources(), holders=holders,
                             own=(sum(cpus for cpus, _ in own), sum(gpus for _, gpus in own)))


def bundles_placeable(bundles: list[dict[str, float]], strategy: str, timeout_s: float) -> bool:
    """Whether ``bundles`` can be placed together within ``timeout_s`` (a placement group, released after)."""
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group(bundles, strategy=strategy)
    try:
        return bool(group.wait(timeout_seconds=timeout_s))
    finally:
        remove_placement_group(group)
