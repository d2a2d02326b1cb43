//! Connector options, parsed once into typed values.
//!
//! Every connector receives its `WITH (...)` / `.option(k, v)` pairs as an
//! [`Options`] bag. It takes each key it understands (typed, with an error
//! naming the key and the expected form), then calls [`Options::finish`],
//! which rejects whatever is left by name and lists the valid keys. Keys are
//! case-insensitive; keys starting with a pass-through prefix (`kafka.`) are
//! collected with [`Options::take_prefixed`].

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Result, SluiceError};

/// An option bag: key → string value, keys lower-cased.
///
/// ```
/// use sluice_engine::Options;
/// let mut o = Options::from_pairs([("rows_per_second", "5")]);
/// assert_eq!(o.take_parsed::<u64>("rows_per_second", "a whole number")?, Some(5));
/// o.finish("rate", &["rows_per_second", "num_partitions"])?;
/// # Ok::<(), sluice_engine::SluiceError>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Options {
    values: BTreeMap<String, String>,
}

impl Options {
    /// An empty bag.
    pub fn new() -> Self {
        Self::default()
    }

    /// A bag from `(key, value)` pairs; later pairs win.
    pub fn from_pairs<K: AsRef<str>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        let mut o = Self::new();
        for (k, v) in pairs {
            o.set(k.as_ref(), v);
        }
        o
    }

    /// Sets `key` (case-insensitive) to `value`. The value of a
    /// [sensitive](is_sensitive) key is also remembered as a secret, which
    /// [`redact_secrets`] takes out of anything printed.
    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        let value = value.into();
        if is_sensitive(key) {
            register_secret(&value);
        }
        // Credentials in a URL (`https://user:secret@registry`, as
        // Confluent's clients take them) are secret whatever the key.
        if let Some(userinfo) = url_userinfo(&value) {
            register_secret(userinfo);
            if let Some((_, password)) = userinfo.split_once(':') {
                register_secret(password);
            }
        }
        self.values.insert(key.to_ascii_lowercase(), value);
    }

    /// The value of `key`, without taking it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values
            .get(&key.to_ascii_lowercase())
            .map(String::as_str)
    }

    /// True when no key is left.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// All pairs, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.values.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Removes and returns `key`.
    pub fn take(&mut self, key: &str) -> Option<String> {
        self.values.remove(&key.to_ascii_lowercase())
    }

    /// Removes and returns `key`, or an error saying it is required.
    pub fn take_required(&mut self, connector: &str, key: &str, example: &str) -> Result<String> {
        self.take(key).ok_or_else(|| {
            self.missing(
                &format!("connector '{connector}'"),
                key,
                &format!("'{key}' = '{example}'"),
            )
        })
    }

    /// The error for a required `key` of `what` (e.g. "connector 'files'")
    /// that is absent, pointing out a remaining key that looks like a
    /// misspelling of it.
    pub fn missing(&self, what: &str, key: &str, example: &str) -> SluiceError {
        let typo = self
            .values
            .keys()
            .find(|k| closest(k, std::iter::once(key)).is_some())
            .map(|t| format!(" ('{t}' looks like a misspelling of it)"))
            .unwrap_or_default();
        SluiceError::config(format!("{what} needs option '{key}'{typo}, e.g. {example}"))
    }

    /// Removes `key` and parses it as `T`; `expected` describes the valid
    /// form for the error message.
    pub fn take_parsed<T: FromStr>(&mut self, key: &str, expected: &str) -> Result<Option<T>> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v.trim().parse::<T>().map(Some).map_err(|_| {
                SluiceError::config(format!(
                    "option '{key}' = '{v}' is not valid: expected {expected}"
                ))
            }),
        }
    }

    /// Removes `key` and matches it (case-insensitively) against `choices`.
    pub fn take_choice(&mut self, key: &str, choices: &[&str]) -> Result<Option<String>> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => {
                let lower = v.trim().to_ascii_lowercase();
                if choices.contains(&lower.as_str()) {
                    Ok(Some(lower))
                } else {
                    Err(SluiceError::config(format!(
                        "option '{key}' = '{v}' is not valid: expected one of {}",
                        quoted_list(choices)
                    )))
                }
            }
        }
    }

    /// Removes `key` and parses it as a duration (`'500 ms'`, `'1 second'`,
    /// `'2s'`, `'0'`).
    pub fn take_duration(&mut self, key: &str) -> Result<Option<Duration>> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => parse_duration(&v).map(Some).map_err(|e| {
                SluiceError::config(format!("option '{key}' = '{v}' is not valid: {e}"))
            }),
        }
    }

    /// Removes every key starting with `prefix` and returns them with the
    /// prefix stripped (used for `kafka.*` pass-through options).
    pub fn take_prefixed(&mut self, prefix: &str) -> Vec<(String, String)> {
        let prefix = prefix.to_ascii_lowercase();
        let keys: Vec<String> = self
            .values
            .keys()
            .filter(|k| k.starts_with(&prefix))
            .cloned()
            .collect();
        keys.into_iter()
            .filter_map(|k| {
                let v = self.values.remove(&k)?;
                Some((k[prefix.len()..].to_string(), v))
            })
            .collect()
    }

    /// Fails when keys are left, naming them and listing the `valid` ones.
    pub fn finish(&self, connector: &str, valid: &[&str]) -> Result<()> {
        self.finish_for(&format!("connector '{connector}'"), valid)
    }

    /// [`finish`](Self::finish) for options of `what` (e.g. "table 'names'").
    pub fn finish_for(&self, what: &str, valid: &[&str]) -> Result<()> {
        if let Some(key) = self.values.keys().next() {
            let hint = closest(key, valid.iter().copied())
                .map(|c| format!(" (did you mean '{c}'?)"))
                .unwrap_or_default();
            return Err(SluiceError::config(format!(
                "unknown option '{key}' for {what}{hint}; valid options: {}",
                quoted_list(valid)
            )));
        }
        Ok(())
    }
}

/// Shows keys, and values except those of [sensitive](is_sensitive) keys
/// and the secrets within others (a URL's credentials).
impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.values.iter().map(|(k, v)| {
                let v = if is_sensitive(k) {
                    REDACTED.to_string()
                } else {
                    redact_secrets(v)
                };
                (k, v)
            }))
            .finish()
    }
}

/// The user info of a URL (`user:password` in `https://user:password@host/`),
/// if `value` is a URL that has one.
///
/// ```
/// use sluice_engine::url_userinfo;
/// assert_eq!(url_userinfo("https://ann:s3cret@registry:8081/apis"), Some("ann:s3cret"));
/// assert_eq!(url_userinfo("https://registry:8081/a@b"), None);
/// assert_eq!(url_userinfo("plain text"), None);
/// ```
pub fn url_userinfo(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once("://")?;
    if scheme.is_empty()
        || !scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next()?;
    let (userinfo, _) = authority.rsplit_once('@')?;
    (!userinfo.is_empty()).then_some(userinfo)
}

/// True for an option or client property whose value is a secret:
/// passwords, secrets, JAAS configurations, tokens and key material
/// (`sasl.password`, `ssl.key.password`, `ssl.keystore.password`,
/// `sasl.oauthbearer.client.secret`, `ssl.key.pem`, ...). Their values are
/// never printed.
///
/// ```
/// use sluice_engine::is_sensitive;
/// assert!(is_sensitive("kafka.sasl.password"));
/// assert!(is_sensitive("sasl.oauthbearer.client.secret"));
/// assert!(is_sensitive("ssl.key.pem"));
/// assert!(!is_sensitive("sasl.username"));
/// // Where a token comes from is not the token: errors may name it.
/// assert!(!is_sensitive("sasl.oauthbearer.token.endpoint.url"));
/// ```
pub fn is_sensitive(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    if key.ends_with("token.endpoint.url") {
        return false;
    }
    [
        "password",
        "passwd",
        "secret",
        "jaas",
        "token",
        "credential",
        "ssl.key.",
        "ssl.keystore.",
        "private",
        "sasl.oauthbearer.config",
        "basic.auth.user.info",
        "basic-auth.user-info",
    ]
    .iter()
    .any(|word| key.contains(word))
}

/// The secrets this process was given (values of sensitive options).
static SECRETS: std::sync::RwLock<Vec<String>> = std::sync::RwLock::new(Vec::new());

/// What replaces a secret in anything Sluice prints.
pub const REDACTED: &str = "[redacted]";

/// Remembers `value` as a secret: [`redact_secrets`] replaces it from now
/// on. Done by [`Options::set`] for every sensitive key; call it for
/// secrets that reach Sluice another way.
pub fn register_secret(value: &str) {
    // A one-character "secret" would blank out unrelated text.
    if value.chars().count() < 2 {
        return;
    }
    let mut secrets = SECRETS.write().unwrap_or_else(|p| p.into_inner());
    if !secrets.iter().any(|s| s == value) {
        secrets.push(value.to_string());
        // Longest first, so a secret containing another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }
}

/// `text` with every registered secret replaced by [`REDACTED`]: applied
/// to errors, logs and reports before they are printed.
///
/// ```
/// use sluice_engine::{redact_secrets, Options};
/// let o = Options::from_pairs([("kafka.sasl.password", "pa55-w0rd")]);
/// assert_eq!(redact_secrets("login with pa55-w0rd failed"), "login with [redacted] failed");
/// # drop(o);
/// ```
pub fn redact_secrets(text: &str) -> String {
    let secrets = SECRETS.read().unwrap_or_else(|p| p.into_inner());
    let mut out = text.to_string();
    for s in secrets.iter() {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), REDACTED);
        }
    }
    out
}

/// `'a', 'b', 'c'` — for error messages.
pub fn quoted_list(items: &[&str]) -> String {
    items
        .iter()
        .map(|s| format!("'{s}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `a Int64, b Utf8` — a schema's columns, for messages.
pub fn columns(schema: &datafusion::arrow::datatypes::Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| format!("{} {}", f.name(), f.data_type()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The candidate closest to `word` by edit distance, if it is close enough to
/// be a plausible typo.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let word = word.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|c| (strsim::levenshtein(&word, &c.to_ascii_lowercase()), c))
        .filter(|(d, c)| *d <= (c.len().max(word.len()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Parses `'1 second'`, `'500 ms'`, `'2s'`, `'1.5 minutes'`, `'1h 30m'` or
/// `'0'`: humantime's durations, in any case, with SQL's spellings of
/// milliseconds (`millisecond(s)`, `milli`) and a bare zero.
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let text = text.trim().to_ascii_lowercase();
    if text.parse::<f64>() == Ok(0.0) {
        return Ok(Duration::ZERO);
    }
    // Lower case first, as SQL's units are (`INTERVAL '1' MINUTE`); so `m`
    // is a minute and never humantime's month.
    let mut spelled = String::with_capacity(text.len());
    let mut word = String::new();
    for c in text.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_alphabetic() {
            word.push(c);
            continue;
        }
        spelled.push_str(match word.as_str() {
            "milli" | "millisecond" | "milliseconds" => "ms",
            other => other,
        });
        word.clear();
        spelled.push(c);
    }
    humantime::parse_duration(spelled.trim()).map_err(|e| {
        format!("{e}: expected a duration such as '1 second', '500 ms', '1.5 minutes' or '0'")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_named_with_a_suggestion() {
        let o = Options::from_pairs([("rows_per_secnd", "5")]);
        let err = o
            .finish("rate", &["rows_per_second", "num_partitions"])
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("'rows_per_secnd'"), "{msg}");
        assert!(msg.contains("did you mean 'rows_per_second'"), "{msg}");
        assert!(msg.contains("'num_partitions'"), "{msg}");
    }

    #[test]
    fn typed_values_name_the_key_on_error() {
        let mut o = Options::from_pairs([("Rows_Per_Second", "five")]);
        let msg = o
            .take_parsed::<u64>("rows_per_second", "a whole number")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("'rows_per_second' = 'five'"), "{msg}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1 second"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("500 ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5 Minutes"), Ok(Duration::from_secs(90)));
        assert_eq!(
            parse_duration("10 MILLISECONDS"),
            Ok(Duration::from_millis(10))
        );
        assert_eq!(parse_duration("3 milli"), Ok(Duration::from_millis(3)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2 hours"), Ok(Duration::from_secs(7200)));
        let err = parse_duration("2 fortnights").unwrap_err();
        assert!(err.contains("unknown time unit \"fortnights\""), "{err}");
        assert!(
            parse_duration("5").is_err(),
            "a number without a unit is not a duration"
        );
    }
}
