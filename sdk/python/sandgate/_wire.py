"""What the sync and async clients share, without I/O: each client only sends and awaits.

- Requests: paths, headers (the token, ``Idempotency-Key``), query parameters and bodies of
  every call (:func:`sandbox_path`, :func:`request_headers`, :func:`list_params`, ...), and
  the retry decision on an error answer (:func:`retry_delay`, which raises when the
  :class:`~sandgate.retry.RetryPolicy` says not to send again).
- Answers: :func:`info` (a sandbox view), :func:`keep_info` (a lifecycle answer, keeping
  the egress token only the create showed), :func:`next_page`.
- Following a create: :func:`should_follow`, :class:`EventFollow` (``Last-Event-ID`` resume
  and when to give up), :func:`create_outcome` (the error a failed create raises).
- Exec output: :class:`ExecOutput` collects events into the :class:`ExecResult`.
- Server-sent events (``GET /v1/sandboxes/{id}/events``): :class:`SseParser` turns lines into
  :class:`~sandgate.models.Event` values (``event:``, ``id:``, ``data:`` lines, a blank line
  ends an event, ``:`` lines are keep-alive comments).
- Exec output (``POST /v1/sandboxes/{id}/exec``): NDJSON, one object a line, decoded by
  :func:`exec_event` (``text`` for UTF-8 chunks, ``base64`` for the rest).
- A create that ended in ``failed`` is reported by its ``done`` event with the stored error
  body; :func:`failed_create_error` gives the error the create itself would have answered
  (the gateway's ``failed_create``: refusals 403, a rejected request 422, anything else 503).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import json
import os
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote

import httpx

from .errors import SandgateError, error_from_response
from .models import Credential, Delegation, Event, ExecEvent, ExecResult, SandboxInfo, Secret
from .retry import RetryPolicy
from .schema import CreateBody, CredentialBody, ExecBody, MintBody, SandboxView, SnapshotBody

DEFAULT_TIMEOUT = 30.0
# Streamed answers (exec output, events) may pause for long: no read timeout.
STREAM_TIMEOUT = httpx.Timeout(DEFAULT_TIMEOUT, read=None)
USER_AGENT = "sandgate-python/0.1.0"
SANDBOXES = "/v1/sandboxes"
EXPLAIN = "/v1/routes:explain"
POOLS = "/v1/pools"
OCTET_STREAM = {"content-type": "application/octet-stream"}


def base_url_from(value: Optional[str]) -> str:
    url = value or os.environ.get("SANDGATE_URL")
    if not url:
        raise ValueError("no gateway URL: pass base_url= or set SANDGATE_URL")
    return url.rstrip("/")


def token_from(value: Optional[str]) -> str:
    token = value or os.environ.get("SANDGATE_TOKEN")
    if not token:
        raise ValueError("no API token: pass token= or set SANDGATE_TOKEN")
    return token


def seg(value: str) -> str:
    """One path segment, escaped (ids and names never need it; a caller's typo must not
    reach another endpoint)."""
    return quote(value, safe="")


def argv_of(command: Union[str, Sequence[str]]) -> List[str]:
    """A string is a shell command line (``sh -c``); a sequence is the argv itself."""
    if isinstance(command, str):
        return ["sh", "-c", command]
    return [str(a) for a in command]


def exec_body(
    command: Union[str, Sequence[str]],
    env: Optional[Mapping[str, str]],
    cwd: Optional[str],
    timeout: Optional[float],
) -> ExecBody:
    body: ExecBody = {"argv": argv_of(command)}
    if env:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    if timeout is not None:
        body["timeout_ms"] = max(1, int(timeout * 1000))
    return body


def exec_event(line: str) -> Optional[ExecEvent]:
    line = line.strip()
    if not line:
        return None
    raw = json.loads(line)
    kind = raw.get("type", "")
    if kind in ("stdout", "stderr"):
        if "base64" in raw:
            data = base64.b64decode(raw["base64"])
        else:
            data = str(raw.get("text", "")).encode()
        return ExecEvent(type=kind, data=data, raw=raw)
    return ExecEvent(type=kind, data=b"", raw=raw)


class SseParser:
    """Incremental: feed lines (without their newline), get complete events."""

    def __init__(self) -> None:
        self._event = ""
        self._id: Optional[str] = None
        self._data: List[str] = []

    def feed(self, line: str) -> Optional[Event]:
        if line == "":
            if not self._data:
                self._event = ""
                return None
            data = "\n".join(self._data)
            event = Event(
                type=self._event or "message",
                id=self._id,
                data=json.loads(data) if data else None,
            )
            self._event, self._data = "", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        return None


_FAILED_CREATE_STATUS = {
    "forbidden": 403,
    "policy_denied": 403,
    "billing_refused": 403,
    "invalid_request": 422,
}


def failed_create_error(done: Mapping[str, Any], request_id: Optional[str]) -> SandgateError:
    stored = done.get("error")
    body: Dict[str, Any] = stored if isinstance(stored, dict) else {}
    inner_raw = body.get("error")
    inner: Dict[str, Any] = inner_raw if isinstance(inner_raw, dict) else {}
    code_raw = inner.get("code")
    code = code_raw if isinstance(code_raw, str) else "creation_failed"
    status = _FAILED_CREATE_STATUS.get(code, 503)
    headers = _Headers({"x-request-id": request_id} if request_id else {})
    return error_from_response(status, body or {"error": {"code": code}}, headers)


class _Headers(Dict[str, str]):
    """Lower-case names, looked up case-insensitively (as httpx's headers are)."""

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)


def decode_json(content: bytes) -> Any:
    try:
        return json.loads(content) if content else None
    except ValueError:
        return None


def error_of(status: int, content: bytes, headers: Any) -> SandgateError:
    return error_from_response(status, decode_json(content), headers)


def connection_error(exc: Exception) -> SandgateError:
    # Not an answer from the gateway: no status, and never retried (the request may have
    # reached it).
    return SandgateError("connection_failed", f"{type(exc).__name__}: {exc}")


# Create states that mean the create is still being placed.
PLACING = frozenset({"pending", "provisioning", "reconciling"})


# ------------------------------------------------------------------------ clients


class ClientBase:
    """The settings both clients hold and what they derive from them without I/O."""

    def __init__(
        self,
        base_url: Optional[str],
        token: Optional[str],
        workspace: Optional[str],
        retry: Optional[RetryPolicy],
        sandbox_id: Optional[str],
    ) -> None:
        self.base_url = base_url_from(base_url)
        self._token = token_from(token)
        self.workspace = workspace or os.environ.get("SANDGATE_WORKSPACE") or None
        self.retry = retry or RetryPolicy()
        self._delegated_sandbox = sandbox_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r})"

    def _url(self, path: str) -> str:
        return self.base_url + path

    def _headers(
        self, extra: Optional[Mapping[str, str]], idempotency_key: Optional[str] = None
    ) -> Dict[str, str]:
        return request_headers(self._token, extra, idempotency_key)

    def _sandbox_id(self, id: Optional[str]) -> str:
        sandbox_id = id or self._delegated_sandbox
        if not sandbox_id:
            raise ValueError("which sandbox? pass its id")
        return sandbox_id

    def _workspace(self, workspace: Optional[str]) -> str:
        ws = workspace or self.workspace
        if not ws:
            raise ValueError(f"which workspace? pass workspace= here or to {type(self).__name__}(...)")
        return ws


def delegated(delegation: Union[Delegation, str]) -> Tuple[str, Optional[str]]:
    """The token and sandbox id an agent's client is built from."""
    if isinstance(delegation, Delegation):
        if not delegation.token:
            raise ValueError("this Delegation has no token: only the mint's answer carries it")
        return delegation.token, delegation.sandbox_id
    return delegation, None


def request_headers(
    token: str, extra: Optional[Mapping[str, str]] = None, idempotency_key: Optional[str] = None
) -> Dict[str, str]:
    headers = {"authorization": f"Bearer {token}", "user-agent": USER_AGENT}
    headers.update(extra or {})
    if idempotency_key:
        headers["idempotency-key"] = idempotency_key
    return headers


def retry_delay(
    policy: RetryPolicy,
    attempt: int,
    method: str,
    status: int,
    content: bytes,
    headers: Any,
    idempotency_key: Optional[str] = None,
) -> float:
    """Seconds to wait before sending again after send number ``attempt`` failed with this
    answer; raises the answer's error when the policy says not to send again."""
    error = error_of(status, content, headers)
    delay = policy.delay(attempt, method, error, idempotency_key=idempotency_key)
    if delay is None:
        raise error
    return delay


# -------------------------------------------------------------------------- paths


def sandbox_path(id: str, rest: str = "") -> str:
    return f"{SANDBOXES}/{seg(id)}{rest}"


def files_path(sandbox_id: str, rest: str = "") -> str:
    return sandbox_path(sandbox_id, "/files" + rest)


def events_path(sandbox_id: str) -> str:
    return sandbox_path(sandbox_id, "/events")


def cancel_path(sandbox_id: str, exec_id: str) -> str:
    return sandbox_path(sandbox_id, f"/exec/{seg(exec_id)}/cancel")


def credentials_path(workspace: str, name: Optional[str] = None) -> str:
    path = f"/v1/workspaces/{seg(workspace)}/credentials"
    return path + (f"/{seg(name)}" if name else "")


def delegations_path(sandbox_id: str) -> str:
    return sandbox_path(sandbox_id, "/delegations")


def delegation_path(delegation_id: str) -> str:
    return f"/v1/delegations/{seg(delegation_id)}"


# ------------------------------------------------------------- bodies and params


def create_payload(body: Optional[CreateBody], dry_run: bool) -> Dict[str, Any]:
    payload: Dict[str, Any] = dict(body or {})
    if dry_run:
        payload["dry_run"] = True
    return payload


def list_params(
    state: Optional[str], label: Optional[Mapping[str, str]], workspace: Optional[str], page_size: int
) -> Dict[str, Any]:
    params: Dict[str, Any] = {"limit": page_size}
    if state:
        params["state"] = state
    if workspace:
        params["workspace"] = workspace
    if label:
        if len(label) != 1:
            raise ValueError("the API filters on one label: pass {key: value}")
        ((k, v),) = label.items()
        params["label"] = f"{k}={v}"
    return params


def next_page(page: Mapping[str, Any], params: Dict[str, Any]) -> Tuple[List[SandboxView], bool]:
    """A page's sandboxes, and whether another page follows (``params`` then asks for it)."""
    rows: List[SandboxView] = list(page.get("sandboxes") or [])
    cursor = page.get("next_cursor")
    if cursor:
        params["cursor"] = cursor
    return rows, bool(cursor)


def path_params(path: str, flag: Optional[Tuple[str, bool]] = None) -> Dict[str, str]:
    params = {"path": path}
    if flag is not None:
        params[flag[0]] = "true" if flag[1] else "false"
    return params


def file_content(data: Union[bytes, str]) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


def snapshot_body(kind: Optional[str], paths: Optional[Sequence[str]]) -> Optional[SnapshotBody]:
    body: SnapshotBody = {}
    if kind:
        body["kind"] = kind
    if paths is not None:
        body["paths"] = list(paths)
    return body or None


def _reveal(secret: Union[str, Secret]) -> str:
    return secret.reveal() if isinstance(secret, Secret) else secret


def credential_body(
    name: str,
    secret: Union[str, Secret],
    destinations: Sequence[Mapping[str, Any]],
    apply: Mapping[str, Any],
    placeholder_env: Optional[str],
    user: Optional[str],
    scrub_response_body: bool,
) -> CredentialBody:
    body: CredentialBody = {
        "name": name,
        "secret": _reveal(secret),
        "destinations": [dict(d) for d in destinations],  # type: ignore[misc]
        "apply": dict(apply),  # type: ignore[typeddict-item]
        "scrub_response_body": scrub_response_body,
    }
    if placeholder_env:
        body["placeholder_env"] = placeholder_env
    if user:
        body["user"] = user
    return body


def rotated_body(current: Credential, secret: Union[str, Secret]) -> CredentialBody:
    """``current`` with a new secret (destinations and how it is applied kept)."""
    body: CredentialBody = {
        "secret": _reveal(secret),
        "destinations": current.destinations,  # type: ignore[typeddict-item]
        "apply": current.apply,  # type: ignore[typeddict-item]
        "scrub_response_body": bool(current.raw.get("scrub_response_body")),
    }
    if current.placeholder_env:
        body["placeholder_env"] = current.placeholder_env
    if current.user:
        body["user"] = current.user
    return body


def mint_body(
    agent: str, actions: Sequence[str], until: Optional[_dt.datetime], ttl_secs: Optional[int]
) -> MintBody:
    body: MintBody = {"agent": agent, "actions": list(actions)}
    seconds = ttl(until, ttl_secs)
    if seconds is not None:
        body["ttl_secs"] = seconds
    return body


def ttl(until: Optional[_dt.datetime], ttl_secs: Optional[int]) -> Optional[int]:
    if until is not None and ttl_secs is not None:
        raise ValueError("pass until= or ttl_secs=, not both")
    if until is None:
        return ttl_secs
    if until.tzinfo is None:
        raise ValueError("until must be timezone-aware (e.g. datetime.now(timezone.utc) + ...)")
    now = _dt.datetime.now(_dt.timezone.utc)
    return max(1, int((until - now).total_seconds()))


def minted(raw: Mapping[str, Any]) -> Delegation:
    return Delegation.from_json(raw["delegation"], token=raw.get("token"))


# ------------------------------------------------------------------------ answers


def info(raw: SandboxView) -> SandboxInfo:
    return SandboxInfo(**SandboxInfo.fields_from(raw))


def with_token(info: Optional[SandboxInfo], token: Optional[str]) -> Optional[SandboxInfo]:
    """``info`` holding ``token`` (the egress token only the create's answer shows)."""
    if info is None or token is None:
        return info
    return dataclasses.replace(info, egress_token=token)


def keep_info(current: Optional[SandboxInfo], raw: Any) -> Optional[SandboxInfo]:
    """What a handle knows after an answer that may show the sandbox (its token kept)."""
    if isinstance(raw, dict) and "id" in raw:
        token = current.egress_token if current else None
        view: SandboxView = raw  # type: ignore[assignment]
        return with_token(info(view), token)
    return current


# ---------------------------------------------------------------- following creates


def should_follow(created: SandboxInfo, wait: bool, on_event: Any) -> bool:
    """Whether a create's answer is followed over its events: when waiting and it is still
    being placed, or the caller watches (a replay of a create already over is not)."""
    return wait and (created.state in PLACING or on_event is not None)


def create_outcome(done: Optional[Mapping[str, Any]], sandbox_id: str, request_id: Optional[str]) -> None:
    """Raises what the followed create ended in, unless it runs."""
    if done is None:
        raise SandgateError("timeout", f"sandbox {sandbox_id} was still being placed")
    if done.get("state") == "failed":
        raise failed_create_error(done, request_id)


class EventFollow:
    """The state of following one create's events across streams: the last event id (sent
    as ``Last-Event-ID``, so no event is lost or repeated), and when to give up (a deadline,
    or more than five streams in a row that brought nothing)."""

    MAX_FAILURES = 5

    def __init__(self, sandbox_id: str, last_event_id: Optional[str], deadline: Optional[float]) -> None:
        self.sandbox_id = sandbox_id
        self.last = last_event_id
        self.deadline = deadline
        self.failures = 0
        self.received = False
        self.parser = SseParser()

    def going(self) -> bool:
        return self.deadline is None or time.monotonic() < self.deadline

    def open(self) -> Optional[Dict[str, str]]:
        """A new stream begins; the headers it is asked with."""
        self.parser = SseParser()
        self.received = False
        return {"last-event-id": self.last} if self.last else None

    def feed(self, line: str) -> Optional[Event]:
        event = self.parser.feed(line)
        if event is not None:
            self.failures, self.received = 0, True
            self.last = event.id or self.last
        return event

    def over(self, event: Event) -> bool:
        """Whether ``event`` (just yielded) ends the following."""
        return event.type == "done" or not self.going()

    def ended(self) -> None:
        """A stream ended without ``done``: the same as a dropped connection if it brought
        nothing new."""
        if not self.received:
            self.failures += 1
            if self.failures > self.MAX_FAILURES:
                raise SandgateError("events_ended", f"the events of {self.sandbox_id} stopped before `done`")

    def failed(self, e: Exception) -> None:
        """A stream could not be opened or broke: raises unless it is worth another."""
        if isinstance(e, SandgateError) and e.code != "connection_failed":
            raise e
        self.failures += 1
        if self.failures > self.MAX_FAILURES:
            raise connection_error(e) from None

    def pause(self) -> float:
        return min(0.2 * (self.failures + 1), 2.0)


# ---------------------------------------------------------------------------- exec


class ExecOutput:
    """A command's output as it arrives: ``exec_id`` once started, ``result`` once it
    exits, the output events kept for it."""

    def __init__(self) -> None:
        self.exec_id: Optional[str] = None
        self.result: Optional[ExecResult] = None
        self._events: List[ExecEvent] = []

    def _take(self, line: str) -> Optional[ExecEvent]:
        event = exec_event(line)
        if event is None:
            return None
        if event.type == "started":
            self.exec_id = event.raw.get("exec_id")
        elif event.type == "exit":
            self.result = exec_result(self.exec_id, self._events, event.raw)
        else:
            self._events.append(event)
        return event

    def _finish(self) -> None:
        if self.result is None:
            raise SandgateError("exec_interrupted", "the output stream ended before the exit")


def exec_result(exec_id: Optional[str], events: Iterable[ExecEvent], exit: Mapping[str, Any]) -> ExecResult:
    kept = list(events)
    return ExecResult(
        exit_code=exit.get("code"),
        signal=exit.get("signal"),
        reason=str(exit.get("reason", "")),
        stdout_bytes=b"".join(e.data for e in kept if e.type == "stdout"),
        stderr_bytes=b"".join(e.data for e in kept if e.type == "stderr"),
        exec_id=exec_id,
        events=kept,
    )
