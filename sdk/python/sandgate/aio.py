"""The asyncio client: :class:`AsyncClient` has :class:`sandgate.Client`'s API, with ``await``
(and ``async for`` over events and exec output). Same errors, same retry rule."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import time
from typing import (
    Any,
    AsyncIterator,
    Callable,
    Coroutine,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    Union,
    overload,
)

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

EventCallback = Callable[[Event], Any]
Command = Union[str, Sequence[str]]


class AsyncClient(_wire.ClientBase):
    """See :class:`sandgate.Client`."""

    def __init__(
        self,
        base_url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        workspace: Optional[str] = None,
        retry: Optional[RetryPolicy] = None,
        timeout: float = _wire.DEFAULT_TIMEOUT,
        http: Optional[httpx.AsyncClient] = None,
        _sandbox_id: Optional[str] = None,
    ) -> None:
        super().__init__(base_url, token, workspace, retry, _sandbox_id)
        self._http = http or httpx.AsyncClient(timeout=timeout)
        self._owns_http = http is None
        self.sandboxes = AsyncSandboxes(self)
        self.routes = AsyncRoutes(self)
        self.pools = AsyncPools(self)
        self.credentials = AsyncCredentials(self)
        self.delegations = AsyncDelegations(self)

    @classmethod
    def from_delegation(
        cls, delegation: Union[Delegation, str], base_url: Optional[str] = None, **kwargs: Any
    ) -> "AsyncClient":
        token, sandbox_id = _wire.delegated(delegation)
        return cls(base_url, token, _sandbox_id=sandbox_id, **kwargs)

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def sandbox(self, id: Optional[str] = None) -> "AsyncSandbox":
        return AsyncSandbox(self, self._sandbox_id(id))

    async def _request(
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
                response = await self._http.request(
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
            await asyncio.sleep(
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

    @contextlib.asynccontextmanager
    async def _stream(
        self, method: str, path: str, *, json: Any = None, headers: Optional[Mapping[str, str]] = None
    ) -> AsyncIterator[httpx.Response]:
        attempt = 0
        while True:
            attempt += 1
            try:
                request = self._http.build_request(
                    method, self._url(path), json=json, headers=self._headers(headers), timeout=_wire.STREAM_TIMEOUT
                )
                response = await self._http.send(request, stream=True)
            except httpx.TransportError as e:
                raise _wire.connection_error(e) from None
            if response.status_code < 400:
                try:
                    yield response
                finally:
                    await response.aclose()
                return
            content = await response.aread()
            await response.aclose()
            await asyncio.sleep(
                _wire.retry_delay(self.retry, attempt, method, response.status_code, content, response.headers)
            )

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return _wire.decode_json((await self._request(method, path, **kwargs)).content)


class AsyncSandboxes:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @overload
    async def create(
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
    async def create(
        self,
        body: Optional[CreateBody] = ...,
        *,
        dry_run: Literal[False] = ...,
        idempotency_key: Optional[str] = ...,
        wait: bool = ...,
        on_event: Optional[EventCallback] = ...,
        timeout: Optional[float] = ...,
    ) -> "AsyncSandbox": ...

    async def create(
        self,
        body: Optional[CreateBody] = None,
        *,
        dry_run: bool = False,
        idempotency_key: Optional[str] = None,
        wait: bool = True,
        on_event: Optional[EventCallback] = None,
        timeout: Optional[float] = None,
    ) -> Union["AsyncSandbox", Plan]:
        """See :meth:`sandgate.client.Sandboxes.create`; ``on_event`` may be a coroutine
        function."""
        payload = _wire.create_payload(body, dry_run)
        if dry_run:
            return Plan.from_json(await self._c._json("POST", _wire.SANDBOXES, json=payload))
        response = await self._c._request(
            "POST", _wire.SANDBOXES, json=payload, idempotency_key=idempotency_key
        )
        info = _wire.info(response.json())
        sandbox = AsyncSandbox(self._c, info.id, info)
        if not _wire.should_follow(info, wait, on_event):
            return sandbox
        done = None
        deadline = None if timeout is None else time.monotonic() + timeout
        async for event in self.events(info.id, deadline=deadline):
            if on_event is not None:
                result = on_event(event)
                if asyncio.iscoroutine(result):
                    await result
            if event.type == "done":
                done = event.data or {}
        _wire.create_outcome(done, info.id, response.headers.get("x-request-id"))
        await sandbox.refresh()
        sandbox._info = _wire.with_token(sandbox._info, info.egress_token)
        return sandbox

    async def events(
        self, id: str, *, last_event_id: Optional[str] = None, deadline: Optional[float] = None
    ) -> AsyncIterator[Event]:
        follow = _wire.EventFollow(id, last_event_id, deadline)
        while follow.going():
            try:
                async with self._c._stream("GET", _wire.events_path(id), headers=follow.open()) as response:
                    if response.status_code == 204:
                        return
                    async for line in response.aiter_lines():
                        event = follow.feed(line)
                        if event is None:
                            continue
                        yield event
                        if follow.over(event):
                            return
                follow.ended()
            except (httpx.TransportError, SandgateError) as e:
                follow.failed(e)
            await asyncio.sleep(follow.pause())

    async def get(self, id: str) -> "AsyncSandbox":
        raw = await self._c._json("GET", _wire.sandbox_path(id))
        return AsyncSandbox(self._c, raw["id"], _wire.info(raw))

    async def list(
        self,
        *,
        state: Optional[str] = None,
        label: Optional[Mapping[str, str]] = None,
        workspace: Optional[str] = None,
        page_size: int = 100,
    ) -> List["AsyncSandbox"]:
        params = _wire.list_params(state, label, workspace, page_size)
        out: List[AsyncSandbox] = []
        more = True
        while more:
            rows, more = _wire.next_page(await self._c._json("GET", _wire.SANDBOXES, params=params), params)
            out += [AsyncSandbox(self._c, r["id"], _wire.info(r)) for r in rows]
        return out

    async def delete(self, id: str) -> "AsyncSandbox":
        raw = await self._c._json("DELETE", _wire.sandbox_path(id))
        return AsyncSandbox(self._c, raw["id"], _wire.info(raw))


class AsyncSandbox:
    """See :class:`sandgate.client.Sandbox`."""

    def __init__(self, client: AsyncClient, id: str, info: Optional[SandboxInfo] = None) -> None:
        self._c = client
        self.id = id
        self._info = info
        self.files = AsyncFiles(client, id)

    def __repr__(self) -> str:
        state = self._info.state if self._info else None
        pool = self._info.pool if self._info else None
        return f"AsyncSandbox(id={self.id!r}, state={state!r}, pool={pool!r})"

    @property
    def info(self) -> Optional[SandboxInfo]:
        """What the gateway last said (None until read: ``await refresh()``)."""
        return self._info

    @property
    def state(self) -> Optional[str]:
        return self._info.state if self._info else None

    @property
    def egress_token(self) -> Optional[str]:
        return self._info.egress_token if self._info else None

    def _path(self, rest: str) -> str:
        return _wire.sandbox_path(self.id, rest)

    def _keep(self, raw: SandboxView) -> "AsyncSandbox":
        self._info = _wire.keep_info(self._info, raw)
        return self

    async def refresh(self) -> "AsyncSandbox":
        return self._keep(await self._c._json("GET", self._path("")))

    @overload
    def exec(
        self,
        command: Command,
        *,
        stream: Literal[True],
        env: Optional[Mapping[str, str]] = ...,
        cwd: Optional[str] = ...,
        timeout: Optional[float] = ...,
    ) -> "AsyncExecStream": ...

    @overload
    def exec(
        self,
        command: Command,
        *,
        stream: Literal[False] = ...,
        env: Optional[Mapping[str, str]] = ...,
        cwd: Optional[str] = ...,
        timeout: Optional[float] = ...,
        on_stdout: Optional[Callable[[bytes], Any]] = ...,
        on_stderr: Optional[Callable[[bytes], Any]] = ...,
    ) -> Coroutine[Any, Any, ExecResult]: ...

    def exec(
        self,
        command: Command,
        *,
        stream: bool = False,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
        on_stdout: Optional[Callable[[bytes], Any]] = None,
        on_stderr: Optional[Callable[[bytes], Any]] = None,
    ) -> Union["AsyncExecStream", Coroutine[Any, Any, ExecResult]]:
        """Run ``command``; see :meth:`sandgate.client.Sandbox.exec`. ``await`` it for the
        :class:`ExecResult` (output streamed to ``on_stdout``/``on_stderr``, which may be
        coroutine functions); with ``stream=True`` it is an :class:`AsyncExecStream`:
        ``async with sandbox.exec(cmd, stream=True) as s: async for event in s``."""
        if stream:
            return self.exec_stream(command, env=env, cwd=cwd, timeout=timeout)
        return self._run(command, env, cwd, timeout, on_stdout, on_stderr)

    async def _run(
        self,
        command: Command,
        env: Optional[Mapping[str, str]],
        cwd: Optional[str],
        timeout: Optional[float],
        on_stdout: Optional[Callable[[bytes], Any]],
        on_stderr: Optional[Callable[[bytes], Any]],
    ) -> ExecResult:
        async with self.exec_stream(command, env=env, cwd=cwd, timeout=timeout) as execution:
            async for event in execution:
                callback = on_stdout if event.type == "stdout" else on_stderr if event.type == "stderr" else None
                if callback is not None:
                    result = callback(event.data)
                    if asyncio.iscoroutine(result):
                        await result
        assert execution.result is not None
        return execution.result

    def exec_stream(
        self,
        command: Command,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> "AsyncExecStream":
        body = _wire.exec_body(command, env, cwd, timeout)
        return AsyncExecStream(self, self._c._stream("POST", self._path("/exec"), json=body))

    async def pause(self) -> "AsyncSandbox":
        return self._keep(await self._c._json("POST", self._path("/pause")))

    async def resume(self) -> "AsyncSandbox":
        return self._keep(await self._c._json("POST", self._path("/resume")))

    async def stop(self) -> "AsyncSandbox":
        return self._keep(await self._c._json("POST", self._path("/stop")))

    async def start(self) -> "AsyncSandbox":
        return self._keep(await self._c._json("POST", self._path("/start")))

    async def set_lifetime(self, ttl_secs: int) -> "AsyncSandbox":
        body: TimeoutBody = {"ttl_secs": int(ttl_secs)}
        return self._keep(await self._c._json("POST", self._path("/timeout"), json=body))

    async def port(self, port: int) -> PortAccess:
        """See :meth:`sandgate.Sandbox.port`."""
        answer: PortAccess = await self._c._json("GET", self._path(f"/ports/{int(port)}"))
        return answer

    async def snapshot(
        self, *, kind: Optional[str] = None, paths: Optional[Sequence[str]] = None
    ) -> SnapshotTaken:
        body = _wire.snapshot_body(kind, paths)
        answer: SnapshotTaken = await self._c._json("POST", self._path("/snapshot"), json=body)
        return answer

    async def delete(self) -> "AsyncSandbox":
        self._info = _wire.info(await self._c._json("DELETE", self._path("")))
        return self

    async def delegate(
        self,
        actions: Sequence[str],
        *,
        agent: str,
        until: Optional[_dt.datetime] = None,
        ttl_secs: Optional[int] = None,
    ) -> Delegation:
        return await self._c.delegations.mint(
            self.id, actions, agent=agent, until=until, ttl_secs=ttl_secs
        )


class AsyncExecStream(_wire.ExecOutput):
    """``async with`` it, then ``async for`` its :class:`ExecEvent` values; leaving the block
    early drops the connection, and the gateway kills the command's process tree."""

    def __init__(self, sandbox: AsyncSandbox, cm: Any) -> None:
        super().__init__()
        self._sandbox = sandbox
        self._cm = cm
        self._response: Optional[httpx.Response] = None

    async def __aenter__(self) -> "AsyncExecStream":
        self._response = await self._cm.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._cm.__aexit__(*exc)

    async def __aiter__(self) -> AsyncIterator[ExecEvent]:
        if self._response is None:
            raise RuntimeError("use `async with sandbox.exec_stream(...) as s:` first")
        async for line in self._response.aiter_lines():
            event = self._take(line)
            if event is not None:
                yield event
        self._finish()

    async def cancel(self) -> None:
        if self.exec_id:
            await self._sandbox._c._request("POST", _wire.cancel_path(self._sandbox.id, self.exec_id))


class AsyncFiles:
    def __init__(self, client: AsyncClient, sandbox_id: str) -> None:
        self._c = client
        self._id = sandbox_id

    async def read(self, path: str) -> bytes:
        url = _wire.files_path(self._id, "/content")
        return (await self._c._request("GET", url, params=_wire.path_params(path))).content

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read(path)).decode(encoding)

    async def write(self, path: str, data: Union[bytes, str]) -> None:
        await self._c._request(
            "PUT",
            _wire.files_path(self._id, "/content"),
            params=_wire.path_params(path),
            content=_wire.file_content(data),
            headers=_wire.OCTET_STREAM,
        )

    async def list(self, path: str) -> List[FileEntry]:
        raw: FileList = await self._c._json("GET", _wire.files_path(self._id), params=_wire.path_params(path))
        return [FileEntry.from_json(e) for e in raw["entries"]]

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        params = _wire.path_params(path, ("recursive", recursive))
        await self._c._request("DELETE", _wire.files_path(self._id), params=params)

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        params = _wire.path_params(path, ("parents", parents))
        await self._c._request("POST", _wire.files_path(self._id, "/mkdir"), params=params)


class AsyncRoutes:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def explain(self, request: CreateBody) -> Explanation:
        answer: Explanation = await self._c._json("POST", _wire.EXPLAIN, json=dict(request))
        return answer


class AsyncPools:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(self) -> List[PoolView]:
        return list((await self._c._json("GET", _wire.POOLS)).get("pools") or [])


class AsyncCredentials:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    def _path(self, workspace: Optional[str], name: Optional[str] = None) -> str:
        return _wire.credentials_path(self._c._workspace(workspace), name)

    async def create(
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
        return Credential.from_json(await self._c._json("POST", self._path(workspace), json=body))

    async def rotate(
        self, name: str, *, secret: Union[str, Secret], workspace: Optional[str] = None
    ) -> Credential:
        body = _wire.rotated_body(await self.get(name, workspace=workspace), secret)
        return Credential.from_json(
            await self._c._json("PUT", self._path(workspace, name), json=body)
        )

    async def get(self, name: str, *, workspace: Optional[str] = None) -> Credential:
        return Credential.from_json(await self._c._json("GET", self._path(workspace, name)))

    async def list(self, *, workspace: Optional[str] = None) -> List[Credential]:
        raw = await self._c._json("GET", self._path(workspace))
        return [Credential.from_json(c) for c in raw.get("credentials") or []]

    async def delete(self, name: str, *, workspace: Optional[str] = None) -> None:
        await self._c._request("DELETE", self._path(workspace, name))


class AsyncDelegations:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def mint(
        self,
        sandbox_id: str,
        actions: Sequence[str],
        *,
        agent: str,
        until: Optional[_dt.datetime] = None,
        ttl_secs: Optional[int] = None,
    ) -> Delegation:
        body = _wire.mint_body(agent, actions, until, ttl_secs)
        return _wire.minted(await self._c._json("POST", _wire.delegations_path(sandbox_id), json=body))

    async def list(self, sandbox_id: str) -> List[Delegation]:
        raw = await self._c._json("GET", _wire.delegations_path(sandbox_id))
        return [Delegation.from_json(d) for d in raw.get("delegations") or []]

    async def revoke(self, delegation_id: str) -> None:
        await self._c._request("DELETE", _wire.delegation_path(delegation_id))


__all__ = [
    "AsyncClient",
    "AsyncCredentials",
    "AsyncDelegations",
    "AsyncExecStream",
    "AsyncFiles",
    "AsyncPools",
    "AsyncRoutes",
    "AsyncSandbox",
    "AsyncSandboxes",
]
