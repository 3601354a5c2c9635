//! `sandgate config check [--config FILE]`: every validation `sandgate serve` makes at start
//! that needs neither the store nor a port: the file's keys and values, the environment
//! variables it names (`token_env`, accounts' `api_key_env`), the pools' topology, the
//! hosted accounts' settings, the upstream CA files and the policy directory. Nothing is
//! written, opened for writing or bound: no store, no listener, no generated key or CA.
//! Exit 0 valid, 2 invalid (`error: invalid_config: ...` on stderr).

use std::path::Path;

use crate::config::Config;

/// Why a configuration would not start.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Start(#[from] crate::server::StartError),
    #[error("config key `policy.dir`: {0}")]
    Policy(String),
}

/// Checks the configuration at `path` (`None`: the embedded defaults); on success, lines
/// saying what was checked and what `serve` would still create.
pub fn check(path: Option<&Path>) -> Result<Vec<String>, CheckError> {
    let config = Config::load(path)?;
    let mut notes = vec![format!(
        "{}: keys and values valid",
        path.map(|p| p.display().to_string())
            .unwrap_or_else(|| "embedded defaults".into())
    )];
    environment(&config, &mut notes)?;
    let topology = crate::server::declared_topology(&config)?;
    notes.push(format!("pools: {} compiled", topology.pools().len()));
    let upstream = crate::tls::upstream_client_config(&config.tls.upstream_ca_files)
        .map_err(crate::server::StartError::from)?;
    crate::providers::ProviderRegistry::from_config(
        &config.simulated,
        &config.accounts,
        &topology,
        &upstream,
    )
    .map_err(crate::server::StartError::from)?;
    notes.push(format!("accounts: {} configured", config.accounts.len()));
    notes.push(policy(&config)?);
    if !config.secrets.master_key_file.exists() {
        notes.push(format!(
            "secrets.master_key_file: {} does not exist yet; `serve` generates it",
            config.secrets.master_key_file.display()
        ));
    }
    Ok(notes)
}

/// Every environment variable and file the configuration takes a secret from is there: API
/// tokens, declared credentials' secrets, the E2B facade's keys (when it is served). Values
/// are read and dropped, never shown.
fn environment(config: &Config, notes: &mut Vec<String>) -> Result<(), CheckError> {
    use crate::server::StartError;
    if !config.api.tokens.is_empty() {
        crate::callers::ApiAuth::from_config(&config.api.tokens).map_err(StartError::from)?;
        notes.push(format!("api.tokens: {} present", config.api.tokens.len()));
    }
    for credential in &config.credentials {
        credential.read_secret().map_err(StartError::from)?;
    }
    if !config.credentials.is_empty() {
        notes.push(format!(
            "credentials: {} secrets present",
            config.credentials.len()
        ));
    }
    if config.e2b.listen.is_none() {
        return Ok(());
    }
    for (index, key) in config.e2b.api_keys.iter().enumerate() {
        if let (None, Some(var)) = (&key.key, &key.key_env) {
            if std::env::var_os(var).is_none() {
                let var = var.clone();
                let e = crate::facade::FacadeConfigError::KeyEnv { index, var };
                return Err(StartError::from(e).into());
            }
        }
    }
    Ok(())
}

/// The policy directory compiles, or does not exist yet (`serve` writes the bundled
/// policies into it).
fn policy(config: &Config) -> Result<String, CheckError> {
    let dir = &config.policy.dir;
    if !dir.exists() {
        return Ok(format!(
            "policy.dir: {} does not exist yet; `serve` writes the bundled policies there",
            dir.display()
        ));
    }
    let engine = crate::policy::PolicyEngine::load_with(dir, config.policy.evaluator)
        .map_err(|e| CheckError::Policy(e.to_string()))?;
    Ok(format!(
        "policy.dir: {} compiles ({} files)",
        dir.display(),
        engine.status().files.len()
    ))
}
