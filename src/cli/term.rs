//! Terminal output shared by the client subcommands (`pools`, `sandbox get --why`,
//! `sandbox create --wait`): text from the server made safe to print, and aligned columns.

/// Text from the server, safe to print on a terminal: control characters (escape
/// sequences in a provider's message or a label, say) are shown escaped, never interpreted.
pub(super) fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Columns padded to their widest cell (in characters), two spaces apart; the last cell of
/// a row is not padded and trailing spaces are trimmed. One line per row.
pub(super) fn aligned(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            line.push_str(cell);
            if c + 1 < r.len() {
                let pad = widths[c].saturating_sub(cell.chars().count()) + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn control_characters_are_escaped_and_columns_aligned() {
        assert_eq!(super::clean("a\u{1b}[2Jb\n"), "a\\u{1b}[2Jb\\n");
        let rows = vec![
            vec!["x".to_string(), "yy".into(), "z".into()],
            vec!["longer".to_string(), "y".into()],
        ];
        assert_eq!(super::aligned(&rows), "x       yy  z\nlonger  y\n");
    }
}
