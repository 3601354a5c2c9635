//! deploy/ against the binary it deploys: the Kubernetes manifests (both kustomize
//! variants), the Compose file, the HAProxy config and the Dockerfile are parsed, and
//! - every sandgate.toml they embed parses with the real config parser, and its listeners
//!   are the containerPorts, the Services' targetPorts, the Compose ports and the load
//!   balancer's backends;
//! - every flag in a container's argv is one `sandgate <subcommand> --help` lists, and every
//!   `--role` value one it accepts;
//! - every environment variable a container sets is one the binary reads, and every one the
//!   config names is set;
//! - every probe path is answered 200 by a running gateway of that role, on that listener;
//! - the policies ConfigMap is generated from exactly `policies/*.rego`;
//! - secrets are placeholders, and the files holding real ones are git-ignored.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_norway::Value;

use sandgate::config::Config;

const BIN: &str = env!("CARGO_BIN_EXE_sandgate");
/// The Kubernetes variants: each a kustomization directory under deploy/.
const K8S_VARIANTS: &[&str] = &["k8s", "k8s/split"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn deploy() -> PathBuf {
    repo().join("deploy")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = read(path);
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

fn s(v: &Value) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a string, found {v:?}"))
}

fn seq(v: &Value) -> &[Value] {
    v.as_sequence().map(Vec::as_slice).unwrap_or(&[])
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_mapping()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let value = match v {
                        Value::String(s) => s.clone(),
                        Value::Number(n) => n.to_string(),
                        Value::Bool(b) => b.to_string(),
                        other => panic!("not a scalar: {other:?}"),
                    };
                    (s(k).to_string(), value)
                })
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// What the binary accepts: its help text, its roles, the variables it reads.

/// `sandgate <path> --help`, cached per subcommand path.
fn help(path: &[String]) -> String {
    static CACHE: OnceLock<Mutex<BTreeMap<Vec<String>, String>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(text) = cache.lock().unwrap().get(path) {
        return text.clone();
    }
    let out = Command::new(BIN)
        .args(path)
        .arg("--help")
        .env_remove("SANDGATE_CONFIG")
        .env_remove("SANDGATE_ROLE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "`sandgate {} --help` failed: {}",
        path.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    cache.lock().unwrap().insert(path.to_vec(), text.clone());
    text
}

/// The values `--flag` accepts according to the help (`[possible values: a, b]`).
fn possible_values(help: &str, flag: &str) -> Vec<String> {
    let at = help
        .find(&format!("{flag} "))
        .unwrap_or_else(|| panic!("{flag} is not in the help:\n{help}"));
    let rest = &help[at..];
    let start = rest
        .find("[possible values: ")
        .unwrap_or_else(|| panic!("the help lists no values for {flag}:\n{help}"))
        + "[possible values: ".len();
    let end = rest[start..].find(']').unwrap() + start;
    rest[start..end]
        .split(',')
        .map(|v| v.trim().to_string())
        .collect()
}

/// Variables shown as `[env: NAME=]` in a subcommand's help.
fn help_env_vars(help: &str) -> BTreeSet<String> {
    help.split("[env: ")
        .skip(1)
        .filter_map(|rest| rest.split(['=', ']']).next())
        .map(str::to_string)
        .collect()
}

/// Environment variables a configuration names for secrets (`token_env`, `secret_env`,
/// `api_key_env`): the process fails to start when one is unset.
fn config_env_vars(config: &Config) -> BTreeSet<String> {
    let mut vars = BTreeSet::new();
    vars.extend(config.api.tokens.iter().filter_map(|t| t.token_env.clone()));
    vars.extend(
        config
            .egress
            .identities
            .iter()
            .filter_map(|i| i.token_env.clone()),
    );
    vars.extend(
        config
            .credentials
            .iter()
            .filter_map(|c| c.secret_env.clone()),
    );
    vars.extend(config.accounts.iter().filter_map(|a| a.api_key_env.clone()));
    vars
}

/// Variables the binary reads whatever the config: the master key, and the logging
/// variable the config documents (`RUST_LOG` wins over `[log] level`).
fn process_env_vars() -> BTreeSet<String> {
    [
        sandgate::credentials::seal::MASTER_KEY_ENV.to_string(),
        "RUST_LOG".to_string(),
    ]
    .into()
}

/// The subcommand path of an argv (the words before the first flag) and its flags.
fn split_argv(argv: &[String]) -> (Vec<String>, Vec<(String, Option<String>)>) {
    let path: Vec<String> = argv
        .iter()
        .take_while(|a| !a.starts_with('-'))
        .cloned()
        .collect();
    let mut flags = Vec::new();
    let mut rest = argv[path.len()..].iter().peekable();
    while let Some(arg) = rest.next() {
        assert!(
            arg.starts_with('-'),
            "positional argument {arg:?} after the flags"
        );
        let (flag, value) = match arg.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => {
                let value = rest.next_if(|v| !v.starts_with('-')).cloned();
                (arg.clone(), value)
            }
        };
        flags.push((flag, value));
    }
    (path, flags)
}

/// The `--role` a `serve` argv and environment select (clap: the flag, else SANDGATE_ROLE,
/// else `all`).
fn role_of(argv: &[String], env: &BTreeMap<String, Option<String>>) -> String {
    let (_, flags) = split_argv(argv);
    flags
        .iter()
        .find(|(f, _)| f == "--role")
        .and_then(|(_, v)| v.clone())
        .or_else(|| env.get("SANDGATE_ROLE").cloned().flatten())
        .unwrap_or_else(|| "all".into())
}

fn serves_proxy(role: &str) -> bool {
    matches!(role, "all" | "proxy")
}

fn serves_api(role: &str) -> bool {
    matches!(role, "all" | "api")
}

/// One process of the sandgate binary a manifest starts, with what the manifest gives it.
struct Launch {
    /// Where it is declared, for messages.
    origin: String,
    /// The arguments after the image's entrypoint (`sandgate`).
    argv: Vec<String>,
    /// Variables set, with their literal value when the manifest writes one.
    env: BTreeMap<String, Option<String>>,
    /// The configuration it reads (with `[store] url` left out: see [`listener_config`]).
    config: Config,
}

/// Flags, role values and environment of a launch against the binary.
fn check_launch(launch: &Launch) {
    let origin = &launch.origin;
    let (path, flags) = split_argv(&launch.argv);
    assert!(
        !path.is_empty(),
        "{origin}: no subcommand in {:?}",
        launch.argv
    );
    let help = help(&path);
    for (flag, value) in &flags {
        let listed = if flag.starts_with("--") {
            help.contains(&format!("{flag} ")) || help.contains(&format!("{flag},"))
        } else {
            help.contains(&format!("{flag}, "))
        };
        assert!(
            listed,
            "{origin}: `sandgate {}` has no flag {flag}:\n{help}",
            path.join(" ")
        );
        if flag == "--role" {
            let value = value
                .as_deref()
                .unwrap_or_else(|| panic!("{origin}: --role without a value"));
            let values = possible_values(&help, "--role");
            assert!(
                values.iter().any(|v| v == value),
                "{origin}: --role {value} is not one of {values:?}"
            );
        }
    }
    let mut read = help_env_vars(&help);
    read.extend(process_env_vars());
    let named = config_env_vars(&launch.config);
    read.extend(named.iter().cloned());
    for name in launch.env.keys() {
        assert!(
            read.contains(name),
            "{origin}: sets {name}, which `sandgate {}` does not read (it reads {read:?})",
            path.join(" ")
        );
    }
    if let Some(Some(role)) = launch.env.get("SANDGATE_ROLE") {
        let values = possible_values(&help, "--role");
        assert!(
            values.contains(role),
            "{origin}: SANDGATE_ROLE={role} is not one of {values:?}"
        );
    }
    if path == ["serve"] {
        for name in &named {
            assert!(
                launch.env.contains_key(name),
                "{origin}: the config names {name}, which the container does not set"
            );
        }
        // Without it each replica generates a master key of its own, and secrets sealed
        // by one cannot be opened by another.
        assert!(
            launch
                .env
                .contains_key(sandgate::credentials::seal::MASTER_KEY_ENV),
            "{origin}: every replica needs the shared SANDGATE_MASTER_KEY"
        );
        assert!(
            launch.env.contains_key("SANDGATE_CONFIG")
                || flags.iter().any(|(f, _)| f == "--config" || f == "-c"),
            "{origin}: serve without a config file runs the loopback-only defaults"
        );
    }
}

/// Listeners must be reachable from outside the container.
fn check_listeners_reachable(origin: &str, config: &Config) {
    let mut addrs = vec![("proxy.listen", config.proxy.listen)];
    addrs.extend(config.proxy.tls_listen.map(|a| ("proxy.tls_listen", a)));
    addrs.push(("api.listen", config.api.listen));
    for (key, addr) in addrs {
        assert!(
            !addr.ip().is_loopback(),
            "{origin}: {key} = {addr} is unreachable from outside the container"
        );
    }
}

/// The listener ports a role binds, by the names the manifests give them.
fn role_ports(config: &Config, role: &str) -> BTreeMap<&'static str, u16> {
    let mut ports = BTreeMap::new();
    if serves_proxy(role) {
        ports.insert("proxy", config.proxy.listen.port());
        if let Some(tls) = config.proxy.tls_listen {
            ports.insert("proxy-tls", tls.port());
        }
    }
    ports.insert("api", config.api.listen.port());
    ports
}

/// The configuration as the real parser reads it, without its `[store] url` (the Postgres
/// store is checked on its own in `embedded_configs_parse_with_the_postgres_store`, so
/// that the listener checks do not depend on it).
fn listener_config(origin: &str, text: &str) -> Config {
    let mut table: toml::Table =
        toml::from_str(text).unwrap_or_else(|e| panic!("{origin}: not TOML: {e}"));
    if let Some(toml::Value::Table(store)) = table.get_mut("store") {
        store.remove("url");
    }
    let text = toml::to_string(&table).unwrap();
    Config::from_toml(&text).unwrap_or_else(|e| panic!("{origin}: {e}\n{text}"))
}

// ---------------------------------------------------------------------------------------
// Kubernetes: the kustomize tree as kustomize builds it (resources and ConfigMap
// generators), without running kustomize.

struct Generator {
    name: String,
    /// ConfigMap key -> file.
    files: BTreeMap<String, PathBuf>,
}

#[derive(Default)]
struct Kustomized {
    objects: Vec<(PathBuf, Value)>,
    generators: Vec<Generator>,
}

impl Kustomized {
    fn load(dir: &Path) -> Kustomized {
        let file = dir.join("kustomization.yaml");
        let k = yaml_docs(&file).remove(0);
        assert_eq!(k["kind"], "Kustomization", "{}", file.display());
        let mut out = Kustomized::default();
        for resource in seq(&k["resources"]) {
            let path = dir.join(s(resource));
            if path.is_dir() {
                let inner = Kustomized::load(&path);
                out.objects.extend(inner.objects);
                out.generators.extend(inner.generators);
            } else {
                out.objects
                    .extend(yaml_docs(&path).into_iter().map(|d| (path.clone(), d)));
            }
        }
        for generator in seq(&k["configMapGenerator"]) {
            let mut files = BTreeMap::new();
            for entry in seq(&generator["files"]) {
                let entry = s(entry);
                let (key, rel) = match entry.split_once('=') {
                    Some((key, rel)) => (key.to_string(), rel),
                    None => (
                        Path::new(entry)
                            .file_name()
                            .unwrap()
                            .to_string_lossy()
                            .into_owned(),
                        entry,
                    ),
                };
                let path = dir.join(rel);
                assert!(path.is_file(), "{}: no file {rel}", file.display());
                assert!(files.insert(key.clone(), path).is_none(), "duplicate {key}");
            }
            out.generators.push(Generator {
                name: s(&generator["name"]).to_string(),
                files,
            });
        }
        out
    }

    fn of_kind(&self, kind: &str) -> impl Iterator<Item = &(PathBuf, Value)> + '_ {
        let kind = kind.to_string();
        self.objects.iter().filter(move |(_, o)| o["kind"] == *kind)
    }

    fn generator(&self, name: &str) -> &Generator {
        self.generators
            .iter()
            .find(|g| g.name == name)
            .unwrap_or_else(|| panic!("no ConfigMap generator {name}"))
    }
}

/// deploy/k8s/secret.example.yaml: Secret name -> key -> value.
fn example_secrets() -> BTreeMap<String, BTreeMap<String, String>> {
    yaml_docs(&deploy().join("k8s/secret.example.yaml"))
        .iter()
        .map(|doc| {
            assert_eq!(doc["kind"], "Secret");
            assert!(
                doc["data"].is_null(),
                "secret.example.yaml: use stringData (readable placeholders)"
            );
            (
                s(&doc["metadata"]["name"]).to_string(),
                string_map(&doc["stringData"]),
            )
        })
        .collect()
}

/// A Deployment's pod as the test sees it.
struct Pod<'a> {
    origin: String,
    deployment: &'a Value,
    spec: &'a Value,
    labels: BTreeMap<String, String>,
}

impl<'a> Pod<'a> {
    fn new(file: &Path, deployment: &'a Value) -> Pod<'a> {
        let name = s(&deployment["metadata"]["name"]);
        let template = &deployment["spec"]["template"];
        Pod {
            origin: format!(
                "{} Deployment {name}",
                file.strip_prefix(repo()).unwrap().display()
            ),
            deployment,
            spec: &template["spec"],
            labels: string_map(&template["metadata"]["labels"]),
        }
    }

    /// The container running `sandgate` (the image's entrypoint: no `command`).
    fn main(&self) -> &'a Value {
        let containers = seq(&self.spec["containers"]);
        assert_eq!(containers.len(), 1, "{}: one container", self.origin);
        assert!(
            containers[0]["command"].is_null(),
            "{}: the image's entrypoint is sandgate; give `args`",
            self.origin
        );
        &containers[0]
    }

    fn argv(&self) -> Vec<String> {
        seq(&self.main()["args"])
            .iter()
            .map(|a| s(a).to_string())
            .collect()
    }

    fn env(&self, container: &Value) -> BTreeMap<String, Option<String>> {
        assert!(
            container["envFrom"].is_null(),
            "{}: name each variable (env), so the test sees them",
            self.origin
        );
        seq(&container["env"])
            .iter()
            .map(|e| {
                (
                    s(&e["name"]).to_string(),
                    e["value"].as_str().map(str::to_string),
                )
            })
            .collect()
    }

    fn role(&self) -> String {
        role_of(&self.argv(), &self.env(self.main()))
    }

    fn volume(&self, name: &str) -> &'a Value {
        seq(&self.spec["volumes"])
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("{}: no volume {name}", self.origin))
    }

    /// mountPath -> volume, for one container.
    fn mounts(&self, container: &Value) -> BTreeMap<String, &'a Value> {
        seq(&container["volumeMounts"])
            .iter()
            .map(|m| {
                assert!(
                    m["subPath"].is_null(),
                    "{}: subPath mounts never see ConfigMap updates",
                    self.origin
                );
                (s(&m["mountPath"]).to_string(), self.volume(s(&m["name"])))
            })
            .collect()
    }

    /// The container's named ports.
    fn ports(&self) -> BTreeMap<String, u16> {
        seq(&self.main()["ports"])
            .iter()
            .map(|p| {
                (
                    s(&p["name"]).to_string(),
                    p["containerPort"].as_u64().unwrap() as u16,
                )
            })
            .collect()
    }

    /// A port reference (a name or a number) resolved to a containerPort.
    fn resolve_port(&self, port: &Value) -> u16 {
        match port {
            Value::Number(n) => n.as_u64().unwrap() as u16,
            Value::String(name) => *self
                .ports()
                .get(name)
                .unwrap_or_else(|| panic!("{}: no container port named {name}", self.origin)),
            other => panic!("{}: port {other:?}", self.origin),
        }
    }
}

/// Runs the `render-config` init container's script on a copy of the pod's volumes and
/// returns the file its main container reads as SANDGATE_CONFIG (ConfigMap files from the
/// generators, Secret values from secret.example.yaml).
fn render_pod_config(kustomized: &Kustomized, pod: &Pod) -> String {
    let init = seq(&pod.spec["initContainers"])
        .iter()
        .find(|c| c["name"] == "render-config")
        .unwrap_or_else(|| panic!("{}: no render-config init container", pod.origin));
    let command: Vec<&str> = seq(&init["command"]).iter().map(s).collect();
    assert_eq!(command, ["/bin/sh", "-c"], "{}", pod.origin);
    let script = s(&seq(&init["args"])[0]);
    assert!(
        !script.contains("$("),
        "{}: Kubernetes expands $(VAR) in args; the script must not use $(...)",
        pod.origin
    );
    let root = tempfile::tempdir().unwrap();
    // One directory per volume, shared by the containers that mount it.
    let volume_dir = |volume: &Value| -> PathBuf {
        let dir = root.path().join(s(&volume["name"]));
        if !dir.exists() {
            std::fs::create_dir_all(&dir).unwrap();
            if let Some(name) = volume["configMap"]["name"].as_str() {
                for (key, file) in &kustomized.generator(name).files {
                    std::fs::copy(file, dir.join(key)).unwrap();
                }
            }
        }
        dir
    };
    let mut script = script.to_string();
    let init_mounts = pod.mounts(init);
    // Longest first, so a mount path inside another is replaced whole.
    let mut paths: Vec<_> = init_mounts.iter().collect();
    paths.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    for (path, volume) in paths {
        script = script.replace(path.as_str(), volume_dir(volume).to_str().unwrap());
    }
    let secrets = example_secrets();
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(&script)
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    for e in seq(&init["env"]) {
        let name = s(&e["name"]);
        let value = match e["value"].as_str() {
            Some(v) => v.to_string(),
            None => {
                let r = &e["valueFrom"]["secretKeyRef"];
                secrets[s(&r["name"])][s(&r["key"])].clone()
            }
        };
        cmd.env(name, value);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}: render-config failed: {}",
        pod.origin,
        String::from_utf8_lossy(&out.stderr)
    );
    // The main container reads what the init container wrote, through the same volume.
    let main = pod.main();
    let env = pod.env(main);
    let config_path = env["SANDGATE_CONFIG"]
        .clone()
        .unwrap_or_else(|| panic!("{}: SANDGATE_CONFIG has no value", pod.origin));
    let (mount, volume) = pod
        .mounts(main)
        .into_iter()
        .filter(|(m, _)| config_path.starts_with(&format!("{m}/")))
        .max_by_key(|(m, _)| m.len())
        .unwrap_or_else(|| panic!("{}: nothing is mounted at {config_path}", pod.origin));
    let file = volume_dir(volume).join(&config_path[mount.len() + 1..]);
    read(&file)
}

/// The ConfigMap text of a pod's config (what render-config starts from).
fn base_config_text(kustomized: &Kustomized, pod: &Pod) -> String {
    let volume = pod.volume("config");
    let name = s(&volume["configMap"]["name"]);
    read(&kustomized.generator(name).files["sandgate.toml"])
}

fn k8s_pods(kustomized: &Kustomized) -> Vec<Pod<'_>> {
    kustomized
        .of_kind("Deployment")
        .map(|(file, d)| Pod::new(file, d))
        .collect()
}

fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[test]
fn k8s_listeners_are_the_container_ports_and_the_services_target_them() {
    for variant in K8S_VARIANTS {
        let kustomized = Kustomized::load(&deploy().join(variant));
        let pods = k8s_pods(&kustomized);
        assert!(!pods.is_empty(), "{variant}: no Deployment");
        let mut configs = Vec::new();
        for pod in &pods {
            let config = listener_config(&pod.origin, &base_config_text(&kustomized, pod));
            check_listeners_reachable(&pod.origin, &config);
            let role = pod.role();
            let expected: BTreeMap<String, u16> = role_ports(&config, &role)
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            assert_eq!(
                pod.ports(),
                expected,
                "{}: role {role} listens on exactly these ports",
                pod.origin
            );
            configs.push((pod, config, role));
        }
        for (file, service) in kustomized.of_kind("Service") {
            let name = s(&service["metadata"]["name"]);
            let origin = format!("{} Service {name}", file.display());
            let selector = string_map(&service["spec"]["selector"]);
            let backends: Vec<_> = configs
                .iter()
                .filter(|(pod, _, _)| selects(&selector, &pod.labels))
                .collect();
            assert!(!backends.is_empty(), "{origin}: selects no pod");
            for port in seq(&service["spec"]["ports"]) {
                let port_name = s(&port["name"]);
                for (pod, config, role) in &backends {
                    let target = pod.resolve_port(&port["targetPort"]);
                    let listeners = role_ports(config, role);
                    assert_eq!(
                        listeners.get(port_name),
                        Some(&target),
                        "{origin}: port {port_name} reaches {target} on {} (role {role}, listeners {listeners:?})",
                        pod.origin
                    );
                    assert_eq!(
                        port["port"].as_u64(),
                        Some(target as u64),
                        "{origin}: port {port_name}: the Service port is the listener's"
                    );
                }
            }
        }
        // Pods that serve a plane are behind a Service for it.
        for (pod, _, role) in &configs {
            for (plane, port_name) in [("proxy", "proxy"), ("api", "api")] {
                let serves = if plane == "proxy" {
                    serves_proxy(role)
                } else {
                    serves_api(role)
                };
                let behind = kustomized.of_kind("Service").any(|(_, svc)| {
                    selects(&string_map(&svc["spec"]["selector"]), &pod.labels)
                        && seq(&svc["spec"]["ports"])
                            .iter()
                            .any(|p| p["name"] == port_name)
                });
                assert_eq!(
                    behind, serves,
                    "{}: role {role} and a Service for the {plane} plane",
                    pod.origin
                );
            }
        }
        // Hosted sandboxes are given public_url: a Service must expose that port.
        for (pod, config, _) in &configs {
            if let Some(url) = config.proxy.public_url() {
                let tls = config.proxy.tls_listen.unwrap().port();
                let exposed = kustomized.of_kind("Service").any(|(_, svc)| {
                    selects(&string_map(&svc["spec"]["selector"]), &pod.labels)
                        && seq(&svc["spec"]["ports"]).iter().any(|p| {
                            p["port"].as_u64() == Some(url.port as u64)
                                && pod.resolve_port(&p["targetPort"]) == tls
                        })
                });
                if serves_proxy(&pod.role()) {
                    assert!(
                        exposed,
                        "{}: no Service exposes public_url's port {} on the TLS listener",
                        pod.origin, url.port
                    );
                }
            }
        }
    }
}

#[test]
fn k8s_probes_and_pod_security() {
    for variant in K8S_VARIANTS {
        let kustomized = Kustomized::load(&deploy().join(variant));
        let pdbs: Vec<_> = kustomized.of_kind("PodDisruptionBudget").collect();
        for pod in k8s_pods(&kustomized) {
            let origin = &pod.origin;
            let config = listener_config(origin, &base_config_text(&kustomized, &pod));
            let main = pod.main();
            for (probe, paths) in [
                ("readinessProbe", &["/readyz"][..]),
                ("livenessProbe", &["/livez"][..]),
                ("startupProbe", &["/livez", "/readyz"][..]),
            ] {
                let get = &main[probe]["httpGet"];
                if probe == "startupProbe" && main[probe].is_null() {
                    continue;
                }
                let path = s(&get["path"]);
                assert!(paths.contains(&path), "{origin}: {probe} asks {path}");
                assert_eq!(
                    pod.resolve_port(&get["port"]),
                    config.api.listen.port(),
                    "{origin}: {probe} goes to the API listener"
                );
            }
            let replicas = least_replicas(&kustomized, pod.deployment);
            assert!(replicas >= 2, "{origin}: {replicas} replica(s)");
            let psc = &pod.spec["securityContext"];
            assert_eq!(psc["runAsNonRoot"], true, "{origin}");
            assert!(psc["runAsUser"].as_u64().unwrap_or(0) > 0, "{origin}");
            let mut containers: Vec<&Value> = seq(&pod.spec["containers"]).iter().collect();
            containers.extend(seq(&pod.spec["initContainers"]));
            for c in containers {
                let name = s(&c["name"]);
                let sc = &c["securityContext"];
                assert_eq!(sc["allowPrivilegeEscalation"], false, "{origin} {name}");
                assert_ne!(sc["privileged"], true, "{origin} {name}");
                assert_eq!(sc["readOnlyRootFilesystem"], true, "{origin} {name}");
                assert!(
                    seq(&sc["capabilities"]["drop"]).iter().any(|d| d == "ALL"),
                    "{origin} {name}: drop ALL capabilities"
                );
                assert!(
                    !c["resources"]["requests"].is_null() && !c["resources"]["limits"].is_null(),
                    "{origin} {name}: resources"
                );
            }
            // Exactly one PDB covers the pods, keeping one of them up.
            let covering: Vec<_> = pdbs
                .iter()
                .filter(|(_, pdb)| {
                    selects(
                        &string_map(&pdb["spec"]["selector"]["matchLabels"]),
                        &pod.labels,
                    )
                })
                .collect();
            assert_eq!(covering.len(), 1, "{origin}: PodDisruptionBudgets");
            assert_eq!(covering[0].1["spec"]["minAvailable"], 1, "{origin}");
            // The Deployment's selector picks its own pods.
            assert!(
                selects(
                    &string_map(&pod.deployment["spec"]["selector"]["matchLabels"]),
                    &pod.labels
                ),
                "{origin}: selector"
            );
        }
    }
}

/// The fewest replicas a Deployment runs: its HorizontalPodAutoscaler's `minReplicas`, or its
/// own `replicas` (Kubernetes' default 1). Both at once would fight on every apply.
fn least_replicas(kustomized: &Kustomized, deployment: &Value) -> u64 {
    let name = s(&deployment["metadata"]["name"]);
    let hpa = kustomized
        .of_kind("HorizontalPodAutoscaler")
        .find(|(_, h)| {
            h["spec"]["scaleTargetRef"]["kind"] == "Deployment"
                && h["spec"]["scaleTargetRef"]["name"] == name
        });
    match hpa {
        Some((file, h)) => {
            assert!(
                deployment["spec"]["replicas"].is_null(),
                "{name}: both `replicas` and an autoscaler ({})",
                file.display()
            );
            h["spec"]["minReplicas"].as_u64().unwrap_or(1)
        }
        None => deployment["spec"]["replicas"].as_u64().unwrap_or(1),
    }
}

#[test]
fn k8s_flags_environment_and_mounts_match_the_binary() {
    let secrets = example_secrets();
    for variant in K8S_VARIANTS {
        let kustomized = Kustomized::load(&deploy().join(variant));
        for pod in k8s_pods(&kustomized) {
            let origin = &pod.origin;
            let config = listener_config(origin, &base_config_text(&kustomized, &pod));
            let main = pod.main();
            let env = pod.env(main);
            check_launch(&Launch {
                origin: origin.clone(),
                argv: pod.argv(),
                env: env.clone(),
                config: config.clone(),
            });
            // Every Secret reference exists in the example.
            let mut containers: Vec<&Value> = seq(&pod.spec["containers"]).iter().collect();
            containers.extend(seq(&pod.spec["initContainers"]));
            for c in containers {
                for e in seq(&c["env"]) {
                    let r = &e["valueFrom"]["secretKeyRef"];
                    if r.is_null() {
                        assert!(!e["value"].is_null(), "{origin}: {:?}", e["name"]);
                        continue;
                    }
                    let (name, key) = (s(&r["name"]), s(&r["key"]));
                    assert!(
                        secrets.get(name).is_some_and(|k| k.contains_key(key)),
                        "{origin}: Secret {name} key {key} is not in secret.example.yaml"
                    );
                }
            }
            // The directories the config names are the right volumes.
            let mounts = pod.mounts(main);
            let policy_dir = config.policy.dir.to_str().unwrap();
            let policies = mounts
                .get(policy_dir)
                .unwrap_or_else(|| panic!("{origin}: nothing mounted at {policy_dir}"));
            assert_eq!(
                policies["configMap"]["name"], "sandgate-policies",
                "{origin}: [policy] dir"
            );
            let ca_dir = config.tls.ca_dir.to_str().unwrap();
            let ca = mounts
                .get(ca_dir)
                .unwrap_or_else(|| panic!("{origin}: nothing mounted at {ca_dir}"));
            let ca_secret = s(&ca["secret"]["secretName"]);
            for key in ["ca.pem", "ca.key"] {
                assert!(
                    secrets[ca_secret].contains_key(key),
                    "{origin}: Secret {ca_secret} has no {key}"
                );
            }
            // Every writable path the defaults use is a volume (the root is read-only).
            let workdir_default = config.store.path.parent().unwrap();
            assert!(
                workdir_default.is_relative(),
                "{origin}: relative state paths land in the image's WORKDIR"
            );
            assert!(
                mounts.contains_key("/var/lib/sandgate"),
                "{origin}: the WORKDIR is read-only without a volume"
            );
        }
    }
}

#[test]
fn secrets_are_placeholders_and_the_filled_in_files_are_ignored() {
    for (name, keys) in example_secrets() {
        assert!(!keys.is_empty(), "Secret {name}");
        for (key, value) in keys {
            assert!(
                value.contains("REPLACE"),
                "secret.example.yaml {name}.{key} is not a placeholder"
            );
        }
    }
    let env = dotenv(&deploy().join(".env.example"));
    assert!(!env.is_empty());
    for (key, value) in &env {
        assert!(
            value.contains("REPLACE"),
            ".env.example {key} is not a placeholder"
        );
    }
    let gitignore = read(&repo().join(".gitignore"));
    let dockerignore = read(&deploy().join("Dockerfile.dockerignore"));
    for file in ["deploy/.env", "deploy/k8s/secret.yaml"] {
        assert!(
            gitignore.lines().any(|l| l.trim() == format!("/{file}")),
            ".gitignore lacks /{file}"
        );
        assert!(
            dockerignore.lines().any(|l| l.trim() == file),
            "Dockerfile.dockerignore lacks {file}"
        );
    }
}

/// The manifests' [store] url is Postgres, and the whole file (with it) parses. Fails until
/// the Postgres store (`[store] url`) is in the config parser.
#[test]
fn embedded_configs_parse_with_the_postgres_store() {
    let mut texts = Vec::new();
    for variant in K8S_VARIANTS {
        let kustomized = Kustomized::load(&deploy().join(variant));
        for pod in k8s_pods(&kustomized) {
            texts.push((pod.origin.clone(), render_pod_config(&kustomized, &pod)));
        }
    }
    let compose = Compose::load();
    texts.push(("deploy/compose.yaml".into(), compose.config_text()));
    for (origin, text) in texts {
        let table: toml::Table = toml::from_str(&text).unwrap();
        let url = table["store"]["url"]
            .as_str()
            .unwrap_or_else(|| panic!("{origin}: no [store] url"));
        let url = PgUrl::parse(url).unwrap_or_else(|| panic!("{origin}: {url:?}"));
        assert!(!url.password.is_empty(), "{origin}: no password in the URL");
        if let Err(e) = Config::from_toml(&text) {
            panic!("{origin}: the config does not parse: {e}\n{text}");
        }
    }
}

/// `postgres://USER:PASSWORD@HOST:PORT/DB`
#[derive(Debug)]
struct PgUrl {
    user: String,
    password: String,
    host: String,
    port: u16,
    db: String,
}

impl PgUrl {
    fn parse(url: &str) -> Option<PgUrl> {
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))?;
        let (auth, rest) = rest.rsplit_once('@')?;
        let (user, password) = auth.split_once(':')?;
        let (hostport, db) = rest.split_once('/')?;
        let (host, port) = hostport.rsplit_once(':')?;
        Some(PgUrl {
            user: user.into(),
            password: password.into(),
            host: host.into(),
            port: port.parse().ok()?,
            db: db.split('?').next()?.into(),
        })
    }
}

#[test]
fn the_policies_configmap_is_generated_from_exactly_the_repo_policies() {
    let dir = repo().join("policies");
    let mut expected: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".rego"))
        .collect();
    expected.sort();
    assert!(!expected.is_empty());
    for variant in K8S_VARIANTS {
        let kustomized = Kustomized::load(&deploy().join(variant));
        let generator = kustomized.generator("sandgate-policies");
        let keys: Vec<String> = generator.files.keys().cloned().collect();
        assert_eq!(keys, expected, "{variant}: the policies ConfigMap");
        for (key, file) in &generator.files {
            assert_eq!(
                file.canonicalize().unwrap(),
                dir.join(key).canonicalize().unwrap(),
                "{variant}: {key} comes from policies/"
            );
        }
        // Updated in place, so the mounted directory changes and replicas reload it.
        let k = yaml_docs(&deploy().join("k8s/base/kustomization.yaml")).remove(0);
        let entry = seq(&k["configMapGenerator"])
            .iter()
            .find(|g| g["name"] == "sandgate-policies")
            .unwrap();
        assert_eq!(entry["options"]["disableNameSuffixHash"], true);
    }
    // The image's bundled copy is the same directory.
    let dockerfile = read(&deploy().join("Dockerfile"));
    assert!(dockerfile.contains("COPY policies /etc/sandgate/policies"));
}

/// kustomize itself builds what `Kustomized` reads: the same objects, the policy files as
/// ConfigMap data, and the hashed config ConfigMap referenced by the Deployments.
#[test]
fn kustomize_builds_what_the_test_reads() {
    let Some(kubectl) = which("kubectl") else {
        if std::env::var_os("CI").is_some() {
            panic!("kubectl is not installed");
        }
        eprintln!("skipped: kubectl is not installed");
        return;
    };
    for variant in K8S_VARIANTS {
        let dir = deploy().join(variant);
        let out = Command::new(&kubectl)
            .args(["kustomize", "--load-restrictor=LoadRestrictionsNone"])
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{variant}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let built: Vec<Value> = serde_norway::Deserializer::from_str(&text)
            .map(|d| Value::deserialize(d).unwrap())
            .collect();
        let kustomized = Kustomized::load(&dir);
        let mut ours: BTreeSet<(String, String)> = kustomized
            .objects
            .iter()
            .map(|(_, o)| {
                (
                    s(&o["kind"]).to_string(),
                    s(&o["metadata"]["name"]).to_string(),
                )
            })
            .collect();
        ours.extend(
            kustomized
                .generators
                .iter()
                .map(|g| ("ConfigMap".to_string(), g.name.clone())),
        );
        let mut config_maps = BTreeMap::new();
        let theirs: BTreeSet<(String, String)> = built
            .iter()
            .map(|o| {
                let kind = s(&o["kind"]).to_string();
                let name = s(&o["metadata"]["name"]).to_string();
                if kind == "ConfigMap" {
                    config_maps.insert(name.clone(), string_map(&o["data"]));
                }
                // Generated names carry a content hash suffix.
                let base = kustomized
                    .generators
                    .iter()
                    .map(|g| g.name.clone())
                    .find(|g| kind == "ConfigMap" && name.starts_with(g.as_str()))
                    .unwrap_or(name);
                (kind, base)
            })
            .collect();
        assert_eq!(ours, theirs, "{variant}");
        let policies = &config_maps["sandgate-policies"];
        for (key, file) in &kustomized.generator("sandgate-policies").files {
            assert_eq!(policies.get(key), Some(&read(file)), "{variant}: {key}");
        }
        for d in built.iter().filter(|o| o["kind"] == "Deployment") {
            for v in seq(&d["spec"]["template"]["spec"]["volumes"]) {
                if let Some(name) = v["configMap"]["name"].as_str() {
                    assert!(
                        config_maps.contains_key(name),
                        "{variant}: volume refers to ConfigMap {name}, which is not built"
                    );
                }
            }
        }
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(program))
            .find(|p| p.is_file())
    })
}

// ---------------------------------------------------------------------------------------
// Compose and HAProxy.

/// deploy/.env.example: `KEY=VALUE` lines.
fn dotenv(path: &Path) -> BTreeMap<String, String> {
    read(path)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("{l:?}"));
            (k.trim().to_string(), v.trim().to_string())
        })
        .collect()
}

/// Compose interpolation: `$$`, `$NAME`, `${NAME}`, `${NAME:-default}`, `${NAME-default}`,
/// `${NAME:?message}`, `${NAME?message}`. A variable without a default must be in `vars`.
fn interpolate(text: &str, vars: &BTreeMap<String, String>) -> String {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        rest = &rest[i + 1..];
        if let Some(r) = rest.strip_prefix('$') {
            out.push('$');
            rest = r;
            continue;
        }
        let (name, op) = if let Some(r) = rest.strip_prefix('{') {
            let end = r.find('}').expect("unclosed ${");
            let expr = &r[..end];
            rest = &r[end + 1..];
            let n = expr.find(|c: char| !ident(c)).unwrap_or(expr.len());
            (&expr[..n], &expr[n..])
        } else {
            let n = rest.find(|c: char| !ident(c)).unwrap_or(rest.len());
            let name = &rest[..n];
            rest = &rest[n..];
            (name, "")
        };
        let value = vars.get(name).filter(|v| !v.is_empty());
        let default = op.strip_prefix(":-").or_else(|| op.strip_prefix('-'));
        match (value, default) {
            (Some(v), _) => out.push_str(v),
            (None, Some(d)) => out.push_str(d),
            (None, None) => panic!("${{{name}}} is not set in deploy/.env.example"),
        }
    }
    out.push_str(rest);
    out
}

struct Compose {
    doc: Value,
    env: BTreeMap<String, String>,
}

impl Compose {
    fn load() -> Compose {
        let env = dotenv(&deploy().join(".env.example"));
        let mut doc: Value = serde_norway::from_str(&read(&deploy().join("compose.yaml"))).unwrap();
        // Compose interpolates the parsed values (not comments).
        fn walk(v: &mut Value, env: &BTreeMap<String, String>) {
            match v {
                Value::String(text) => *text = interpolate(text, env),
                Value::Sequence(list) => list.iter_mut().for_each(|v| walk(v, env)),
                Value::Mapping(map) => map.values_mut().for_each(|v| walk(v, env)),
                _ => {}
            }
        }
        walk(&mut doc, &env);
        Compose { doc, env }
    }

    fn service(&self, name: &str) -> &Value {
        let v = &self.doc["services"][name];
        assert!(!v.is_null(), "compose: no service {name}");
        v
    }

    fn services(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.doc["services"]
            .as_mapping()
            .unwrap()
            .iter()
            .map(|(k, v)| (s(k), v))
    }

    /// Services that run the sandgate image.
    fn sandgate_services(&self) -> Vec<(&str, &Value)> {
        let image = self.service("sandgate")["image"].clone();
        self.services()
            .filter(|(_, v)| v["image"] == image)
            .collect()
    }

    /// The sandgate.toml the sandgate services mount (interpolated).
    fn config_text(&self) -> String {
        let sources: BTreeSet<String> = self
            .sandgate_services()
            .iter()
            .flat_map(|(_, v)| {
                seq(&v["configs"])
                    .iter()
                    .map(|c| s(&c["source"]).to_string())
            })
            .collect();
        assert_eq!(sources.len(), 1, "one sandgate.toml for every service");
        let source = sources.into_iter().next().unwrap();
        s(&self.doc["configs"][source.as_str()]["content"]).to_string()
    }

    fn env(&self, service: &Value) -> BTreeMap<String, Option<String>> {
        assert!(
            service["env_file"].is_null(),
            "compose: name each variable (environment), so the test sees them"
        );
        match &service["environment"] {
            Value::Null => BTreeMap::new(),
            Value::Mapping(m) => m
                .iter()
                .map(|(k, v)| (s(k).to_string(), v.as_str().map(str::to_string)))
                .collect(),
            Value::Sequence(list) => list
                .iter()
                .map(|e| match s(e).split_once('=') {
                    Some((k, v)) => (k.to_string(), Some(v.to_string())),
                    None => (s(e).to_string(), None),
                })
                .collect(),
            other => panic!("compose environment {other:?}"),
        }
    }

    fn argv(&self, service: &Value) -> Vec<String> {
        assert!(
            service["entrypoint"].is_null(),
            "compose: keep the image's entrypoint (sandgate)"
        );
        seq(&service["command"])
            .iter()
            .map(|a| s(a).to_string())
            .collect()
    }

    /// Container path -> source of a service's volumes (`source:target[:mode]`).
    fn volumes(&self, service: &Value) -> BTreeMap<String, (String, bool)> {
        seq(&service["volumes"])
            .iter()
            .map(|v| {
                let parts: Vec<&str> = s(v).split(':').collect();
                let read_only = parts.get(2) == Some(&"ro");
                (parts[1].to_string(), (parts[0].to_string(), read_only))
            })
            .collect()
    }
}

#[test]
fn compose_stack_matches_the_binary() {
    let compose = Compose::load();
    let text = compose.config_text();
    let config = listener_config("compose sandgate_toml", &text);
    check_listeners_reachable("compose sandgate_toml", &config);

    // Postgres: the official image, a healthcheck, a named volume; the URL points at it.
    let pg = compose.service("postgres");
    assert!(s(&pg["image"]).starts_with("postgres:"));
    let check: Vec<&str> = seq(&pg["healthcheck"]["test"]).iter().map(s).collect();
    assert!(check.iter().any(|c| c.contains("pg_isready")), "{check:?}");
    let pg_volumes = compose.volumes(pg);
    let (volume, _) = &pg_volumes["/var/lib/postgresql/data"];
    assert!(
        compose.doc["volumes"]
            .as_mapping()
            .unwrap()
            .contains_key(volume.as_str()),
        "postgres volume {volume} is not declared"
    );
    let pg_env = compose.env(pg);
    let table: toml::Table = toml::from_str(&text).unwrap();
    let url = PgUrl::parse(table["store"]["url"].as_str().unwrap()).unwrap();
    assert_eq!(url.host, "postgres", "{url:?}");
    assert_eq!(url.port, 5432);
    assert_eq!(Some(url.user.clone()), pg_env["POSTGRES_USER"], "{url:?}");
    assert_eq!(Some(url.db.clone()), pg_env["POSTGRES_DB"], "{url:?}");
    assert_eq!(Some(url.password.clone()), pg_env["POSTGRES_PASSWORD"]);
    assert_eq!(url.password, compose.env["POSTGRES_PASSWORD"]);

    // The replicas.
    let sg = compose.service("sandgate");
    let replicas = sg["deploy"]["replicas"].as_u64().unwrap_or(1);
    assert!(replicas >= 2, "{replicas} sandgate replica(s)");
    assert_eq!(
        sg["depends_on"]["postgres"]["condition"], "service_healthy",
        "the replicas wait for Postgres"
    );
    let expose: BTreeSet<u16> = seq(&sg["expose"])
        .iter()
        .map(|p| s(p).parse().unwrap())
        .collect();
    let listeners: BTreeSet<u16> =
        role_ports(&config, &role_of(&compose.argv(sg), &compose.env(sg)))
            .into_values()
            .collect();
    assert_eq!(expose, listeners, "compose sandgate: expose");
    assert!(
        sg["ports"].is_null(),
        "the replicas are reached through the load balancer"
    );

    for (name, service) in compose.sandgate_services() {
        let origin = format!("compose service {name}");
        assert!(
            !service["build"].is_null(),
            "{origin}: builds deploy/Dockerfile"
        );
        assert_eq!(service["build"]["dockerfile"], "deploy/Dockerfile");
        let env = compose.env(service);
        check_launch(&Launch {
            origin: origin.clone(),
            argv: compose.argv(service),
            env: env.clone(),
            config: config.clone(),
        });
        // The config file is where SANDGATE_CONFIG says.
        let targets: Vec<&str> = seq(&service["configs"])
            .iter()
            .map(|c| s(&c["target"]))
            .collect();
        assert_eq!(
            targets,
            [env["SANDGATE_CONFIG"].as_deref().unwrap()],
            "{origin}"
        );
        // Compose copies configs.content into the container before it starts, which a
        // read-only root refuses (docker/compose#12031).
        assert_ne!(
            service["read_only"], true,
            "{origin}: read_only with configs.content does not start"
        );
        let volumes = compose.volumes(service);
        let (ca_volume, _) = volumes
            .get(config.tls.ca_dir.to_str().unwrap())
            .unwrap_or_else(|| panic!("{origin}: no volume at [tls] ca_dir"));
        assert_eq!(ca_volume, "ca", "{origin}: the shared CA volume");
    }
    // The CA is generated once, before any replica starts, and the replicas read it.
    let ca_init = compose.service("ca-init");
    assert_eq!(compose.argv(ca_init), ["ca", "init"]);
    assert_eq!(
        sg["depends_on"]["ca-init"]["condition"],
        "service_completed_successfully"
    );
    assert!(!compose.volumes(ca_init)[config.tls.ca_dir.to_str().unwrap()].1);
    assert!(compose.volumes(sg)[config.tls.ca_dir.to_str().unwrap()].1);
    // The policies every replica serves are the repo's.
    let (policies, read_only) = &compose.volumes(sg)[config.policy.dir.to_str().unwrap()];
    assert!(read_only);
    assert_eq!(
        deploy().join(policies).canonicalize().unwrap(),
        repo().join("policies").canonicalize().unwrap()
    );
    // The healthcheck asks the API listener for /readyz (run in
    // `every_role_in_the_manifests_answers_its_probes`).
    let (port, path) = compose_healthcheck(sg).1;
    assert_eq!(port, config.api.listen.port());
    assert_eq!(path, "/readyz");
}

/// The sandgate healthcheck script and the (port, path) it asks.
fn compose_healthcheck(service: &Value) -> (String, (u16, String)) {
    let test: Vec<&str> = seq(&service["healthcheck"]["test"]).iter().map(s).collect();
    assert_eq!(&test[..3], ["CMD", "bash", "-c"], "{test:?}");
    let script = test[3].to_string();
    let port = script
        .split("/dev/tcp/127.0.0.1/")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("healthcheck: no /dev/tcp port in {script}"));
    let path = script
        .split("GET ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("healthcheck: no GET in {script}"))
        .to_string();
    (script, (port, path))
}

#[derive(Default, Debug)]
struct Haproxy {
    /// frontend -> (bind ports, default_backend)
    frontends: BTreeMap<String, (Vec<u16>, String)>,
    backends: BTreeMap<String, Backend>,
    default_check_port: Option<u16>,
}

#[derive(Default, Debug)]
struct Backend {
    /// (host, port, slots)
    servers: Vec<(String, u16, u64)>,
    httpchk: bool,
    check_uri: Option<String>,
    expect_status: Option<String>,
}

fn parse_haproxy(text: &str) -> Haproxy {
    let mut h = Haproxy::default();
    let mut section = (String::new(), String::new());
    let port_after_colon = |w: &str| -> u16 { w.rsplit(':').next().unwrap().parse().unwrap() };
    for raw in text.lines() {
        let line = raw.split('#').next().unwrap();
        if line.trim().is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if !raw.starts_with([' ', '\t']) {
            section = (
                words[0].to_string(),
                words.get(1).unwrap_or(&"").to_string(),
            );
            continue;
        }
        let (kind, name) = (&section.0[..], section.1.clone());
        let option_port = || {
            words
                .iter()
                .position(|w| *w == "port")
                .map(|i| words[i + 1].parse::<u16>().unwrap())
        };
        match (kind, words[0]) {
            ("defaults", "default-server") => h.default_check_port = option_port(),
            ("frontend", "bind") => h
                .frontends
                .entry(name)
                .or_default()
                .0
                .push(port_after_colon(words[1])),
            ("frontend", "default_backend") => {
                h.frontends.entry(name).or_default().1 = words[1].to_string()
            }
            ("backend", "server-template") => {
                let (host, port) = words[3].rsplit_once(':').unwrap();
                h.backends.entry(name).or_default().servers.push((
                    host.to_string(),
                    port.parse().unwrap(),
                    words[2].parse().unwrap(),
                ))
            }
            ("backend", "server") => {
                let (host, port) = words[2].rsplit_once(':').unwrap();
                h.backends.entry(name).or_default().servers.push((
                    host.to_string(),
                    port.parse().unwrap(),
                    1,
                ))
            }
            ("backend", "option") if words[1] == "httpchk" => {
                h.backends.entry(name).or_default().httpchk = true
            }
            ("backend", "http-check") if words[1] == "send" => {
                let i = words.iter().position(|w| *w == "uri").unwrap();
                h.backends.entry(name).or_default().check_uri = Some(words[i + 1].to_string())
            }
            ("backend", "http-check") if words[1] == "expect" => {
                h.backends.entry(name).or_default().expect_status = Some(words[2..].join(" "))
            }
            _ => {}
        }
    }
    h
}

#[test]
fn the_load_balancer_fronts_every_listener_and_checks_readiness() {
    let compose = Compose::load();
    let config = listener_config("compose sandgate_toml", &compose.config_text());
    let sg = compose.service("sandgate");
    let role = role_of(&compose.argv(sg), &compose.env(sg));
    let listeners: BTreeSet<u16> = role_ports(&config, &role).into_values().collect();
    let replicas = sg["deploy"]["replicas"].as_u64().unwrap();

    let lb = compose.service("lb");
    assert!(s(&lb["image"]).starts_with("haproxy:"));
    let volumes = compose.volumes(lb);
    let (cfg, _) = &volumes["/usr/local/etc/haproxy/haproxy.cfg"];
    let h = parse_haproxy(&read(&deploy().join(cfg)));
    // Published ports: host port = container port = a frontend's bind.
    let mut published = BTreeSet::new();
    for p in seq(&lb["ports"]) {
        let parts: Vec<&str> = s(p).split(':').collect();
        let (host, container) = (parts[parts.len() - 2], parts[parts.len() - 1]);
        assert_eq!(host, container, "lb port {p:?}");
        published.insert(container.parse::<u16>().unwrap());
    }
    let binds: BTreeSet<u16> = h.frontends.values().flat_map(|(b, _)| b.clone()).collect();
    assert_eq!(published, binds, "lb: published ports and frontends");
    assert_eq!(binds, listeners, "lb: one frontend per sandgate listener");
    let api_port = config.api.listen.port();
    for (frontend, (bind, backend)) in &h.frontends {
        let b = h
            .backends
            .get(backend)
            .unwrap_or_else(|| panic!("frontend {frontend}: no backend {backend}"));
        assert!(!b.servers.is_empty(), "backend {backend}");
        for (host, port, slots) in &b.servers {
            assert_eq!(host, "sandgate", "backend {backend}: the compose service");
            assert_eq!(&[*port][..], &bind[..], "frontend {frontend} -> {backend}");
            assert!(*slots >= replicas, "backend {backend}: {slots} slots");
        }
        assert!(b.httpchk, "backend {backend}: option httpchk");
        assert_eq!(b.check_uri.as_deref(), Some("/readyz"), "backend {backend}");
        assert_eq!(b.expect_status.as_deref(), Some("status 200"));
    }
    assert_eq!(
        h.default_check_port,
        Some(api_port),
        "health checks go to the API listener"
    );
    // Hosted sandboxes reach public_url: the load balancer publishes its port.
    if let Some(url) = config.proxy.public_url() {
        assert!(published.contains(&url.port));
        assert_eq!(Some(url.port), config.proxy.tls_listen.map(|a| a.port()));
    }
}

#[test]
fn the_image_is_multi_stage_non_root_and_exposes_the_listeners() {
    let text = read(&deploy().join("Dockerfile"));
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let stages: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.starts_with("FROM "))
        .map(|(i, _)| i)
        .collect();
    assert!(stages.len() >= 2, "multi-stage");
    assert!(lines[stages[0]].contains("rust:"), "builds in a rust image");
    let runtime = &lines[*stages.last().unwrap()..];
    let user = runtime
        .iter()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("the runtime stage sets USER");
    let uid = user.split(':').next().unwrap();
    assert!(
        uid.parse::<u32>().is_ok_and(|u| u > 0),
        "USER {user}: numeric and not root, so runAsNonRoot can check it"
    );
    assert!(runtime
        .iter()
        .any(|l| l.starts_with("COPY --from=") && l.contains("/usr/local/bin/sandgate")));
    let entrypoint = runtime
        .iter()
        .find_map(|l| l.strip_prefix("ENTRYPOINT "))
        .unwrap();
    assert_eq!(entrypoint, r#"["/usr/local/bin/sandgate"]"#);
    let exposed: BTreeSet<u16> = runtime
        .iter()
        .filter_map(|l| l.strip_prefix("EXPOSE "))
        .flat_map(|l| l.split_whitespace().map(|p| p.parse::<u16>().unwrap()))
        .collect();
    let compose = Compose::load();
    let config = listener_config("compose", &compose.config_text());
    let wanted: BTreeSet<u16> = role_ports(&config, "all").into_values().collect();
    assert!(exposed.is_superset(&wanted), "EXPOSE {exposed:?}");
    for l in &lines {
        let upper = l.to_ascii_uppercase();
        assert!(
            !((upper.starts_with("ENV ") || upper.starts_with("ARG "))
                && ["KEY", "TOKEN", "PASSWORD", "SECRET"]
                    .iter()
                    .any(|w| upper.contains(w))),
            "no secret in the image: {l}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The probes, answered by running gateways.

/// `GET path` on `addr`: the status code.
fn http_status(addr: &str, path: &str) -> std::io::Result<u16> {
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut head = String::new();
    BufReader::new(stream).read_line(&mut head)?;
    head.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {head:?}")))
}

/// Asks `path` until it answers 200 (a probe retries too), at most 10 s.
fn wait_for_200(addr: &str, path: &str) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = http_status(addr, path).unwrap_or(0);
        if status == 200 || Instant::now() > deadline {
            return status;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test]
async fn the_probe_paths_are_answered_by_an_in_process_gateway() {
    let gw = common::Gateway::start(common::GatewayOptions::default()).await;
    let client = reqwest::Client::new();
    for path in ["/livez", "/readyz", "/healthz"] {
        let response = client.get(gw.api(path)).send().await.unwrap();
        let status = response.status();
        let body = response.text().await.unwrap();
        assert_eq!(status, 200, "{path}: {body}");
    }
    gw.server.shutdown();
}

/// A `sandgate serve` child process.
struct Serving {
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
    api: String,
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn drain(stream: impl Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    lines
}

/// Runs `sandgate serve <argv-flags>` on a deployed config, moved onto this machine: the
/// listeners on loopback port 0, state and CA in `dir`, the repo's policies, the SQLite
/// store (the Postgres URL is left out), and a value for every variable the config names.
fn serve_deployed(dir: &Path, text: &str, argv: &[String]) -> Serving {
    let mut table: toml::Table = toml::from_str(text).unwrap();
    table.remove("store");
    let mut set = |section: &str, key: &str, value: toml::Value| {
        table
            .entry(section)
            .or_insert_with(|| toml::Value::Table(Default::default()))
            .as_table_mut()
            .unwrap()
            .insert(key.to_string(), value);
    };
    let path = |p: &str| toml::Value::String(dir.join(p).display().to_string());
    let loopback = toml::Value::String("127.0.0.1:0".into());
    set("proxy", "listen", loopback.clone());
    if text.contains("tls_listen") {
        set("proxy", "tls_listen", loopback.clone());
    }
    set("api", "listen", loopback);
    set("tls", "ca_dir", path("certs"));
    set(
        "policy",
        "dir",
        toml::Value::String(repo().join("policies").display().to_string()),
    );
    set("log", "decisions", toml::Value::String("off".into()));
    set("secrets", "master_key_file", path("data/master.key"));
    set("local", "dir", path("local/sandboxes"));
    set("local", "snapshot_dir", path("local/snapshots"));
    set("store", "path", path("data/sandgate.db"));
    let text = toml::to_string(&table).unwrap();
    let config = Config::from_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let config_path = dir.join("sandgate.toml");
    std::fs::write(&config_path, &text).unwrap();

    let (path, flags) = split_argv(argv);
    assert_eq!(path, ["serve"]);
    let mut cmd = Command::new(BIN);
    cmd.arg("serve");
    for (flag, value) in flags {
        cmd.arg(flag);
        cmd.args(value);
    }
    cmd.arg("--config")
        .arg(&config_path)
        .current_dir(dir)
        .env_remove("SANDGATE_ROLE")
        .env(
            sandgate::credentials::seal::MASTER_KEY_ENV,
            "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in config_env_vars(&config) {
        cmd.env(var, "deploy-test-token-0123456789abcdef");
    }
    let mut child = cmd.spawn().unwrap();
    drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let api = stderr.lock().unwrap().iter().find_map(|l| {
            let rest = l
                .strip_prefix("sandgate: ")?
                .split("API on http://")
                .nth(1)?;
            Some(rest.split(',').next()?.to_string())
        });
        if let Some(api) = api {
            return Serving { child, stderr, api };
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "sandgate {argv:?} exited with {status}: {:#?}",
                stderr.lock().unwrap()
            );
        }
        assert!(
            Instant::now() < deadline,
            "sandgate {argv:?} did not start: {:#?}",
            stderr.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Each probe of each Deployment and the Compose healthcheck, asked of a `sandgate serve`
/// started with that container's flags on that manifest's config.
#[test]
fn every_role_in_the_manifests_answers_its_probes() {
    // (origin, config text, argv, probe paths)
    let mut cases: Vec<(String, String, Vec<String>, BTreeSet<String>)> = Vec::new();
    for variant in K8S_VARIANTS {
        let kustomized = Kustomized::load(&deploy().join(variant));
        for pod in k8s_pods(&kustomized) {
            let main = pod.main();
            let paths = ["readinessProbe", "livenessProbe", "startupProbe"]
                .iter()
                .filter_map(|p| main[*p]["httpGet"]["path"].as_str())
                .map(str::to_string)
                .collect();
            let mut argv = pod.argv();
            if let Some(Some(role)) = pod.env(main).get("SANDGATE_ROLE") {
                argv.extend(["--role".to_string(), role.clone()]);
            }
            cases.push((
                pod.origin.clone(),
                base_config_text(&kustomized, &pod),
                argv,
                paths,
            ));
        }
    }
    let compose = Compose::load();
    let sg = compose.service("sandgate");
    cases.push((
        "compose sandgate".into(),
        compose.config_text(),
        compose.argv(sg),
        ["/readyz".to_string()].into(),
    ));
    let (script, _) = compose_healthcheck(sg);
    let config = listener_config("compose", &compose.config_text());
    let healthcheck_port = config.api.listen.port();

    for (origin, text, argv, paths) in cases {
        let dir = tempfile::tempdir().unwrap();
        let serving = serve_deployed(dir.path(), &text, &argv);
        for path in &paths {
            let status = wait_for_200(&serving.api, path);
            assert_eq!(
                status,
                200,
                "{origin}: {path} on the API listener: {:#?}",
                serving.stderr.lock().unwrap()
            );
        }
        // `/livez` and `/readyz` are answered by every role.
        for path in ["/livez", "/readyz"] {
            assert_eq!(wait_for_200(&serving.api, path), 200, "{origin}: {path}");
        }
        let role = role_of(&argv, &BTreeMap::new());
        // A proxy replica's API listener serves the probes and nothing else.
        let status = http_status(&serving.api, "/v1/pools").unwrap();
        if serves_api(&role) {
            assert_ne!(status, 404, "{origin}: role {role} serves the API");
        } else {
            assert_eq!(status, 404, "{origin}: role {role} serves only the probes");
        }
        if origin.starts_with("compose") {
            let port: SocketAddr = serving.api.parse().unwrap();
            let script = script.replace(
                &format!("/dev/tcp/127.0.0.1/{healthcheck_port}"),
                &format!("/dev/tcp/127.0.0.1/{}", port.port()),
            );
            let out = Command::new("bash")
                .arg("-c")
                .arg(&script)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{origin}: the compose healthcheck fails on a ready replica: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

// Kubernetes as `kubectl kustomize` renders it: what the cluster would be given.

/// Every object `kubectl kustomize` renders for a variant, or `None` (with a skip line) where
/// kubectl is missing outside CI; under CI a missing kubectl fails the test.
fn kubectl_rendered(variant: &str) -> Option<Vec<Value>> {
    let Some(kubectl) = common::which("kubectl") else {
        assert!(
            !common::in_ci(),
            "kubectl is missing and CI must not skip rendering deploy/{variant}"
        );
        eprintln!("SKIPPED rendering deploy/{variant}: kubectl is not installed");
        return None;
    };
    let out = Command::new(kubectl)
        .args(["kustomize", "--load-restrictor=LoadRestrictionsNone"])
        .arg(deploy().join(variant))
        .output()
        .expect("run kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize deploy/{variant}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8 manifests");
    Some(
        serde_norway::Deserializer::from_str(&text)
            .map(|doc| Value::deserialize(doc).expect("rendered YAML"))
            .filter(|v| !v.is_null())
            .collect(),
    )
}

fn kind_and_name(o: &Value) -> (String, String) {
    (
        s(&o["kind"]).to_string(),
        s(&o["metadata"]["name"]).to_string(),
    )
}

/// Every container image, init containers included, names the release by its version tag or
/// by digest: never a floating tag.
fn check_images_pinned(variant: &str, rendered: &[Value]) {
    let version = env!("CARGO_PKG_VERSION");
    for d in rendered.iter().filter(|o| o["kind"] == "Deployment") {
        let spec = &d["spec"]["template"]["spec"];
        for c in seq(&spec["containers"])
            .iter()
            .chain(seq(&spec["initContainers"]))
        {
            let image = s(&c["image"]);
            let by_digest = image
                .split_once("@sha256:")
                .is_some_and(|(_, h)| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()));
            let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
            assert!(
                by_digest || tag == version,
                "deploy/{variant} {}: image {image} is pinned neither by digest nor to version {version}",
                s(&c["name"])
            );
        }
    }
}

/// The ipBlocks of `rules` (ingress `from` or egress `to`) as allowed networks minus their
/// exceptions; whether `ip` is inside one.
fn ip_blocks_allow(peers: &[Value], ip: std::net::IpAddr) -> bool {
    peers.iter().any(|peer| {
        let block = &peer["ipBlock"];
        if block.is_null() {
            return false;
        }
        let net: ipnet::IpNet = s(&block["cidr"]).parse().expect("ipBlock cidr");
        let excepted = seq(&block["except"]).iter().any(|e| {
            s(e).parse::<ipnet::IpNet>()
                .expect("ipBlock except")
                .contains(&ip)
        });
        net.contains(&ip) && !excepted
    })
}

fn rule_ports(rule: &Value) -> Vec<(String, String)> {
    seq(&rule["ports"])
        .iter()
        .map(|p| {
            let port = match &p["port"] {
                Value::Number(n) => n.to_string(),
                other => s(other).to_string(),
            };
            (port, p["protocol"].as_str().unwrap_or("TCP").to_string())
        })
        .collect()
}

/// A rule with no `ports` covers every port.
fn rule_covers(rule: &Value, names: &[&str], protocol: &str) -> bool {
    let ports = rule_ports(rule);
    ports.is_empty()
        || ports
            .iter()
            .any(|(p, proto)| proto == protocol && names.contains(&p.as_str()))
}

fn check_network_policy(rendered: &[Value], kustomized: &Kustomized) {
    let policies: Vec<&Value> = rendered
        .iter()
        .filter(|o| o["kind"] == "NetworkPolicy")
        .collect();
    for pod in k8s_pods(kustomized) {
        let origin = &pod.origin;
        let selecting: Vec<&&Value> = policies
            .iter()
            .filter(|p| {
                let sel = string_map(&p["spec"]["podSelector"]["matchLabels"]);
                selects(&sel, &pod.labels)
            })
            .collect();
        assert_eq!(selecting.len(), 1, "{origin}: one NetworkPolicy selects it");
        let spec = &selecting[0]["spec"];
        let types: Vec<&str> = seq(&spec["policyTypes"]).iter().map(s).collect();
        assert!(
            types.contains(&"Ingress") && types.contains(&"Egress"),
            "{origin}: {types:?}"
        );
        let ingress = seq(&spec["ingress"]);
        // Every listener is reachable from somewhere, by name or number.
        for (name, port) in pod.ports() {
            let names = [name.as_str(), &port.to_string()];
            assert!(
                ingress.iter().any(|r| rule_covers(r, &names, "TCP")),
                "{origin}: no ingress rule admits port {name} ({port})"
            );
        }
        // The plain proxy (credentials in clear) only from selected namespaces, never from
        // address ranges: the sandbox networks.
        for rule in ingress
            .iter()
            .filter(|r| rule_covers(r, &["proxy", "3128"], "TCP"))
        {
            let from = seq(&rule["from"]);
            assert!(
                !from.is_empty(),
                "{origin}: the plain proxy is open to every peer"
            );
            for peer in from {
                assert!(
                    peer["ipBlock"].is_null(),
                    "{origin}: the plain proxy admits {peer:?}"
                );
                assert!(
                    !peer["namespaceSelector"].is_null(),
                    "{origin}: the plain proxy admits pods outside the sandbox namespaces: {peer:?}"
                );
            }
        }
        // Egress: DNS, the store's port, public addresses, and never metadata or private
        // ranges.
        let egress = seq(&spec["egress"]);
        assert!(
            egress.iter().any(|r| rule_covers(r, &["53"], "UDP")),
            "{origin}: no DNS"
        );
        let store_port = example_secrets()["sandgate"]["SANDGATE_STORE_URL"]
            .rsplit_once(':')
            .and_then(|(_, rest)| rest.split('/').next().map(str::to_string))
            .expect("a port in the example store URL");
        assert!(
            egress
                .iter()
                .any(|r| rule_covers(r, &[store_port.as_str()], "TCP")),
            "{origin}: the store's port {store_port} is not reachable"
        );
        let all_peers: Vec<Value> = egress
            .iter()
            .flat_map(|r| seq(&r["to"]).iter().cloned())
            .collect();
        for public in ["93.184.215.14", "2606:4700::6810:85e5"] {
            assert!(
                ip_blocks_allow(&all_peers, public.parse().unwrap()),
                "{origin}: {public} (public) is not reachable"
            );
        }
        for private in [
            "169.254.169.254",
            "10.0.0.1",
            "172.16.0.1",
            "192.168.1.1",
            "127.0.0.1",
            "100.64.0.1",
            "fd00::1",
            "fe80::1",
        ] {
            assert!(
                !ip_blocks_allow(&all_peers, private.parse().unwrap()),
                "{origin}: {private} is reachable from the gateway"
            );
        }
    }
}

fn check_autoscalers(variant: &str, rendered: &[Value], kustomized: &Kustomized) {
    for pod in k8s_pods(kustomized) {
        if !serves_proxy(&pod.role()) {
            continue;
        }
        let name = s(&pod.deployment["metadata"]["name"]);
        let hpa = rendered
            .iter()
            .find(|o| {
                o["kind"] == "HorizontalPodAutoscaler"
                    && o["spec"]["scaleTargetRef"]["name"] == name
            })
            .unwrap_or_else(|| {
                panic!("deploy/{variant}: no autoscaler for the proxy Deployment {name}")
            });
        let spec = &hpa["spec"];
        assert_eq!(spec["scaleTargetRef"]["kind"], "Deployment");
        let min = spec["minReplicas"].as_u64().unwrap_or(1);
        let max = spec["maxReplicas"].as_u64().unwrap_or(0);
        assert!(min >= 2 && max > min, "{name}: replicas {min}..{max}");
        let cpu = seq(&spec["metrics"])
            .iter()
            .any(|m| m["type"] == "Resource" && m["resource"]["name"] == "cpu");
        assert!(cpu, "{name}: scales on CPU");
        // Utilization is a share of the request: without one the autoscaler cannot act.
        assert!(
            !pod.main()["resources"]["requests"]["cpu"].is_null(),
            "{name}: no CPU request to scale against"
        );
    }
}

#[test]
fn k8s_rendered_by_kubectl_is_pinned_fenced_and_autoscaled() {
    for variant in K8S_VARIANTS {
        let Some(rendered) = kubectl_rendered(variant) else {
            continue;
        };
        let kustomized = Kustomized::load(&deploy().join(variant));
        // What kubectl renders is what the other tests here read.
        let ours: BTreeSet<(String, String)> = kustomized
            .objects
            .iter()
            .map(|(_, o)| kind_and_name(o))
            .collect();
        let theirs: BTreeSet<(String, String)> = rendered
            .iter()
            .filter(|o| o["kind"] != "ConfigMap")
            .map(kind_and_name)
            .collect();
        assert_eq!(ours, theirs, "deploy/{variant}");
        check_images_pinned(variant, &rendered);
        check_network_policy(&rendered, &kustomized);
        check_autoscalers(variant, &rendered, &kustomized);
    }
}
