//! [`SqlError`]: a mistake located in the user's file.

use std::fmt;

use sluice_engine::redact_secrets;

/// An error tied to a place in a SQL file: `file:line:column: message`,
/// then the line with a caret under the offending text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlError {
    /// The file name as the user gave it.
    pub file: String,
    /// 1-based line.
    pub line: u64,
    /// 1-based column.
    pub column: u64,
    /// What is wrong and how to fix it.
    pub message: String,
    /// The offending line of the file.
    pub source_line: String,
    /// True when the SQL (or an option in it) must change; false when the
    /// statement was right but running it failed (a broker, a file).
    pub user_error: bool,
}

impl SqlError {
    /// An error at `line:column` of `text`. Secrets (values of sensitive
    /// options, [`sluice_engine::redact_secrets`]) are taken out of the
    /// message and the quoted line, the caret kept under its text.
    pub fn at(file: &str, text: &str, line: u64, column: u64, message: impl Into<String>) -> Self {
        let line = line.max(1);
        let whole = text.lines().nth((line - 1) as usize).unwrap_or_default();
        let split = whole
            .char_indices()
            .nth((column.max(1) - 1) as usize)
            .map_or(whole.len(), |(i, _)| i);
        let before = redact_secrets(&whole[..split]);
        let column = if before == whole[..split] {
            column.max(1)
        } else {
            before.chars().count() as u64 + 1
        };
        let source_line = before + &redact_secrets(&whole[split..]);
        Self {
            file: file.to_string(),
            line,
            column,
            message: redact_secrets(&message.into()),
            source_line,
            user_error: true,
        }
    }
}

impl fmt::Display for SqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.user_error { "error" } else { "failed" };
        writeln!(
            f,
            "{}:{}:{}: {kind}: {}",
            self.file, self.line, self.column, self.message
        )?;
        let gutter = self.line.to_string();
        writeln!(f, "{gutter} | {}", self.source_line)?;
        let pad: String = self
            .source_line
            .chars()
            .take((self.column - 1) as usize)
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .collect();
        write!(f, "{} | {pad}^", " ".repeat(gutter.len()))
    }
}

impl std::error::Error for SqlError {}

/// Finds `Line: L, Column: C` in a sqlparser message.
pub(crate) fn parser_location(message: &str) -> Option<(u64, u64)> {
    let at = message.rfind("Line: ")?;
    let rest = &message[at + "Line: ".len()..];
    let (line, rest) = rest.split_once(", Column: ")?;
    let column: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((line.trim().parse().ok()?, column.parse().ok()?))
}

/// A sqlparser message without its trailing location.
pub(crate) fn strip_location(message: &str) -> String {
    let m = message
        .strip_prefix("sql parser error: ")
        .unwrap_or(message);
    match m.rfind(" at Line: ") {
        Some(i) => m[..i].to_string(),
        None => m.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_file_line_column_and_caret() {
        let text = "SET 'a' = 'b';\nSELEC 1;";
        let e = SqlError::at("q.sql", text, 2, 1, "expected a statement");
        assert_eq!(
            e.to_string(),
            "q.sql:2:1: error: expected a statement\n2 | SELEC 1;\n  | ^"
        );
    }

    #[test]
    fn finds_parser_locations() {
        assert_eq!(
            parser_location("Expected: x, found: y at Line: 3, Column: 14"),
            Some((3, 14))
        );
        assert_eq!(
            strip_location("Expected: x, found: y at Line: 3, Column: 14"),
            "Expected: x, found: y"
        );
    }
}
