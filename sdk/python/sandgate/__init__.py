"""sandgate: the Python SDK for the sandgate gateway's API.

``Client`` (sync) and ``AsyncClient`` (asyncio) over httpx; typed errors (:mod:`.errors`), the
retry rule (:mod:`.retry`), request and response types generated from the gateway's OpenAPI
document (:mod:`.schema`) and the values the clients return (:mod:`.models`).
"""

from .errors import (
    Attempt,
    Conflict,
    Gone,
    IdempotencyConflict,
    InternalError,
    InvalidRequest,
    NoEligibleProvider,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    PolicyDenied,
    RateLimited,
    SandgateError,
    Unauthenticated,
    Unavailable,
    Unsupported,
    UpstreamError,
    error_from_response,
)
from .retry import RetryPolicy
from .models import (
    AttemptRecord,
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
from .client import Client, ExecStream, Sandbox
from .aio import AsyncClient, AsyncExecStream, AsyncSandbox

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AsyncExecStream",
    "AsyncSandbox",
    "AttemptRecord",
    "Client",
    "Credential",
    "Delegation",
    "Event",
    "ExecEvent",
    "ExecResult",
    "ExecStream",
    "FileEntry",
    "Plan",
    "Sandbox",
    "SandboxInfo",
    "Secret",
    "Attempt",
    "Conflict",
    "Gone",
    "IdempotencyConflict",
    "InternalError",
    "InvalidRequest",
    "NoEligibleProvider",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "PolicyDenied",
    "RateLimited",
    "RetryPolicy",
    "SandgateError",
    "Unauthenticated",
    "Unavailable",
    "Unsupported",
    "UpstreamError",
    "error_from_response",
]
