"""Values the clients return, read from the answers the OpenAPI document types.

Each class here is read from the generated TypedDict of its answer in :mod:`sandgate.schema`
(``SandboxView``, ``AttemptRecord``, ``DryRunPlan``, ``CredentialView``, ``DelegationView``;
regenerated from ``GET /openapi.json`` and checked against the served document in CI), so a
field the gateway drops or renames fails ``mypy --strict`` here and
``tests/test_models.py``; explain answers and pools are the generated TypedDicts themselves.
Every class keeps the answer it was read from in ``raw``, so a field the gateway adds is
never lost.

Secrets: the egress token of a new sandbox and a delegation's token are kept out of
``repr`` (and so out of logs and tracebacks that print these values); read them from the
``egress_token`` / ``token`` attributes when you mean to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from . import schema


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of a create on a pool (the sandbox's ``attempts[]``, and the
    ``attempt_started``/``attempt_ended`` events)."""

    id: str
    seq: int
    pool: str
    provider: str = ""
    account: str = ""
    state: str = ""
    outcome: Optional[str] = None
    error_class: Optional[str] = None
    message: Optional[str] = None
    duration_ms: Optional[int] = None

    #: The generated type of the answer this class reads.
    SCHEMA = "AttemptRecord"

    @classmethod
    def from_json(cls, raw: schema.AttemptRecord) -> "AttemptRecord":
        return cls(
            id=str(raw.get("id", "")),
            seq=int(raw.get("seq") or 0),
            pool=str(raw.get("pool", "")),
            provider=str(raw.get("provider") or ""),
            account=str(raw.get("account") or ""),
            state=str(raw.get("state") or ""),
            outcome=raw.get("outcome"),
            error_class=raw.get("error_class"),
            message=raw.get("message"),
            duration_ms=raw.get("duration_ms"),
        )


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as ``GET /v1/sandboxes/{id}`` shows it."""

    id: str
    workspace: str
    state: str
    labels: Dict[str, str] = field(default_factory=dict)
    placement: Optional[Dict[str, Any]] = None
    attempts: List[AttemptRecord] = field(default_factory=list)
    error: Optional[Dict[str, Any]] = None
    created_ms: Optional[int] = None
    expires_ms: Optional[int] = None
    #: Shown once, by the create that made the sandbox; None on every other answer.
    egress_token: Optional[str] = field(default=None, repr=False)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    SCHEMA = "SandboxView"

    @property
    def pool(self) -> Optional[str]:
        pool = (self.placement or {}).get("pool")
        return pool if isinstance(pool, str) else None

    @classmethod
    def fields_from(cls, raw: schema.SandboxView) -> Dict[str, Any]:
        egress_raw = raw.get("egress")
        egress: Dict[str, Any] = dict(egress_raw) if isinstance(egress_raw, dict) else {}
        return dict(
            id=str(raw["id"]),
            workspace=str(raw.get("workspace", "")),
            state=str(raw.get("state", "")),
            labels=dict(raw.get("labels") or {}),
            placement=raw.get("placement"),
            attempts=[AttemptRecord.from_json(a) for a in raw.get("attempts") or []],
            error=raw.get("error"),
            created_ms=raw.get("created_ms"),
            expires_ms=raw.get("expires_ms"),
            egress_token=egress.get("token"),
            raw=_without_token(dict(raw), egress),
        )


def _without_token(raw: Dict[str, Any], egress: Dict[str, Any]) -> Dict[str, Any]:
    """``raw`` minus the egress token (kept in ``egress_token`` only, out of ``repr``)."""
    out = dict(raw)
    if "token" in egress:
        out["egress"] = {k: v for k, v in egress.items() if k != "token"}
    return out


@dataclass(frozen=True)
class Event:
    """One server-sent event of a create: ``state``, ``attempt_started``,
    ``attempt_ended`` or ``done``; ``id`` is what ``Last-Event-ID`` resumes after."""

    type: str
    id: Optional[str]
    data: Any

    @property
    def attempt(self) -> Optional[AttemptRecord]:
        if self.type in ("attempt_started", "attempt_ended") and isinstance(self.data, dict):
            data: schema.AttemptRecord = self.data  # type: ignore[assignment]
            return AttemptRecord.from_json(data)
        return None


@dataclass(frozen=True)
class ExecEvent:
    """One line of an exec's output stream: ``started``, ``stdout``, ``stderr`` or ``exit``."""

    type: str
    data: bytes = b""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ExecResult:
    """A finished command: exit code (None when killed by a signal), why it ended
    (``exited``, ``timed_out``, ``cancelled``), and its output."""

    exit_code: Optional[int]
    signal: Optional[int]
    reason: str
    stdout_bytes: bytes = field(default=b"", repr=False)
    stderr_bytes: bytes = field(default=b"", repr=False)
    exec_id: Optional[str] = None
    #: Every output event in the order the gateway sent them (interleaving kept).
    events: List[ExecEvent] = field(default_factory=list, repr=False)

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", errors="replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class FileEntry:
    """One entry of ``files.list`` (the generated ``SandboxEntry``): ``kind`` is ``file``,
    ``dir``, ``symlink`` or ``other``."""

    SCHEMA = "SandboxEntry"

    name: str
    kind: str
    size: Optional[int] = None
    mode: Optional[int] = None
    modified_unix: Optional[int] = None

    @classmethod
    def from_json(cls, raw: schema.SandboxEntry) -> "FileEntry":
        return cls(
            name=str(raw.get("name", "")),
            kind=str(raw.get("kind", "")),
            size=raw.get("size"),
            mode=raw.get("mode"),
            modified_unix=raw.get("modified_unix"),
        )


@dataclass(frozen=True)
class Credential:
    """A workspace credential's metadata. The secret goes in and never comes out."""

    workspace: str
    name: str
    destinations: List[Dict[str, Any]]
    apply: Dict[str, Any]
    placeholder_env: Optional[str] = None
    user: Optional[str] = None
    version: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    SCHEMA = "CredentialView"

    @classmethod
    def from_json(cls, raw: schema.CredentialView) -> "Credential":
        return cls(
            workspace=str(raw.get("workspace", "")),
            name=str(raw.get("name", "")),
            destinations=[dict(d) for d in raw.get("destinations") or []],
            apply=dict(raw.get("apply") or {}),
            placeholder_env=raw.get("placeholder_env"),
            user=raw.get("user"),
            version=raw.get("version"),
            raw=dict(raw),
        )


@dataclass(frozen=True)
class Delegation:
    """A delegated capability: ``actions`` on ``sandbox_id`` until ``expires_ms``.

    ``token`` is set only on the answer to the mint (the gateway shows it once).
    """

    id: str
    sandbox_id: str
    agent: str
    actions: List[str]
    expires_ms: int
    workspace: str = ""
    delegator: str = ""
    revoked_ms: Optional[int] = None
    token: Optional[str] = field(default=None, repr=False)

    SCHEMA = "DelegationView"

    @classmethod
    def from_json(cls, raw: schema.DelegationView, token: Optional[str] = None) -> "Delegation":
        return cls(
            id=str(raw.get("id", "")),
            sandbox_id=str(raw.get("sandbox_id", "")),
            agent=str(raw.get("agent", "")),
            actions=list(raw.get("actions") or []),
            expires_ms=int(raw.get("expires_ms") or 0),
            workspace=str(raw.get("workspace", "")),
            delegator=str(raw.get("delegator", "")),
            revoked_ms=raw.get("revoked_ms"),
            token=token,
        )


class Secret:
    """A secret to send once; never shown by ``repr``/``str``."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


@dataclass(frozen=True)
class Plan:
    """A dry run's answer: what a create of this body would do; nothing was created."""

    would_create: bool
    first_pool: Optional[str]
    #: Every candidate pool in routing order: ``decision`` (attempt, skip, refused) and
    #: ``reached`` (first, on_failover, never).
    plan: List[schema.PlanStep] = field(default_factory=list)
    refused: List[schema.RefusedPool] = field(default_factory=list)
    error: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    SCHEMA = "DryRunPlan"

    @classmethod
    def from_json(cls, raw: schema.DryRunPlan) -> "Plan":
        return cls(
            would_create=bool(raw.get("would_create")),
            first_pool=raw.get("first_pool"),
            plan=list(raw.get("plan") or []),
            refused=list(raw.get("refused") or []),
            error=raw.get("error"),
            raw=dict(raw),
        )


__all__ = [
    "AttemptRecord",
    "Credential",
    "Delegation",
    "Event",
    "ExecEvent",
    "ExecResult",
    "FileEntry",
    "Plan",
    "SandboxInfo",
    "Secret",
]
