//! The [`Provider`] implementation for Modal: the coordinator's calls (create, get, list by
//! tag, delete, adopt) and the sandbox operations (exec, files, filesystem snapshots), each
//! mapped onto the gRPC API as the module docs of `modal` describe.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sandgate_router::Source;
use serde_json::Value;

use super::grpc::GrpcFailure;
use super::{
    create_error, lockdown, network_access, op_error, proto, provider_error, Modal, CA_PATH,
};
use crate::ops::{ExecSpec, ExecStream};
use crate::providers::hosted::errors::{failed_before_running, left_behind};
use crate::providers::hosted::lockdown::{ca_not_installed, create_env};
use crate::providers::hosted::tags::{tags_of, TagFilter, TAG_ATTEMPT, TAG_SANDBOX};
use crate::providers::{
    BoxFuture, CreateSpec, ErrorClass, Instance, InstanceState, OpError, OpErrorKind, Provider,
    ProviderError, RemoteEgress, RuntimeCapabilities, SnapshotInfo, LIFETIME_MARGIN,
};

/// How long one `SandboxGetTaskId` long poll may wait on Modal's side.
const TASK_POLL: Duration = Duration::from_secs(50);
/// Modal's list pages (the SDK walks them the same way).
const MAX_PAGES: usize = 100;

fn tag(name: &str, value: &str) -> proto::SandboxTag {
    proto::SandboxTag {
        tag_name: name.to_string(),
        tag_value: value.to_string(),
    }
}

fn tag_map(tags: &[proto::SandboxTag]) -> BTreeMap<String, String> {
    tags.iter()
        .map(|t| (t.tag_name.clone(), t.tag_value.clone()))
        .collect()
}

fn instance(id: &str, tags: &[proto::SandboxTag]) -> Instance {
    Instance {
        id: id.to_string(),
        tags: tags_of(Some(&tag_map(tags))),
        state: InstanceState::Running,
    }
}

fn unsupported(message: String) -> ProviderError {
    ProviderError::new(ErrorClass::Unsupported, message)
}

impl Modal {
    /// The image a create starts from: a restored snapshot, the request's Modal image, else
    /// the account's.
    fn image(&self, spec: &CreateSpec) -> Result<String, ProviderError> {
        if let Some(snapshot) = &spec.snapshot {
            return Ok(snapshot.clone());
        }
        match &spec.request.source {
            Some(Source::Image(image)) if image.starts_with("im-") => Ok(image.clone()),
            Some(Source::Image(image)) => Err(unsupported(format!(
                "modal starts sandboxes from its own image ids (im-…); {image:?} would need an \
                 image build, which this adapter does not do"
            ))),
            Some(Source::Template(t)) => Err(unsupported(format!(
                "modal has no templates (asked for {t:?})"
            ))),
            Some(Source::Environment(_)) | None => self.account.image_id.clone().ok_or_else(|| {
                unsupported("this modal account names no image (set options.image_id)".into())
            }),
        }
    }

    /// The create's `Sandbox` definition (without its secret).
    fn definition(&self, spec: &CreateSpec) -> Result<proto::Sandbox, ProviderError> {
        let r = &spec.request.resources;
        if r.gpu.is_some_and(|g| g > 0) {
            return Err(unsupported(
                "modal needs a GPU type for GPUs; this adapter sends none".into(),
            ));
        }
        let cpu = r.cpu.or(self.account.cpu);
        let memory_mb = r
            .memory_mb
            .and_then(|m| u32::try_from(m).ok())
            .or(self.account.memory_mb);
        let resources = (cpu.is_some() || memory_mb.is_some()).then(|| proto::Resources {
            milli_cpu: cpu.map(|c| (c * 1000.0).round() as u32).unwrap_or(0),
            memory_mb: memory_mb.unwrap_or(0),
        });
        Ok(proto::Sandbox {
            entrypoint_args: vec!["sleep".into(), "infinity".into()],
            image_id: self.image(spec)?,
            resources,
            timeout_secs: self.account.timeout_secs,
            network_access: Some(network_access(spec.egress.as_ref())),
            ..Default::default()
        })
    }

    /// The environment as an app-owned secret (what the SDK does for `env=`).
    async fn env_secret(
        &self,
        app_id: &str,
        env: BTreeMap<String, String>,
    ) -> Result<String, GrpcFailure> {
        let request = proto::SecretGetOrCreateRequest {
            object_creation_type: proto::ObjectCreationType::AnonymousOwnedByApp as i32,
            env_dict: env.into_iter().collect(),
            app_id: app_id.to_string(),
            environment_name: self.account.environment.clone(),
            ..Default::default()
        };
        let answer: proto::SecretGetOrCreateResponse = self
            .call(proto::client::SECRET_GET_OR_CREATE, request)
            .await?;
        Ok(answer.secret_id)
    }

    /// `SandboxCreate`: the new sandbox's id.
    async fn create_sandbox(&self, spec: &CreateSpec) -> Result<String, ProviderError> {
        let mut definition = self.definition(spec)?;
        let app_id = self.app_id().await.map_err(provider_error)?.to_string();
        let env = create_env(spec, CA_PATH);
        if !env.is_empty() {
            let secret = self
                .env_secret(&app_id, env)
                .await
                .map_err(provider_error)?;
            definition.secret_ids.push(secret);
        }
        let request = proto::SandboxCreateRequest {
            app_id,
            definition: Some(definition),
            environment_name: self.account.environment.clone(),
            tags: vec![
                tag(TAG_SANDBOX, &spec.tags.sandbox_id),
                tag(TAG_ATTEMPT, &spec.tags.attempt_id),
            ],
        };
        // The attempt id is the idempotency key: a create re-sent after a lost answer is the
        // same sandbox.
        let answer: proto::SandboxCreateResponse = self
            .control
            .unary(
                proto::client::SANDBOX_CREATE,
                request,
                Some(&spec.tags.attempt_id),
                Duration::from_secs(60),
            )
            .await
            .map_err(create_error)?;
        if answer.sandbox_id.is_empty() {
            let mut e = ProviderError::new(ErrorClass::Unknown, "modal answered no sandbox id");
            e.maybe_created = true;
            return Err(e);
        }
        Ok(answer.sandbox_id)
    }

    /// Asks for the sandbox's task until it has one; see the module docs for the outcomes.
    pub(super) async fn await_task(&self, id: &str) -> Result<String, ProviderError> {
        let deadline = Instant::now() + self.account.boot_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(left_behind(
                    id,
                    ErrorClass::Capacity,
                    format!(
                        "modal scheduled no task for sandbox {id} within {}s (insufficient capacity)",
                        self.account.boot_timeout.as_secs()
                    ),
                ));
            }
            let wait = left.min(TASK_POLL);
            let request = proto::SandboxGetTaskIdRequest {
                sandbox_id: id.to_string(),
                timeout: Some(wait.as_secs_f32()),
                wait_until_ready: false,
            };
            let answer: proto::SandboxGetTaskIdResponse = self
                .control
                .unary(
                    proto::client::SANDBOX_GET_TASK_ID,
                    request,
                    None,
                    wait + Duration::from_secs(10),
                )
                .await
                .map_err(|f| {
                    let mut e = provider_error(f);
                    e.instance_id = Some(id.to_string());
                    e
                })?;
            if let Some(result) = answer.task_result {
                let status = proto::GenericStatus::try_from(result.status)
                    .map(|s| format!("{s:?}"))
                    .unwrap_or_else(|_| result.status.to_string());
                return Err(failed_before_running(
                    id,
                    format!(
                        "modal sandbox {id} ended before running ({status}): {}",
                        result.exception.chars().take(300).collect::<String>()
                    ),
                ));
            }
            if let Some(task) = answer.task_id.filter(|t| !t.is_empty()) {
                return Ok(task);
            }
        }
    }

    async fn terminate(&self, id: &str) -> Result<(), GrpcFailure> {
        self.forget_router(id);
        let request = proto::SandboxTerminateRequest {
            sandbox_id: id.to_string(),
        };
        match self
            .call::<_, proto::SandboxTerminateResponse>(proto::client::SANDBOX_TERMINATE, request)
            .await
        {
            Ok(_) => Ok(()),
            Err(f) if f.code == Some(tonic::Code::NotFound) => Ok(()),
            Err(f) => Err(f),
        }
    }

    /// Whether the sandbox still runs (`SandboxWait` with no wait): `None` when Modal does
    /// not know it.
    async fn running(&self, id: &str) -> Result<Option<bool>, GrpcFailure> {
        let request = proto::SandboxWaitRequest {
            sandbox_id: id.to_string(),
            timeout: 0.0,
        };
        match self
            .call::<_, proto::SandboxWaitResponse>(proto::client::SANDBOX_WAIT, request)
            .await
        {
            Ok(answer) => Ok(Some(answer.result.is_none())),
            Err(f) if f.code == Some(tonic::Code::NotFound) => Ok(None),
            Err(f) => Err(f),
        }
    }

    /// One page of `SandboxList` with the filter's tags, before `before` (0: the newest).
    async fn page(
        &self,
        filter: &TagFilter<'_>,
        before: f64,
    ) -> Result<(Vec<Instance>, Option<String>), GrpcFailure> {
        let request = proto::SandboxListRequest {
            app_id: self.app_id().await?.to_string(),
            before_timestamp: before,
            environment_name: self.account.environment.clone(),
            include_finished: false,
            tags: filter.pairs().into_iter().map(|(k, v)| tag(k, v)).collect(),
        };
        let answer: proto::SandboxListResponse =
            self.call(proto::client::SANDBOX_LIST, request).await?;
        let next = answer
            .sandboxes
            .iter()
            .map(|s| s.created_at)
            .fold(None, |min: Option<f64>, t| {
                Some(min.map_or(t, |m| m.min(t)))
            })
            .map(|t| t.to_string());
        let live = answer
            .sandboxes
            .iter()
            .filter(|s| s.task_info.as_ref().is_none_or(|t| t.result.is_none()))
            .map(|s| instance(&s.id, &s.tags))
            .collect();
        Ok((live, next))
    }

    async fn install_ca(&self, id: &str, egress: &RemoteEgress) -> Result<(), OpError> {
        self.upload(id, CA_PATH, egress.ca_pem.clone().into_bytes())
            .await
    }

    /// `SandboxSnapshotFs`: the sandbox's files as a new image.
    async fn snapshot_fs(&self, id: &str) -> Result<SnapshotInfo, OpError> {
        let request = proto::SandboxSnapshotFsRequest {
            sandbox_id: id.to_string(),
            timeout: 55.0,
        };
        let answer: proto::SandboxSnapshotFsResponse = self
            .control
            .unary(
                proto::client::SANDBOX_SNAPSHOT_FS,
                request,
                None,
                Duration::from_secs(65),
            )
            .await
            .map_err(op_error)?;
        let failed = answer
            .result
            .as_ref()
            .is_some_and(|r| r.status != proto::GenericStatus::Success as i32);
        if failed || answer.image_id.is_empty() {
            let why = answer.result.map(|r| r.exception).unwrap_or_default();
            return Err(OpError::new(
                OpErrorKind::Provider,
                format!("modal's filesystem snapshot failed: {why}"),
            ));
        }
        Ok(SnapshotInfo {
            id: answer.image_id,
            size_bytes: 0,
        })
    }
}

impl Provider for Modal {
    fn kind(&self) -> &'static str {
        "modal"
    }

    fn create(&self, spec: CreateSpec) -> BoxFuture<'_, Result<Instance, ProviderError>> {
        Box::pin(async move {
            let id = self.create_sandbox(&spec).await?;
            self.await_task(&id).await?;
            if let Some(egress) = &spec.egress {
                if let Err(e) = self.install_ca(&id, egress).await {
                    return Err(ca_not_installed(&id, "sandbox", e));
                }
            }
            Ok(Instance {
                id,
                tags: spec.tags,
                state: InstanceState::Running,
            })
        })
    }

    fn get<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Instance>, ProviderError>> {
        Box::pin(async move {
            if self.running(instance_id).await.map_err(provider_error)? != Some(true) {
                return Ok(None);
            }
            let request = proto::SandboxTagsGetRequest {
                sandbox_id: instance_id.to_string(),
            };
            let tags: proto::SandboxTagsGetResponse = self
                .call(proto::client::SANDBOX_TAGS_GET, request)
                .await
                .map_err(provider_error)?;
            Ok(Some(instance(instance_id, &tags.tags)))
        })
    }

    fn list_by_tag<'a>(
        &'a self,
        sandbox_id: &'a str,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Instance>, ProviderError>> {
        Box::pin(async move {
            let filter = TagFilter::new(sandbox_id, attempt_id);
            let filter = &filter;
            crate::providers::hosted::tags::list(*filter, MAX_PAGES, move |cursor| async move {
                let before = cursor
                    .as_deref()
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0.0);
                self.page(filter, before).await
            })
            .await
            .map_err(provider_error)
        })
    }

    fn delete<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move { self.terminate(instance_id).await.map_err(provider_error) })
    }

    fn capabilities<'a>(
        &'a self,
        _instance_id: &'a str,
    ) -> BoxFuture<'a, Result<RuntimeCapabilities, ProviderError>> {
        Box::pin(async { Ok(super::CAPABILITIES) })
    }

    fn lockdown(&self, egress: &RemoteEgress) -> Option<Value> {
        lockdown(egress)
    }

    fn ca_path(&self) -> Option<&'static str> {
        Some(CA_PATH)
    }

    fn adopt<'a>(
        &'a self,
        instance_id: &'a str,
        egress: Option<&'a RemoteEgress>,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let Some(egress) = egress else {
                return Ok(());
            };
            // An adopted sandbox may not have its task yet.
            self.await_task(instance_id).await?;
            self.install_ca(instance_id, egress)
                .await
                .map_err(|e| crate::providers::adoption_failed(&e))
        })
    }

    fn check(&self) -> BoxFuture<'_, Result<String, ProviderError>> {
        Box::pin(async move {
            let _: proto::ClientHelloResponse = self
                .call(proto::client::CLIENT_HELLO, ())
                .await
                .map_err(provider_error)?;
            let app = self.app_id().await.map_err(provider_error)?;
            Ok(format!(
                "authenticated at {} (app {} is {app})",
                self.account.base_url, self.account.app_name
            ))
        })
    }

    fn exec<'a>(
        &'a self,
        instance_id: &'a str,
        spec: ExecSpec,
    ) -> BoxFuture<'a, Result<ExecStream, OpError>> {
        Box::pin(self.exec_stream(instance_id, spec))
    }

    fn read_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
    ) -> BoxFuture<'a, Result<Vec<u8>, OpError>> {
        Box::pin(self.download(instance_id, path))
    }

    fn write_file<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        data: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(self.upload(instance_id, path, data))
    }

    fn mkdir<'a>(
        &'a self,
        instance_id: &'a str,
        path: &'a str,
        parents: bool,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let mut argv = vec!["mkdir".to_string()];
            if parents {
                argv.push("-p".into());
            }
            argv.extend(["--".to_string(), path.to_string()]);
            self.run_checked(instance_id, argv, Vec::new())
                .await
                .map(|_| ())
        })
    }

    fn snapshot<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<SnapshotInfo, OpError>> {
        Box::pin(self.snapshot_fs(instance_id))
    }

    fn delete_snapshot<'a>(&'a self, snapshot_id: &'a str) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let request = proto::ImageDeleteRequest {
                image_id: snapshot_id.to_string(),
            };
            match self
                .call::<_, ()>(proto::client::IMAGE_DELETE, request)
                .await
            {
                Ok(()) => Ok(()),
                Err(f) if f.code == Some(tonic::Code::NotFound) => Ok(()),
                Err(f) => Err(op_error(f)),
            }
        })
    }

    /// Modal's clock is fixed at create (`timeout_secs`; V1 sandboxes cannot extend it): a
    /// lifetime that outlasts the whole clock is reported, so the operator sees it instead of
    /// the sandbox vanishing unannounced.
    fn extend_lifetime<'a>(
        &'a self,
        _instance_id: &'a str,
        remaining: Option<Duration>,
    ) -> BoxFuture<'a, Result<(), OpError>> {
        Box::pin(async move {
            let clock = Duration::from_secs(u64::from(self.account.timeout_secs));
            match remaining {
                Some(remaining) if remaining + LIFETIME_MARGIN > clock => Err(OpError::new(
                    OpErrorKind::Unsupported,
                    format!(
                        "modal ends a sandbox {}s after its create (the account's timeout_secs, \
                         fixed at create) and cannot extend it; the sandbox's lifetime asks \
                         for {}s more",
                        clock.as_secs(),
                        remaining.as_secs()
                    ),
                )),
                _ => Ok(()),
            }
        })
    }
}
