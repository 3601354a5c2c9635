"""The synchronous client (:class:`Client`); :mod:`sandgate.aio` has the same API with ``async``.

Every call is one or more requests to the gateway's ``/v1`` API; a failure the gateway
answers raises the class of :mod:`sandgate.errors` its code maps to, carrying the request id
from ``X-Request-Id``. Requests are sent again only under :class:`sandgate.RetryPolicy`'s rule
(idempotent methods, or a create with an ``Idempotency-Key``; on 429/503 only).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import time
from typing import (
    Any,
    Callable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Union,
    overload,
)

from typing import Literal

import httpx

from . import _wire
from .errors import SandgateError
from .models import (
    Credential,
    Delegation,
    Event,
    ExecEvent,
    ExecResult,
    FileEntry,
    Plan,
    SandboxInfo,
    Secret,
)
from .retry import RetryPolicy
from .schema import (
    CreateBody,
    Explanation,
    FileList,
    PoolView,
    PortAccess,
    SandboxView,
    SnapshotTaken,
    TimeoutBody,
)

EventCallback = Callable[[Event], None]
Command = Union[str, Sequence[str]]


class Client(_wire.ClientBase):
    """A client of one gateway with one API token (or one delegated token).

    ``base_url``, ``token`` and ``workspace`` default to ``SANDGATE_URL``, ``SANDGATE_TOKEN``
    and ``SANDGATE_WORKSPACE``; ``workspace`` is the default of workspace-scoped calls
    (credentials).
    """

    def __init__(
        self,
        base_url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        workspace: Optional[str] = None,
        retry: Optional[RetryPolicy] = None,
        timeout: float = _wire.DEFAULT_TIMEOUT,
        http: Optional[httpx.Client] = None,
        _sandbox_id: Optional[str] = None,
    ) -> None:
        super().__init__(base_url, token, workspace, retry, _sandbox_id)
        self._http = http or httpx.Client(timeout=timeout)
        self._owns_http = http is None
        self.sandboxes = Sandboxes(self)
        self.routes = Routes(self)
        self.pools = Pools(self)
        self.credentials = Credentials(self)
        self.delegations = Delegations(self)

    @classmethod
    def from_delegation(
        cls,
        delegation: Union[Delegation, str],
        base_url: Optional[str] = None,
        **kwargs: Any,
    ) -> "Client":
        """The agent's side of a delegation: a client holding only the delegated token.

        The gateway lets it do exactly the delegation's actions on its sandbox
        (``client.sandbox()``); anything else answers ``PermissionDenied``
        (``delegation_scope``).
        """
        token, sandbox_id = _wire.delegated(delegation)
        return cls(base_url, token, _sandbox_id=sandbox_id, **kwargs)

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def sandbox(self, id: Optional[str] = None) -> "Sandbox":
        """A handle on sandbox ``id`` without reading it (a delegated client cannot read
        sandboxes; with no ``id``, the delegation's sandbox)."""
        return Sandbox(self, self._sandbox_id(id))

    # ---------------------------------------------------------------- transport

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: Optional[bytes] = None,
        params: Optional[Mapping[str, Any]] = None,
        headers: Optional[Mapping[str, str]] = None,
        idempotency_key: Optional[str] = None,
    ) -> httpx.Response:
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._http.request(
                    method,
                    self._url(path),
                    json=json,
                    content=content,
                    params=params,
                    headers=self._headers(headers, idempotency_key),
                )
            except httpx.TransportError as e:
                raise _wire.connection_error(e) from None
            if response.status_code < 400:
                return response
            time.sleep(
                _wire.retry_delay(
                    self.retry,
                    attempt,
                    method,
                    response.status_code,
                    response.content,
                    response.headers,
                    idempotency_key,
                )
            )

    @contextlib.contextmanager
    def _stream(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        headers: Optional[Mapping[str, str]] = None,
    ) -> Iterator[httpx.Response]:
        """A streamed answer (exec output, events); no read timeout: output may pause."""
        attempt = 0
        while True:
            attempt += 1
            try:
                request = self._http.build_request(
                    method,
                    self._url(path),
                    json=json,
                    headers=self._headers(headers),
                    timeout=_wire.STREAM_TIMEOUT,
                )
                response = self._http.send(request, stream=True)
            except httpx.TransportError as e:
                raise _wire.connection_error(e) from None
            if response.status_code < 400:
                try:
                    yield response
                finally:
                    response.close()
                return
            content = response.read()
            response.close()
            time.sleep(
                _wire.retry_delay(self.retry, attempt, method, response.status_code, content, response.headers)
            )

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return _wire.decode_json(self._request(method, path, **kwargs).content)


class Sandboxes:
    def __init__(self, client: Client) -> None:
        self._c = client

    @overload
    def create(
        self,
        body: Optional[CreateBody] = ...,
        *,
        dry_run: Literal[True],
        idempotency_key: Optional[str] = ...,
        wait: bool = ...,
        on_event: Optional[EventCallback] = ...,
        timeout: Optional[float] = ...,
    ) -> Plan: ...

    @overload
    def create(
        self,
        body: Optional[CreateBody] = ...,
        *,
        dry_run: Literal[False] = ...,
        idempotency_key: Optional[str] = ...,
        wait: bool = ...,
        on_event: Optional[EventCallback] = ...,
        timeout: Optional[float] = ...,
    ) -> "Sandbox": ...

    def create(
        self,
        body: Optional[CreateBody] = None,
        *,
        dry_run: bool = False,
        idempotency_key: Optional[str] = None,
        wait: bool = True,
        on_event: Optional[EventCallback] = None,
        timeout: Optional[float] = None,
    ) -> Union["Sandbox", Plan]:
        """Create a sandbox (route, admit, place with failover).

        With ``wait`` (the default) this returns once the create is over (the sandbox runs;
        a replay of a create whose sandbox was deleted since returns it deleted), following
        the create's events (``on_event`` sees each attempt start and end as it happens) and
        raising the create's error when it fails. ``dry_run=True`` returns the
        :class:`Plan` and creates nothing. The same ``idempotency_key`` and body return the
        same sandbox (its ``egress_token`` only on the first answer).
        """
        payload = _wire.create_payload(body, dry_run)
        if dry_run:
            return Plan.from_json(self._c._json("POST", _wire.SANDBOXES, json=payload))
        response = self._c._request("POST", _wire.SANDBOXES, json=payload, idempotency_key=idempotency_key)
        info = _wire.info(response.json())
        sandbox = Sandbox(self._c, info.id, info)
        if not _wire.should_follow(info, wait, on_event):
            # Running, or a replay of a create already over (failed ones answer an error).
            return sandbox
        done = None
        deadline = None if timeout is None else time.monotonic() + timeout
        for event in self.events(info.id, deadline=deadline):
            if on_event is not None:
                on_event(event)
            if event.type == "done":
                done = event.data or {}
        _wire.create_outcome(done, info.id, response.headers.get("x-request-id"))
        sandbox.refresh()
        # The token is shown only by the create's answer; keep it on the handle.
        sandbox._info = _wire.with_token(sandbox._info, info.egress_token)
        return sandbox

    def events(
        self,
        id: str,
        *,
        last_event_id: Optional[str] = None,
        deadline: Optional[float] = None,
    ) -> Iterator[Event]:
        """The create's events, until ``done``. A stream that ends early (the gateway's
        stream lifetime, a dropped connection) is resumed with ``Last-Event-ID``, so no
        event is lost or repeated."""
        follow = _wire.EventFollow(id, last_event_id, deadline)
        while follow.going():
            try:
                with self._c._stream("GET", _wire.events_path(id), headers=follow.open()) as response:
                    if response.status_code == 204:
                        return
                    for line in response.iter_lines():
                        event = follow.feed(line)
                        if event is None:
                            continue
                        yield event
                        if follow.over(event):
                            return
                follow.ended()
            except (httpx.TransportError, SandgateError) as e:
                follow.failed(e)
            time.sleep(follow.pause())

    def get(self, id: str) -> "Sandbox":
        raw = self._c._json("GET", _wire.sandbox_path(id))
        return Sandbox(self._c, raw["id"], _wire.info(raw))

    def list(
        self,
        *,
        state: Optional[str] = None,
        label: Optional[Mapping[str, str]] = None,
        workspace: Optional[str] = None,
        page_size: int = 100,
    ) -> List["Sandbox"]:
        """Every sandbox matching the filters (all pages), oldest first."""
        params = _wire.list_params(state, label, workspace, page_size)
        out: List[Sandbox] = []
        more = True
        while more:
            rows, more = _wire.next_page(self._c._json("GET", _wire.SANDBOXES, params=params), params)
            out += [Sandbox(self._c, raw["id"], _wire.info(raw)) for raw in rows]
        return out

    def delete(self, id: str) -> "Sandbox":
        raw = self._c._json("DELETE", _wire.sandbox_path(id))
        return Sandbox(self._c, raw["id"], _wire.info(raw))


class Sandbox:
    """A sandbox: what the gateway last said about it (``info``) and its operations."""

    def __init__(self, client: Client, id: str, info: Optional[SandboxInfo] = None) -> None:
        self._c = client
        self.id = id
        self._info = info
        self.files = Files(client, id)

    def __repr__(self) -> str:
        state = self._info.state if self._info else None
        pool = self._info.pool if self._info else None
        return f"Sandbox(id={self.id!r}, state={state!r}, pool={pool!r})"

    @property
    def info(self) -> SandboxInfo:
        if self._info is None:
            self.refresh()
        assert self._info is not None
        return self._info

    @property
    def state(self) -> str:
        return self.info.state

    @property
    def egress_token(self) -> Optional[str]:
        return self._info.egress_token if self._info else None

    def refresh(self) -> "Sandbox":
        return self._keep(self._c._json("GET", self._path("")))

    def _keep(self, raw: Any) -> "Sandbox":
        self._info = _wire.keep_info(self._info, raw)
        return self

    def _path(self, rest: str) -> str:
        return _wire.sandbox_path(self.id, rest)

    # ------------------------------------------------------------------------ exec

    @overload
    def exec(
        self,
        command: Command,
        *,
        stream: Literal[True],
        env: Optional[Mapping[str, str]] = ...,
        cwd: Optional[str] = ...,
        timeout: Optional[float] = ...,
    ) -> "ExecStream": ...

    @overload
    def exec(
        self,
        command: Command,
        *,
        stream: Literal[False] = ...,
        env: Optional[Mapping[str, str]] = ...,
        cwd: Optional[str] = ...,
        timeout: Optional[float] = ...,
        on_stdout: Optional[Callable[[bytes], None]] = ...,
        on_stderr: Optional[Callable[[bytes], None]] = ...,
    ) -> ExecResult: ...

    def exec(
        self,
        command: Command,
        *,
        stream: bool = False,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
        on_stdout: Optional[Callable[[bytes], None]] = None,
        on_stderr: Optional[Callable[[bytes], None]] = None,
    ) -> Union[ExecResult, "ExecStream"]:
        """Run ``command`` (a string runs with ``sh -c``; a list is the argv).

        ``timeout`` (seconds) kills its process tree when it passes. Returns the
        :class:`ExecResult` once it ends, output streamed to ``on_stdout``/``on_stderr`` as
        it comes; ``stream=True`` returns an :class:`ExecStream` to iterate instead.
        A non-zero exit is a result, not an exception.
        """
        body = _wire.exec_body(command, env, cwd, timeout)
        cm = self._c._stream("POST", self._path("/exec"), json=body)
        execution = ExecStream(self, cm)
        if stream:
            return execution
        with execution:
            for event in execution:
                if event.type == "stdout" and on_stdout:
                    on_stdout(event.data)
                elif event.type == "stderr" and on_stderr:
                    on_stderr(event.data)
        assert execution.result is not None  # the iteration raised otherwise
        return execution.result

    def exec_stream(
        self,
        command: Command,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> "ExecStream":
        """``exec(command, stream=True)`` (the name :class:`sandgate.AsyncSandbox` uses)."""
        return self.exec(command, stream=True, env=env, cwd=cwd, timeout=timeout)

    # ------------------------------------------------------------------- lifecycle

    def _transition(self, op: str) -> "Sandbox":
        raw: SandboxView = self._c._json("POST", self._path(f"/{op}"))
        return self._keep(raw)

    def pause(self) -> "Sandbox":
        return self._transition("pause")

    def resume(self) -> "Sandbox":
        return self._transition("resume")

    def stop(self) -> "Sandbox":
        return self._transition("stop")

    def start(self) -> "Sandbox":
        return self._transition("start")

    def set_lifetime(self, ttl_secs: int) -> "Sandbox":
        """Delete the sandbox ``ttl_secs`` from now (longer or shorter than before)."""
        body: TimeoutBody = {"ttl_secs": int(ttl_secs)}
        return self._keep(self._c._json("POST", self._path("/timeout"), json=body))

    def snapshot(self, *, kind: Optional[str] = None, paths: Optional[Sequence[str]] = None) -> SnapshotTaken:
        """``{snapshot: {id, kind, ...}, export?}``; create from it with ``{"snapshot": id}``."""
        body = _wire.snapshot_body(kind, paths)
        answer: SnapshotTaken = self._c._json("POST", self._path("/snapshot"), json=body)
        return answer

    def port(self, port: int) -> PortAccess:
        """How to reach ``port`` of the sandbox through the gateway's ports listener:
        ``{url, host, port, public, token, token_header}``; send ``token`` in the
        ``token_header`` header unless ``public``."""
        answer: PortAccess = self._c._json("GET", self._path(f"/ports/{int(port)}"))
        return answer

    def delete(self) -> "Sandbox":
        self._info = _wire.info(self._c._json("DELETE", self._path("")))
        return self

    # ----------------------------------------------------------------- delegations

    def delegate(
        self,
        actions: Sequence[str],
        *,
        agent: str,
        until: Optional[_dt.datetime] = None,
        ttl_secs: Optional[int] = None,
    ) -> Delegation:
        """Mint a capability: ``actions`` (e.g. ``["exec"]``) on this sandbox for ``agent``
        until ``until`` (or for ``ttl_secs``). Build the agent's client with
        ``Client.from_delegation(d)``."""
        return self._c.delegations.mint(self.id, actions, agent=agent, until=until, ttl_secs=ttl_secs)


class ExecStream(_wire.ExecOutput):
    """A running command's output, as :class:`ExecEvent` values in the order sent.

    Use it as a context manager (closing it early cancels the command: the gateway kills
    the process tree when the connection goes); ``result`` is set once ``exit`` arrives.
    """

    def __init__(self, sandbox: Sandbox, cm: Any) -> None:
        super().__init__()
        self._sandbox = sandbox
        self._cm = cm
        self._response: Optional[httpx.Response] = None

    def __enter__(self) -> "ExecStream":
        self._response = self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)

    def __iter__(self) -> Iterator[ExecEvent]:
        if self._response is None:
            self.__enter__()
        assert self._response is not None
        for line in self._response.iter_lines():
            event = self._take(line)
            if event is not None:
                yield event
        self._finish()

    def cancel(self) -> None:
        """Kill the command's process tree (``POST .../exec/{exec_id}/cancel``)."""
        if self.exec_id:
            self._sandbox._c._request("POST", _wire.cancel_path(self._sandbox.id, self.exec_id))


class Files:
    """A sandbox's files (paths absolute, or relative to its home)."""

    def __init__(self, client: Client, sandbox_id: str) -> None:
        self._c = client
        self._id = sandbox_id

    def read(self, path: str) -> bytes:
        return self._c._request("GET", _wire.files_path(self._id, "/content"), params=_wire.path_params(path)).content

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    def write(self, path: str, data: Union[bytes, str]) -> None:
        self._c._request(
            "PUT",
            _wire.files_path(self._id, "/content"),
            params=_wire.path_params(path),
            content=_wire.file_content(data),
            headers=_wire.OCTET_STREAM,
        )

    def list(self, path: str) -> List[FileEntry]:
        raw: FileList = self._c._json("GET", _wire.files_path(self._id), params=_wire.path_params(path))
        return [FileEntry.from_json(e) for e in raw["entries"]]

    def remove(self, path: str, *, recursive: bool = False) -> None:
        params = _wire.path_params(path, ("recursive", recursive))
        self._c._request("DELETE", _wire.files_path(self._id), params=params)

    def mkdir(self, path: str, *, parents: bool = False) -> None:
        params = _wire.path_params(path, ("parents", parents))
        self._c._request("POST", _wire.files_path(self._id, "/mkdir"), params=params)


class Routes:
    def __init__(self, client: Client) -> None:
        self._c = client

    def explain(self, request: CreateBody) -> Explanation:
        """Why a create of ``request`` would land where it would: every pool with its unmet
        requirements, rank keys and bands, and the final ``order``. Nothing is created."""
        answer: Explanation = self._c._json("POST", _wire.EXPLAIN, json=dict(request))
        return answer


class Pools:
    def __init__(self, client: Client) -> None:
        self._c = client

    def list(self) -> List[PoolView]:
        return list(self._c._json("GET", _wire.POOLS).get("pools") or [])


class Credentials:
    """Workspace credentials: metadata only ever comes back; the secret goes in once."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def _path(self, workspace: Optional[str], name: Optional[str] = None) -> str:
        return _wire.credentials_path(self._c._workspace(workspace), name)

    def create(
        self,
        name: str,
        *,
        secret: Union[str, Secret],
        destinations: Sequence[Mapping[str, Any]],
        apply: Mapping[str, Any],
        placeholder_env: Optional[str] = None,
        user: Optional[str] = None,
        scrub_response_body: bool = False,
        workspace: Optional[str] = None,
    ) -> Credential:
        body = _wire.credential_body(name, secret, destinations, apply, placeholder_env, user, scrub_response_body)
        return Credential.from_json(self._c._json("POST", self._path(workspace), json=body))

    def rotate(self, name: str, *, secret: Union[str, Secret], workspace: Optional[str] = None) -> Credential:
        """Replace the secret, keeping destinations and how it is applied."""
        body = _wire.rotated_body(self.get(name, workspace=workspace), secret)
        return Credential.from_json(self._c._json("PUT", self._path(workspace, name), json=body))

    def get(self, name: str, *, workspace: Optional[str] = None) -> Credential:
        return Credential.from_json(self._c._json("GET", self._path(workspace, name)))

    def list(self, *, workspace: Optional[str] = None) -> List[Credential]:
        raw = self._c._json("GET", self._path(workspace))
        return [Credential.from_json(c) for c in raw.get("credentials") or []]

    def delete(self, name: str, *, workspace: Optional[str] = None) -> None:
        self._c._request("DELETE", self._path(workspace, name))


class Delegations:
    def __init__(self, client: Client) -> None:
        self._c = client

    def mint(
        self,
        sandbox_id: str,
        actions: Sequence[str],
        *,
        agent: str,
        until: Optional[_dt.datetime] = None,
        ttl_secs: Optional[int] = None,
    ) -> Delegation:
        body = _wire.mint_body(agent, actions, until, ttl_secs)
        return _wire.minted(self._c._json("POST", _wire.delegations_path(sandbox_id), json=body))

    def list(self, sandbox_id: str) -> List[Delegation]:
        raw = self._c._json("GET", _wire.delegations_path(sandbox_id))
        return [Delegation.from_json(d) for d in raw.get("delegations") or []]

    def revoke(self, delegation_id: str) -> None:
        self._c._request("DELETE", _wire.delegation_path(delegation_id))


__all__ = [
    "Client",
    "Credentials",
    "Delegations",
    "ExecStream",
    "Files",
    "Pools",
    "Routes",
    "Sandbox",
    "Sandboxes",
]
