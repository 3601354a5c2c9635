//! The subset of Modal's gRPC schema this adapter speaks, written by hand as prost messages
//! (so a build needs no `protoc`) from the descriptors the official SDK ships: PyPI `modal`
//! 1.6.4, `modal_proto/api_pb2.py` (package `modal.client`) and
//! `modal_proto/task_command_router_pb2.py` (package `modal.task_command_router`).
//!
//! Contract:
//! - Field numbers, types and enum values are the published ones; a field sandgate never
//!   sets or reads is left out, which protobuf allows both ways (an unknown field is
//!   skipped by the reader).
//! - The methods are the gRPC paths in [`client`] and [`router`]: the control plane
//!   (`modal.client.ModalClient`) at the account's server URL, the exec plane
//!   (`modal.task_command_router.TaskCommandRouter`) at the URL a task's
//!   `TaskGetCommandRouterAccess` answers.
//! - The Modal fake in the test tree serves these same messages; the fake is proven by
//!   driving it with the official SDK, whose own descriptors then check both the fake and,
//!   through it, these definitions.

use std::collections::HashMap;

/// `modal.client.ModalClient` method paths.
pub mod client {
    pub const SERVICE: &str = "modal.client.ModalClient";
    pub const CLIENT_HELLO: &str = "/modal.client.ModalClient/ClientHello";
    pub const APP_GET_OR_CREATE: &str = "/modal.client.ModalClient/AppGetOrCreate";
    pub const SECRET_GET_OR_CREATE: &str = "/modal.client.ModalClient/SecretGetOrCreate";
    pub const SANDBOX_CREATE: &str = "/modal.client.ModalClient/SandboxCreate";
    pub const SANDBOX_GET_TASK_ID: &str = "/modal.client.ModalClient/SandboxGetTaskId";
    pub const SANDBOX_WAIT: &str = "/modal.client.ModalClient/SandboxWait";
    pub const SANDBOX_LIST: &str = "/modal.client.ModalClient/SandboxList";
    pub const SANDBOX_TERMINATE: &str = "/modal.client.ModalClient/SandboxTerminate";
    pub const SANDBOX_TAGS_GET: &str = "/modal.client.ModalClient/SandboxTagsGet";
    pub const SANDBOX_SNAPSHOT_FS: &str = "/modal.client.ModalClient/SandboxSnapshotFs";
    pub const IMAGE_DELETE: &str = "/modal.client.ModalClient/ImageDelete";
    pub const TASK_GET_COMMAND_ROUTER_ACCESS: &str =
        "/modal.client.ModalClient/TaskGetCommandRouterAccess";
}

/// `modal.task_command_router.TaskCommandRouter` method paths.
pub mod router {
    pub const SERVICE: &str = "modal.task_command_router.TaskCommandRouter";
    pub const TASK_EXEC_START: &str = "/modal.task_command_router.TaskCommandRouter/TaskExecStart";
    pub const TASK_EXEC_STDIO_READ: &str =
        "/modal.task_command_router.TaskCommandRouter/TaskExecStdioRead";
    pub const TASK_EXEC_STDIN_WRITE: &str =
        "/modal.task_command_router.TaskCommandRouter/TaskExecStdinWrite";
    pub const TASK_EXEC_WAIT: &str = "/modal.task_command_router.TaskCommandRouter/TaskExecWait";
}

/// `modal.client.ObjectCreationType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ObjectCreationType {
    Unspecified = 0,
    CreateIfMissing = 1,
    CreateFailIfExists = 2,
    CreateOverwriteIfExists = 3,
    AnonymousOwnedByApp = 4,
    Ephemeral = 5,
}

/// `modal.client.NetworkAccess.NetworkAccessType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum NetworkAccessType {
    Unspecified = 0,
    Open = 1,
    Blocked = 2,
    Allowlist = 3,
}

/// `modal.client.GenericResult.GenericStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum GenericStatus {
    Unspecified = 0,
    Success = 1,
    Failure = 2,
    Terminated = 3,
    Timeout = 4,
    InitFailure = 5,
    InternalFailure = 6,
    IdleTimeout = 7,
    MemoryManagerEviction = 8,
    MemoryThrashingEviction = 9,
    KernelOomKill = 10,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ClientHelloResponse {
    #[prost(string, tag = "1")]
    pub warning: String,
    #[prost(string, tag = "2")]
    pub image_builder_version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AppGetOrCreateRequest {
    #[prost(string, tag = "1")]
    pub app_name: String,
    #[prost(string, tag = "2")]
    pub environment_name: String,
    #[prost(enumeration = "ObjectCreationType", tag = "3")]
    pub object_creation_type: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AppGetOrCreateResponse {
    #[prost(string, tag = "1")]
    pub app_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SecretGetOrCreateRequest {
    #[prost(string, tag = "1")]
    pub deployment_name: String,
    #[prost(string, tag = "3")]
    pub environment_name: String,
    #[prost(enumeration = "ObjectCreationType", tag = "4")]
    pub object_creation_type: i32,
    #[prost(map = "string, string", tag = "5")]
    pub env_dict: HashMap<String, String>,
    #[prost(string, tag = "6")]
    pub app_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SecretGetOrCreateResponse {
    #[prost(string, tag = "1")]
    pub secret_id: String,
}

#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Message)]
pub struct SandboxTag {
    #[prost(string, tag = "1")]
    pub tag_name: String,
    #[prost(string, tag = "2")]
    pub tag_value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Resources {
    #[prost(uint32, tag = "2")]
    pub memory_mb: u32,
    #[prost(uint32, tag = "3")]
    pub milli_cpu: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NetworkAccess {
    #[prost(enumeration = "NetworkAccessType", tag = "1")]
    pub network_access_type: i32,
    #[prost(string, repeated, tag = "2")]
    pub allowed_cidrs: Vec<String>,
    #[prost(string, repeated, tag = "3")]
    pub allowed_domains: Vec<String>,
}

/// `modal.client.Sandbox`: the definition a create carries.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sandbox {
    #[prost(string, repeated, tag = "1")]
    pub entrypoint_args: Vec<String>,
    #[prost(string, tag = "3")]
    pub image_id: String,
    #[prost(string, repeated, tag = "4")]
    pub secret_ids: Vec<String>,
    #[prost(message, optional, tag = "5")]
    pub resources: Option<Resources>,
    #[prost(uint32, tag = "7")]
    pub timeout_secs: u32,
    #[prost(string, optional, tag = "8")]
    pub workdir: Option<String>,
    #[prost(bool, tag = "11")]
    pub block_network: bool,
    #[prost(message, optional, tag = "22")]
    pub network_access: Option<NetworkAccess>,
    #[prost(string, optional, tag = "30")]
    pub name: Option<String>,
    #[prost(uint32, optional, tag = "33")]
    pub idle_timeout_secs: Option<u32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxCreateRequest {
    #[prost(string, tag = "1")]
    pub app_id: String,
    #[prost(message, optional, tag = "2")]
    pub definition: Option<Sandbox>,
    #[prost(string, tag = "3")]
    pub environment_name: String,
    #[prost(message, repeated, tag = "4")]
    pub tags: Vec<SandboxTag>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxCreateResponse {
    #[prost(string, tag = "1")]
    pub sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GenericResult {
    #[prost(enumeration = "GenericStatus", tag = "1")]
    pub status: i32,
    #[prost(string, tag = "2")]
    pub exception: String,
    #[prost(int32, tag = "3")]
    pub exitcode: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxGetTaskIdRequest {
    #[prost(string, tag = "1")]
    pub sandbox_id: String,
    #[prost(float, optional, tag = "2")]
    pub timeout: Option<f32>,
    #[prost(bool, tag = "3")]
    pub wait_until_ready: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxGetTaskIdResponse {
    #[prost(string, optional, tag = "1")]
    pub task_id: Option<String>,
    #[prost(message, optional, tag = "2")]
    pub task_result: Option<GenericResult>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxWaitRequest {
    #[prost(string, tag = "1")]
    pub sandbox_id: String,
    #[prost(float, tag = "2")]
    pub timeout: f32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxWaitResponse {
    #[prost(message, optional, tag = "1")]
    pub result: Option<GenericResult>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxListRequest {
    #[prost(string, tag = "1")]
    pub app_id: String,
    #[prost(double, tag = "2")]
    pub before_timestamp: f64,
    #[prost(string, tag = "3")]
    pub environment_name: String,
    #[prost(bool, tag = "4")]
    pub include_finished: bool,
    #[prost(message, repeated, tag = "5")]
    pub tags: Vec<SandboxTag>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskInfo {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(double, tag = "2")]
    pub started_at: f64,
    #[prost(double, tag = "3")]
    pub finished_at: f64,
    #[prost(message, optional, tag = "4")]
    pub result: Option<GenericResult>,
    #[prost(string, tag = "7")]
    pub sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxInfo {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(double, tag = "3")]
    pub created_at: f64,
    #[prost(message, optional, tag = "4")]
    pub task_info: Option<TaskInfo>,
    #[prost(string, tag = "5")]
    pub app_id: String,
    #[prost(message, repeated, tag = "6")]
    pub tags: Vec<SandboxTag>,
    #[prost(string, tag = "7")]
    pub name: String,
    #[prost(string, tag = "8")]
    pub image_id: String,
    #[prost(uint32, tag = "11")]
    pub timeout_secs: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxListResponse {
    #[prost(message, repeated, tag = "1")]
    pub sandboxes: Vec<SandboxInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxTerminateRequest {
    #[prost(string, tag = "1")]
    pub sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxTerminateResponse {
    #[prost(message, optional, tag = "1")]
    pub existing_result: Option<GenericResult>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxTagsGetRequest {
    #[prost(string, tag = "1")]
    pub sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxTagsGetResponse {
    #[prost(message, repeated, tag = "1")]
    pub tags: Vec<SandboxTag>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxSnapshotFsRequest {
    #[prost(string, tag = "1")]
    pub sandbox_id: String,
    #[prost(float, tag = "2")]
    pub timeout: f32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxSnapshotFsResponse {
    #[prost(string, tag = "1")]
    pub image_id: String,
    #[prost(message, optional, tag = "2")]
    pub result: Option<GenericResult>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageDeleteRequest {
    #[prost(string, tag = "1")]
    pub image_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskGetCommandRouterAccessRequest {
    #[prost(string, tag = "1")]
    pub task_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskGetCommandRouterAccessResponse {
    #[prost(string, tag = "1")]
    pub jwt: String,
    #[prost(string, tag = "2")]
    pub url: String,
}

/// `modal.task_command_router.TaskExecStdoutConfig`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum StdoutConfig {
    Devnull = 0,
    Pipe = 1,
}

/// `modal.task_command_router.TaskExecStderrConfig`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum StderrConfig {
    Devnull = 0,
    Pipe = 1,
    Stdout = 2,
}

/// `modal.task_command_router.TaskExecStdioFileDescriptor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum StdioFileDescriptor {
    Stdout = 0,
    Stderr = 1,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskExecStartRequest {
    #[prost(string, tag = "1")]
    pub task_id: String,
    #[prost(string, tag = "2")]
    pub exec_id: String,
    #[prost(string, repeated, tag = "3")]
    pub command_args: Vec<String>,
    #[prost(enumeration = "StdoutConfig", tag = "4")]
    pub stdout_config: i32,
    #[prost(enumeration = "StderrConfig", tag = "5")]
    pub stderr_config: i32,
    #[prost(uint32, optional, tag = "6")]
    pub timeout_secs: Option<u32>,
    #[prost(string, optional, tag = "7")]
    pub workdir: Option<String>,
    /// In the schema, but the SDK (1.6.4) sends a command's environment as
    /// `secret_sources` instead, and so does the adapter.
    #[prost(map = "string, string", tag = "12")]
    pub env: HashMap<String, String>,
    #[prost(message, repeated, tag = "13")]
    pub secret_sources: Vec<SecretSource>,
}

/// `modal.client.SecretSource`: a secret by id, or an environment given inline.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SecretSource {
    #[prost(string, tag = "1")]
    pub secret_id: String,
    #[prost(message, optional, tag = "2")]
    pub env: Option<StringMap>,
}

/// `modal.client.StringMap`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StringMap {
    #[prost(map = "string, string", tag = "1")]
    pub contents: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskExecStartResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskExecStdioReadRequest {
    #[prost(string, tag = "1")]
    pub task_id: String,
    #[prost(string, tag = "2")]
    pub exec_id: String,
    #[prost(uint64, tag = "3")]
    pub offset: u64,
    #[prost(enumeration = "StdioFileDescriptor", tag = "4")]
    pub file_descriptor: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskExecStdioReadResponse {
    #[prost(bytes = "vec", tag = "1")]
    pub data: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskExecStdinWriteRequest {
    #[prost(string, tag = "1")]
    pub task_id: String,
    #[prost(string, tag = "2")]
    pub exec_id: String,
    #[prost(uint64, tag = "3")]
    pub offset: u64,
    #[prost(bytes = "vec", tag = "4")]
    pub data: Vec<u8>,
    #[prost(bool, tag = "5")]
    pub eof: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskExecStdinWriteResponse {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskExecWaitRequest {
    #[prost(string, tag = "1")]
    pub task_id: String,
    #[prost(string, tag = "2")]
    pub exec_id: String,
}

/// How an exec ended: `oneof exit_status { int32 code = 1; int32 signal = 2; }`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum ExitStatus {
    #[prost(int32, tag = "1")]
    Code(i32),
    #[prost(int32, tag = "2")]
    Signal(i32),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskExecWaitResponse {
    #[prost(oneof = "ExitStatus", tags = "1, 2")]
    pub exit_status: Option<ExitStatus>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Any {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `modal.client.RPCStatus`: what Modal puts in `grpc-status-details-bin` (the SDK's
/// `CustomProtoStatusDetailsCodec` reads it; its detail types are packed under
/// `type.modal.com/`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<Any>,
}

/// `modal.client.RPCRetryPolicy`: a throttled call's wait before trying again.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcRetryPolicy {
    #[prost(float, tag = "1")]
    pub retry_after_secs: f32,
}

/// The type URL suffix of [`RpcRetryPolicy`] in an [`RpcStatus`]'s details.
pub const RETRY_POLICY_TYPE: &str = "modal.client.RPCRetryPolicy";
