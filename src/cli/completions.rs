//! What `sandgate completions` adds to clap_complete's static script: sandbox ids completed
//! from the API (`sandgate sandbox list -q`, the gateway found as every client command finds
//! it) for the commands that take one, in the shells whose completion can run a command on
//! the fly (bash, zsh, fish). Any failure (no gateway, no token) completes nothing.
//! PowerShell and elvish get clap's static script: their completers are one script block
//! per command, which this would have to rewrite, and no test here can load them.

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

/// Zsh: clap's `_sandgate` is renamed `_sandgate_clap` and a `_sandgate` that offers ids
/// first takes its name, so both ways of loading the file (sourced, or autoloaded from
/// `fpath` as `_sandgate`) complete ids.
const ZSH: &str = r#"
_sandgate() {
    if (( CURRENT == 4 )) && [[ ${words[2]} == sandbox && ${words[4]} != -* \
          && " @IDS@ " == *" ${words[3]} "* ]]; then
        local -a ids
        ids=(${(f)"$(sandgate sandbox list -q 2>/dev/null)"})
        compadd -- $ids
        return 0
    fi
    _sandgate_clap "$@"
}
"#;

/// clap's zsh entry point, renamed so [`ZSH`]'s wrapper can take its name.
const ZSH_CLAP_ENTRY: &str = "\n_sandgate() {\n";

/// clap_complete's `script` for `shell` with sandbox ids completed where the shell can.
pub fn with_ids(shell: clap_complete::Shell, script: String) -> String {
    let ids = |s: &str| s.replace("@IDS@", ID_COMMANDS);
    match shell {
        clap_complete::Shell::Bash => script + &ids(BASH),
        clap_complete::Shell::Fish => script + &ids(FISH),
        // Without clap's entry point (a clap_complete change) the static script stands.
        clap_complete::Shell::Zsh if script.contains(ZSH_CLAP_ENTRY) => {
            let renamed = script.replacen(ZSH_CLAP_ENTRY, "\n_sandgate_clap() {\n", 1);
            // Defined before clap's dispatch at the end of the file, which calls it.
            match renamed.rfind("\nif [ \"$funcstack[1]\" = \"_sandgate\" ]") {
                Some(at) => format!("{}{}{}", &renamed[..at], ids(ZSH), &renamed[at..]),
                None => script,
            }
        }
        _ => script,
    }
}
