//! The value a `WITH` option or a `SET` is given, and `${NAME}` in it: the
//! value of environment variable `NAME`, so that passwords and other
//! secrets need not be written in `.sql` files. `$${` stands for a literal
//! `${`.

use datafusion::sql::sqlparser::tokenizer::Token;

/// The value `token` gives `what` (e.g. "option 'format'"): a quoted
/// string, a number or a bare word, with `${NAME}` substituted. The error
/// names `what`; it belongs at the token's position.
pub(crate) fn value_of(token: &Token, what: &str) -> Result<String, String> {
    let raw = match token {
        Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => s.clone(),
        Token::Number(n, _) => n.clone(),
        Token::Word(w) => w.value.clone(),
        other => return Err(format!("expected a value for {what}, found '{other}'")),
    };
    substitute(&raw).map_err(|message| format!("{what}: {message}"))
}

/// `value` with each `${NAME}` replaced by the variable's value; the error
/// says which variable is unset or which reference is malformed.
pub(crate) fn substitute(value: &str) -> Result<String, String> {
    substitute_with(value, |name| std::env::var(name).ok())
}

fn substitute_with(value: &str, var: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find("${") {
        if rest[..at].ends_with('$') {
            out.push_str(&rest[..at - 1]);
            out.push_str("${");
            rest = &rest[at + 2..];
            continue;
        }
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            return Err(
                "'${' without a closing '}': write ${NAME}, or $${ for a literal ${".into(),
            );
        };
        let name = &after[..end];
        let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!(
                "'${{{name}}}' is not a valid environment variable reference: names are letters, \
                 digits and '_'"
            ));
        }
        let Some(v) = var(name) else {
            return Err(format!(
                "environment variable '{name}' (in '${{{name}}}') is not set"
            ));
        };
        out.push_str(&v);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "PW").then(|| "s3cret".to_string())
    }

    #[test]
    fn references_are_replaced_and_unset_ones_named() {
        assert_eq!(substitute_with("${PW}", env).unwrap(), "s3cret");
        assert_eq!(
            substitute_with("user:${PW}@host", env).unwrap(),
            "user:s3cret@host"
        );
        assert_eq!(substitute_with("$${PW} $5", env).unwrap(), "${PW} $5");
        assert_eq!(substitute_with("no refs", env).unwrap(), "no refs");
        let err = substitute_with("${NOPE}", env).unwrap_err();
        assert!(err.contains("'NOPE'") && err.contains("not set"), "{err}");
        assert!(substitute_with("${PW", env).is_err());
        assert!(substitute_with("${a-b}", env).is_err());
    }
}
