//! `sandgate provider check ACCOUNT`: one harmless authenticated call to a hosted account,
//! with the configuration `serve` would use, to tell whether its base URL and API key work.
//!
//! Exit codes: 0 the call succeeded; 1 the provider refused it or could not be reached (the
//! reason on stderr: the error class and the provider's message, never the key); 2 the
//! account is unknown or cannot be built from the configuration.

use clap::Subcommand;
use sandgate_router::ProviderKind;

use crate::config::Config;
use crate::providers::hosted;

#[derive(Subcommand, Debug)]
pub enum ProviderCommand {
    /// Make one harmless authenticated call (e.g. list one sandbox) with an account's
    /// base URL and API key, and report whether they work.
    ///
    /// Example:
    ///   sandgate provider check e2b-main --config sandgate.toml
    #[command(verbatim_doc_comment)]
    Check {
        /// The account's `name` in `[[accounts]]`.
        account: String,
    },
}

pub fn provider(cmd: ProviderCommand, config: &Config) -> Result<i32, super::CliError> {
    let ProviderCommand::Check { account } = cmd;
    let Some(raw) = config.accounts.iter().find(|a| a.name == account) else {
        let known: Vec<&str> = config.accounts.iter().map(|a| a.name.as_str()).collect();
        eprintln!("error: no account {account:?} in [[accounts]] (known: {known:?})");
        return Ok(2);
    };
    let kind = config
        .providers
        .iter()
        .find(|p| p.name == raw.provider)
        .and_then(|p| p.kind.or_else(|| ProviderKind::from_name(&p.name)));
    let Some(kind) = kind.filter(|k| hosted::has_adapter(*k)) else {
        eprintln!(
            "error: account {account}: provider {:?} has no hosted adapter in this build",
            raw.provider
        );
        return Ok(2);
    };
    let tls = match crate::tls::upstream_client_config(&config.tls.upstream_ca_files) {
        Ok(tls) => tls,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(2);
        }
    };
    let adapter = match hosted::build(kind, raw, &tls) {
        Ok(Some(adapter)) => adapter,
        Ok(None) => return Ok(2),
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| super::CliError::Usage(format!("starting the async runtime: {e}")))?;
    match runtime.block_on(adapter.check()) {
        Ok(what) => {
            println!("ok: account {account} ({}): {what}", kind.as_str());
            Ok(0)
        }
        Err(e) => {
            eprintln!(
                "error: account {account} ({}): {}: {}",
                kind.as_str(),
                e.class.as_str(),
                e.message
            );
            Ok(1)
        }
    }
}
