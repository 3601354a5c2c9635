use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// The words `sh` reads from `line` (each printed NUL-terminated).
fn words(line: &str) -> Vec<String> {
    let out = std::process::Command::new("sh")
        .args(["-c", &format!("printf '%s\\0' {line}")])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut words: Vec<String> = text.split('\0').map(str::to_string).collect();
    words.pop();
    words
}

#[test]
fn shell_quoting() {
    assert_eq!(shell_quote("plain-word_1.txt"), "plain-word_1.txt");
    assert_eq!(shell_quote(""), "''");
    assert_eq!(shell_quote("a b"), "'a b'");
    assert_eq!(shell_quote("it's"), r"'it'\''s'");
    assert_eq!(shell_quote("$HOME;rm -rf /"), "'$HOME;rm -rf /'");
    assert_eq!(shell_quote("a\nb"), "'a\nb'");
    assert_eq!(shell_quote("*"), "'*'");
    let args = ["echo", "it's", "$X", "a  b", "", "\\", "\"q\"", "`id`"].map(String::from);
    assert_eq!(words(&quote_argv(&args)), args);
}

#[test]
fn command_lines() {
    let spec = ExecSpec {
        argv: vec!["ls".into(), "-l".into(), "my dir".into()],
        env: BTreeMap::from([("A_B".to_string(), "x y".to_string())]),
        cwd: Some("/home/user/w s".into()),
        timeout: None,
        user: None,
    };
    assert_eq!(
        command_line(&spec).unwrap(),
        "cd '/home/user/w s' && A_B='x y' exec ls -l 'my dir'"
    );
    let bad = ExecSpec {
        argv: vec!["true".into()],
        env: BTreeMap::from([("A-B".to_string(), "x".to_string())]),
        ..ExecSpec::default()
    };
    assert_eq!(command_line(&bad).unwrap_err().kind, OpErrorKind::Invalid);
    assert_eq!(
        command_line(&ExecSpec::default()).unwrap_err().kind,
        OpErrorKind::Invalid
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Whatever a caller sends as arguments (printable text without NUL, which no argv can
    /// hold), `sh` reads back exactly those words.
    #[test]
    fn sh_reads_back_the_same_words(args in proptest::collection::vec("[^\u{0}]{0,12}", 1..5)) {
        prop_assert_eq!(words(&quote_argv(&args)), args);
    }
}
