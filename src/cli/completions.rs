//! What `sandgate completions` adds to clap_complete's static script: sandbox ids completed
//! from the API (`sandgate sandbox list -q`, the gateway found as every client command finds
//! it) for the commands that take one, in the shells whose completion can run a command on
//! the fly (bash, fish). Any failure (no gateway, no token) completes nothing.

/// The commands of `sandgate sandbox` whose first argument is a sandbox id.
const ID_COMMANDS: &str = "get delete exec stop start pause resume snapshot";

/// Bash: wraps clap's `_sandgate`; a sandbox id is offered as `sandbox <command> ` 's
/// first word, else clap's completion runs.
const BASH: &str = r#"
_sandgate_with_ids() {
    local cur="${COMP_WORDS[COMP_CWORD]}"
    if [[ ${COMP_CWORD} -eq 3 && "${COMP_WORDS[1]}" == sandbox && "$cur" != -* \
          && " @IDS@ " == *" ${COMP_WORDS[2]} "* ]]; then
        COMPREPLY=( $(compgen -W "$(sandgate sandbox list -q 2>/dev/null)" -- "$cur") )
        return 0
    fi
    _sandgate "$@"
}
if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _sandgate_with_ids -o nosort -o bashdefault -o default sandgate
else
    complete -F _sandgate_with_ids -o bashdefault -o default sandgate
fi
"#;

/// Fish: one more completion source under `sandgate sandbox <command>`.
const FISH: &str = r#"
complete -c sandgate -n "__fish_seen_subcommand_from sandbox; and __fish_seen_subcommand_from @IDS@" -f -a "(sandgate sandbox list -q 2>/dev/null)"
"#;

/// The script to append for `shell` (empty when it has none).
pub fn dynamic_ids(shell: clap_complete::Shell) -> String {
    let script = match shell {
        clap_complete::Shell::Bash => BASH,
        clap_complete::Shell::Fish => FISH,
        _ => return String::new(),
    };
    script.replace("@IDS@", ID_COMMANDS)
}
