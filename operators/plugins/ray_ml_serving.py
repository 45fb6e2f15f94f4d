"""A served application's version history, as the "Ray ML" page shows it.

``RayServeDeployOperator`` appends every decision it takes for an application (promoted, kept the
champion, rolled back, ...) to ``<artifact_root>/serving/<app>/history.json``. This module reads
that file, newest entry first, through ``airflow_ray_ml_stages.artifacts`` (local, s3://, gs://);
the artifact root is the ``ray_ml`` connection's ``artifact_root``, else the operators' default.
A missing or unreadable file becomes a sentence, never an error of the page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_ray_ml.serve_history import history_uri, serving_dir, trial_uri
from airflow_ray_ml_stages import artifacts

# Entries shown per application: the newest ones; the file itself keeps them all.
HISTORY_LIMIT = 50
# What each known action is called on the page; any other action is shown as written.
ACTION_LABELS = {"promoted": "promoted", "kept_champion": "kept champion",
                 "rolled_back": "deploy failed, rolled back", "rollback": "rolled back", "pinned": "pinned",
                 "unchanged": "unchanged", "rollback_failed": "rollback failed"}
# Decisions that kept (or restored) the champion rather than serving the challenger.
_CHAMPION_STAYS = ("kept_champion", "rolled_back")


@dataclass
class HistoryEntry:
    """One decision about an application: when, which DAG run, what it did and why.

    A deploy's decision names a challenger and a champion; a rollback's or pin's (the rollback
    operator's) names the ``version`` it serves and the ``from_version`` it replaces.
    """

    at: str
    action: str
    dag_id: str = ""
    run_id: str = ""
    task_id: str = ""
    challenger_version: str = ""
    champion_version: str = ""
    metric: str = ""
    challenger: float | None = None
    champion: float | None = None
    reason: str = ""
    error: str = ""
    owner: str = ""
    version: str = ""
    from_version: str = ""
    # a challenger tried on live traffic first: "shadow 100 %: 300 rows compared, ..." (empty: none)
    live_trial: str = ""
    # who answered the approval before the promotion: "approved by ana" (empty: none was asked)
    approval: str = ""

    @property
    def label(self) -> str:
        return ACTION_LABELS.get(self.action, self.action.replace("_", " "))

    @property
    def served_version(self) -> str:
        """The version in service after this decision."""
        if self.action in _CHAMPION_STAYS:
            return self.champion_version
        if self.action == "rollback_failed":
            return self.from_version
        return self.version or self.challenger_version

    @property
    def other_version(self) -> str:
        """The version this decision weighed against the served one (replaced, rejected or not restored)."""
        if self.action in _CHAMPION_STAYS:
            return self.challenger_version
        if self.action == "rollback_failed":
            return self.version
        return self.from_version or self.champion_version

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> HistoryEntry:
        def text(key: str) -> str:
            value = raw.get(key)
            return "" if value is None else str(value)

        def number(key: str) -> float | None:
            value = raw.get(key)
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        return cls(at=text("at"), action=text("action") or "unknown", dag_id=text("dag_id"), run_id=text("run_id"),
                   task_id=text("task_id"), challenger_version=text("challenger_version"),
                   champion_version=text("champion_version"), metric=text("metric"),
                   challenger=number("challenger"), champion=number("champion"), reason=text("reason"),
                   error=text("error"), owner=text("owner"), version=text("version"),
                   from_version=text("from_version"), live_trial=live_trial_text(raw.get("rollout")),
                   approval=approval_text(raw.get("approval")))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _ms(side: Any) -> str:
    p50 = ((side.get("answer_ms") if isinstance(side, dict) else None) or {}).get("p50")
    return f"{p50:.1f}" if isinstance(p50, (int, float)) and not isinstance(p50, bool) else "?"


def live_trial_text(rollout: Any) -> str:
    """A decision's shadow or canary in one line: traffic, rows, agreement, failures, answer times, labelled rows."""
    if not isinstance(rollout, dict) or not rollout.get("mode"):
        return ""
    share = rollout.get("share")
    challenger = rollout.get("challenger") if isinstance(rollout.get("challenger"), dict) else {}
    champion = rollout.get("champion") if isinstance(rollout.get("champion"), dict) else {}
    parts = [f"{rollout['mode']} {share:.0%}" if isinstance(share, (int, float)) else str(rollout["mode"])]
    if rollout["mode"] == "shadow":
        parts.append(f"{_count(rollout.get('compared_rows'))} rows compared")
    else:
        parts.append(f"{_count(challenger.get('rows'))} rows answered")
    agreement = rollout.get("agreement")
    if isinstance(agreement, (int, float)) and not isinstance(agreement, bool):
        parts.append(f"agreement {agreement:.0%}")
    parts.append(f"failed {_count(challenger.get('failures'))} of {_count(challenger.get('requests'))} requests")
    parts.append(f"answer time {_ms(challenger)} ms vs {_ms(champion)} ms")
    live = rollout.get("live") if isinstance(rollout.get("live"), dict) else {}
    if _count(live.get("rows")):
        mine, theirs = live.get("challenger"), live.get("champion")
        if isinstance(mine, (int, float)) and isinstance(theirs, (int, float)):
            parts.append(f"live {live.get('metric')} {mine:.4f} vs {theirs:.4f} on {live['rows']} labelled rows")
    return ", ".join(parts)


def trial_progress_text(rollout: dict[str, Any], record: Any) -> str:
    """The live trial the application's config carries (``rollout``: mode, share, challenger version),
    with what its deploy last kept of it (``record``, ``serve_history.trial_uri``) where that is this
    trial's: "shadow 100% of <version> beside <champion> since …: 120 of 300 rows compared, …"."""
    version, mode = rollout.get("challenger_version") or "?", rollout.get("mode") or "trial"
    if not isinstance(record, dict) or record.get("challenger_version") != version:
        return f"{mode} of {version} starting: no statistics yet"
    stats = record.get("stats") if isinstance(record.get("stats"), dict) else {}
    seen = live_trial_text({**stats, "mode": mode, "share": record.get("share")})
    done = stats.get("compared_rows") if mode == "shadow" else (stats.get("challenger") or {}).get("rows")
    head = f"{mode} of {version} beside {record.get('champion_version') or '?'} since {record.get('started_at', '?')}"
    ends = f"the verdict by {record['ends_by']} at the latest" if record.get("ends_by") else "its replica starting"
    return (f"{head}: {_count(done)} of {_count(record.get('rows_wanted'))} rows for the verdict; {seen} "
            f"(as of {record.get('updated_at', '?')}; {ends})")


def read_trial(root: str | None, app_name: str, rollout: dict[str, Any]) -> str:
    """:func:`trial_progress_text` for the application's live trial, its record read from the serving directory."""
    try:
        uri = trial_uri(serving_dir(root, app_name))
        record = artifacts.read_json(uri) if artifacts.exists(uri) else None
    except Exception as err:  # shown, never an error of the page
        return f"{rollout.get('mode') or 'trial'} of {rollout.get('challenger_version') or '?'}: its progress cannot be read: {err}"
    return trial_progress_text(rollout, record)


def approval_text(approval: Any) -> str:
    """Who answered a decision's approval, how, and, for an approval, why: "approved by ana: <the reason
    typed>", "rejected by ana" (a rejection's reason is the decision's own), "rejected: no answer in time"."""
    if not isinstance(approval, dict):
        return ""
    who, reason = approval.get("by"), approval.get("reason")
    if not who:
        return "rejected: no answer in time" if not approval.get("approved") else "approved"
    if not approval.get("approved"):
        return f"rejected by {who}"
    return f"approved by {who}" + (f": {reason}" if reason else "")


@dataclass
class ServingHistory:
    uri: str
    entries: list[HistoryEntry] = field(default_factory=list)
    total: int = 0
    error: str | None = None


def artifact_root(conn_id: str) -> str | None:
    """Where deploys write their serving history: the connection's ``artifact_root`` (None: the default).

    Reading the connection also gives this process its storage connection's credentials for that
    root (``storage_conn_id``), so call it before reading any artifact of the connection's.
    """
    from airflow_ray_ml.hooks.ray import RayHook

    return RayHook(conn_id).artifact_root


def read_history(root: str | None, app_name: str, limit: int = HISTORY_LIMIT) -> ServingHistory:
    """The application's decisions, newest first (at most ``limit``), or the reason they cannot be read."""
    try:
        uri = history_uri(serving_dir(root, app_name))
    except Exception as err:  # an application name no store accepts
        return ServingHistory(uri="", error=f"no serving history can exist for {app_name!r}: {err}")
    history = ServingHistory(uri=uri)
    try:
        if not artifacts.exists(uri):
            history.error = f"No deploy has recorded a decision for this application yet ({uri})."
            return history
        raw = artifacts.read_json(uri)
    except Exception as err:
        history.error = f"The serving history {uri} cannot be read: {err}"
        return history
    if not isinstance(raw, list):
        history.error = f"The serving history {uri} is not a JSON list of decisions."
        return history
    entries = [HistoryEntry.from_dict(item) for item in raw if isinstance(item, dict)]
    # Appended in order; sorted by time too, in case two writers' entries interleave.
    entries = sorted(enumerate(entries), key=lambda pair: (pair[1].at, pair[0]), reverse=True)
    history.entries = [entry for _, entry in entries][:limit]
    history.total = len(entries)
    return history
