//! Flink's built-in functions that DataFusion lacks or names differently,
//! with Flink's meaning, registered in every session ([`register`]).
//!
//! Where a name exists in both with different meanings, Flink's wins:
//! DataFusion reads `DATE_FORMAT` as `to_char`, whose patterns are
//! chrono's (`%Y-%m-%d`), so Flink's `DATE_FORMAT(ts, 'yyyy-MM-dd')` would
//! plan and return the wrong text. Here it takes Java's date-time pattern
//! letters, and a pattern with a letter outside them is refused when the
//! query is planned.
//!
//! | function | meaning (Flink's) |
//! | --- | --- |
//! | `DATE_FORMAT(ts, pattern)` | `ts` (a timestamp, a date, or text read as one) as text, by a Java pattern |
//! | `FROM_UNIXTIME(seconds[, pattern])` | seconds since 1970-01-01 00:00:00 UTC as text, by a Java pattern (default `yyyy-MM-dd HH:mm:ss`) |
//! | `IF(condition, a, b)` | `a` where the condition holds, else `b` (also where it is NULL) |
//! | `HOUR(ts)`, `MINUTE(ts)`, `SECOND(ts)` | the hour of the day, the minute of the hour, the second of the minute, as BIGINT |
//! | `MOD(a, b)` | the remainder of `a / b`, with the sign of `a` (`a % b`) |
//! | `SPLIT_INDEX(s, sep, i)` | the `i`-th (from 0) piece of `s` split at `sep`; NULL past the last or for `i < 0` |
//! | `REGEXP_EXTRACT(s, regex[, i])` | group `i` (default 0: the whole match) of the first match; NULL without a match |
//!
//! ```
//! # async fn demo() -> datafusion::error::Result<()> {
//! use datafusion::prelude::SessionContext;
//! let ctx = SessionContext::new();
//! sluice_engine::functions::register(&ctx);
//! let df = ctx
//!     .sql("SELECT DATE_FORMAT(TIMESTAMP '2026-03-04 05:06:07', 'yyyy/MM/dd HH:mm') AS t")
//!     .await?;
//! let out = df.collect().await?;
//! # Ok(()) }
//! ```

use std::sync::Arc;

use chrono::{DateTime, Datelike, NaiveDateTime, Timelike};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Int64Array, StringArray, TimestampNanosecondArray,
};
use datafusion::arrow::compute::kernels::numeric::rem;
use datafusion::arrow::compute::kernels::zip::zip;
use datafusion::arrow::compute::{cast, prep_null_mask_filter};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Int64Type, TimeUnit};
use datafusion::common::{exec_err, plan_err, ScalarValue};
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::type_coercion::binary::{comparison_coercion, BinaryTypeCoercer};
use datafusion::logical_expr::{
    ColumnarValue, Operator, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, Volatility,
};

/// Registers Flink's functions in `ctx`, in place of DataFusion's of the
/// same name.
pub fn register(ctx: &SessionContext) {
    ctx.register_udf(ScalarUDF::from(DateFormat::new()));
    ctx.register_udf(ScalarUDF::from(DateFormat::from_unixtime()));
    ctx.register_udf(ScalarUDF::from(If::new()));
    for part in [TimePart::Hour, TimePart::Minute, TimePart::Second] {
        ctx.register_udf(ScalarUDF::from(TimeOf::new(part)));
    }
    ctx.register_udf(ScalarUDF::from(Mod::new()));
    ctx.register_udf(ScalarUDF::from(SplitIndex::new()));
    ctx.register_udf(ScalarUDF::from(RegexpExtract::new()));
}

/// The text-valued field of `udf` over `args`, once its second argument,
/// when a constant, reads with `read`: a pattern it cannot read is refused
/// when the query is planned, not at its first row.
fn text_checking_constant<T>(
    udf: &dyn ScalarUDFImpl,
    args: &ReturnFieldArgs,
    read: fn(&str) -> std::result::Result<T, String>,
) -> Result<FieldRef> {
    let types: Vec<DataType> = args
        .arg_fields
        .iter()
        .map(|f| f.data_type().clone())
        .collect();
    udf.return_type(&types)?;
    if let Some(text) = constant_text(args.scalar_arguments.get(1).copied().flatten()) {
        if let Err(e) = read(text) {
            return plan_err!("{e}");
        }
    }
    Ok(Arc::new(Field::new(udf.name(), DataType::Utf8, true)))
}

/// A per-row text argument (a pattern, a regular expression) read once for
/// as long as the rows repeat it.
struct ReadOnce<T> {
    read: fn(&str) -> std::result::Result<T, String>,
    last: Option<(String, T)>,
}

impl<T> ReadOnce<T> {
    fn new(read: fn(&str) -> std::result::Result<T, String>) -> Self {
        Self { read, last: None }
    }

    fn get(&mut self, text: &str) -> Result<&T> {
        if self.last.as_ref().is_none_or(|(t, _)| t != text) {
            let value = (self.read)(text).map_err(datafusion::error::DataFusionError::Execution)?;
            self.last = Some((text.to_string(), value));
        }
        match &self.last {
            Some((_, value)) => Ok(value),
            None => exec_err!("'{text}' was read but not kept"),
        }
    }
}

/// A string argument given as a constant, if it is one.
fn constant_text(value: Option<&ScalarValue>) -> Option<&str> {
    match value? {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => Some(s.as_str()),
        _ => None,
    }
}

/// `arg` as one array of `n` rows of type `to`.
fn array_of(arg: &ColumnarValue, n: usize, to: &DataType) -> Result<ArrayRef> {
    Ok(cast(&arg.to_array(n)?, to)?)
}

/// Each row's time of a timestamp, date or text argument, in UTC.
fn times(arg: &ColumnarValue, n: usize) -> Result<TimestampNanosecondArray> {
    let nanos = array_of(arg, n, &DataType::Timestamp(TimeUnit::Nanosecond, None))?;
    Ok(nanos.as_primitive().clone())
}

fn naive(ns: i64) -> NaiveDateTime {
    DateTime::from_timestamp_nanos(ns).naive_utc()
}

/// Whether `t` can be read as a time.
fn is_time(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Timestamp(..)
            | DataType::Date32
            | DataType::Date64
            | DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Null
    )
}

/// One element of a Java date-time pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    /// A pattern letter and how many times it repeats.
    Field(char, usize),
}

/// A Java `DateTimeFormatter` pattern, as Flink's `DATE_FORMAT` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct JavaPattern(Vec<Piece>);

/// The pattern letters supported: year, month, day, hour (0–23 and 1–12),
/// minute, second, fraction, AM/PM, day of week, day of year.
const LETTERS: &str = "yMdHhmsSaED";

impl JavaPattern {
    fn parse(pattern: &str) -> std::result::Result<Self, String> {
        let chars: Vec<char> = pattern.chars().collect();
        let mut pieces = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if c == '\'' {
                // 'text' is literal; '' is one quote, inside or outside.
                let mut text = String::new();
                i += 1;
                if chars.get(i) == Some(&'\'') {
                    pieces.push(Piece::Text("'".into()));
                    i += 1;
                    continue;
                }
                loop {
                    match (chars.get(i), chars.get(i + 1)) {
                        (None, _) => {
                            return Err(format!(
                                "DATE_FORMAT pattern '{pattern}' opens a quote it does not close"
                            ))
                        }
                        (Some('\''), Some('\'')) => {
                            text.push('\'');
                            i += 2;
                        }
                        (Some('\''), _) => {
                            i += 1;
                            break;
                        }
                        (Some(&c), _) => {
                            text.push(c);
                            i += 1;
                        }
                    }
                }
                pieces.push(Piece::Text(text));
            } else if c.is_ascii_alphabetic() {
                if !LETTERS.contains(c) {
                    return Err(format!(
                        "DATE_FORMAT pattern '{pattern}': '{c}' is not a pattern letter Sluice \
                         formats (Java's y M d H h m s S a E D); quote literal text ('T')"
                    ));
                }
                let n = chars[i..].iter().take_while(|&&x| x == c).count();
                pieces.push(Piece::Field(c, n));
                i += n;
            } else {
                pieces.push(Piece::Text(c.to_string()));
                i += 1;
            }
        }
        Ok(Self(pieces))
    }

    fn format(&self, t: &NaiveDateTime) -> String {
        let mut out = String::new();
        let pad = |out: &mut String, v: i64, n: usize| out.push_str(&format!("{v:0n$}"));
        for piece in &self.0 {
            match *piece {
                Piece::Text(ref s) => out.push_str(s),
                Piece::Field('y', 2) => pad(&mut out, i64::from(t.year()).rem_euclid(100), 2),
                Piece::Field('y', n) => pad(&mut out, i64::from(t.year()), n),
                Piece::Field('M', 3) => out.push_str(&t.format("%b").to_string()),
                Piece::Field('M', n) if n > 3 => out.push_str(&t.format("%B").to_string()),
                Piece::Field('M', n) => pad(&mut out, i64::from(t.month()), n),
                Piece::Field('d', n) => pad(&mut out, i64::from(t.day()), n),
                Piece::Field('H', n) => pad(&mut out, i64::from(t.hour()), n),
                Piece::Field('h', n) => pad(&mut out, i64::from((t.hour() + 11) % 12 + 1), n),
                Piece::Field('m', n) => pad(&mut out, i64::from(t.minute()), n),
                Piece::Field('s', n) => pad(&mut out, i64::from(t.second()), n),
                Piece::Field('S', n) => {
                    // The fraction of the second, to n digits (cut, not rounded).
                    let digits = format!("{:09}", t.nanosecond() % 1_000_000_000);
                    out.push_str(&digits[..n.min(9)]);
                    out.extend(std::iter::repeat_n('0', n.saturating_sub(9)));
                }
                Piece::Field('a', _) => out.push_str(if t.hour() < 12 { "AM" } else { "PM" }),
                Piece::Field('E', n) if n > 3 => out.push_str(&t.format("%A").to_string()),
                Piece::Field('E', _) => out.push_str(&t.format("%a").to_string()),
                Piece::Field('D', n) => pad(&mut out, i64::from(t.ordinal()), n),
                Piece::Field(_, _) => {}
            }
        }
        out
    }
}

/// `DATE_FORMAT(ts, pattern)` and `FROM_UNIXTIME(seconds[, pattern])`: a
/// time as text by a Java pattern (see the module's text).
#[derive(Debug, PartialEq, Eq, Hash)]
struct DateFormat {
    /// `FROM_UNIXTIME`: the time is seconds since 1970-01-01 00:00:00 UTC,
    /// and the pattern defaults to `yyyy-MM-dd HH:mm:ss`.
    from_seconds: bool,
    signature: Signature,
}

/// `FROM_UNIXTIME`'s pattern when none is given (Flink's).
const UNIXTIME_PATTERN: &str = "yyyy-MM-dd HH:mm:ss";

impl DateFormat {
    fn new() -> Self {
        Self {
            from_seconds: false,
            signature: Signature::any(2, Volatility::Immutable),
        }
    }

    fn from_unixtime() -> Self {
        Self {
            from_seconds: true,
            signature: Signature::variadic_any(Volatility::Immutable),
        }
    }

    /// Each row's time: `arg` read as a time, or as seconds.
    fn times(&self, arg: &ColumnarValue, n: usize) -> Result<TimestampNanosecondArray> {
        if !self.from_seconds {
            return times(arg, n);
        }
        let seconds = array_of(arg, n, &DataType::Int64)?;
        Ok(seconds
            .as_primitive::<Int64Type>()
            .iter()
            .map(|s| s.and_then(|s| s.checked_mul(1_000_000_000)))
            .collect())
    }
}

impl ScalarUDFImpl for DateFormat {
    fn name(&self) -> &str {
        if self.from_seconds {
            "from_unixtime"
        } else {
            "date_format"
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match (self.from_seconds, args) {
            (false, [t, p]) if is_time(t) && is_text(p) => Ok(DataType::Utf8),
            (true, [s]) if s.is_integer() || s.is_null() => Ok(DataType::Utf8),
            (true, [s, p]) if (s.is_integer() || s.is_null()) && is_text(p) => Ok(DataType::Utf8),
            (false, _) => plan_err!(
                "DATE_FORMAT takes a timestamp (or date, or text) and a pattern, as \
                 DATE_FORMAT(ts, 'yyyy-MM-dd HH:mm:ss'); got {args:?}"
            ),
            (true, _) => plan_err!(
                "FROM_UNIXTIME takes whole seconds since 1970 and maybe a pattern, as \
                 FROM_UNIXTIME(1767225600, 'yyyy-MM-dd'); got {args:?}"
            ),
        }
    }

    /// Refuses a constant pattern it cannot format when the query is
    /// planned.
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        text_checking_constant(self, &args, JavaPattern::parse)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let default = ColumnarValue::Scalar(ScalarValue::Utf8(Some(UNIXTIME_PATTERN.into())));
        let (time, pattern) = match args.args.as_slice() {
            [time, pattern] => (time, pattern),
            [time] if self.from_seconds => (time, &default),
            _ => return exec_err!("{} takes a time and a pattern", self.name()),
        };
        let times = self.times(time, n)?;
        let patterns = array_of(pattern, n, &DataType::Utf8)?;
        let patterns = patterns.as_string::<i32>();
        let mut parsed = ReadOnce::new(JavaPattern::parse);
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            if times.is_null(i) || patterns.is_null(i) {
                out.push(None);
                continue;
            }
            let pattern = parsed.get(patterns.value(i))?;
            out.push(Some(pattern.format(&naive(times.value(i)))));
        }
        Ok(ColumnarValue::Array(Arc::new(StringArray::from(out))))
    }
}

/// Which part of a time [`TimeOf`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum TimePart {
    Hour,
    Minute,
    Second,
}

/// `HOUR(ts)`, `MINUTE(ts)`, `SECOND(ts)`: a part of the time, as BIGINT.
#[derive(Debug, PartialEq, Eq, Hash)]
struct TimeOf {
    part: TimePart,
    signature: Signature,
}

impl TimeOf {
    fn new(part: TimePart) -> Self {
        Self {
            part,
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for TimeOf {
    fn name(&self) -> &str {
        match self.part {
            TimePart::Hour => "hour",
            TimePart::Minute => "minute",
            TimePart::Second => "second",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match args {
            [t] if is_time(t) => Ok(DataType::Int64),
            _ => plan_err!(
                "{}() takes one timestamp (or date, or text); got {args:?}",
                self.name().to_uppercase()
            ),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [time] = args.args.as_slice() else {
            return exec_err!("{}() takes one argument", self.name());
        };
        let times = times(time, args.number_rows)?;
        let out: Int64Array = times
            .iter()
            .map(|t| {
                t.map(|ns| {
                    let t = naive(ns);
                    i64::from(match self.part {
                        TimePart::Hour => t.hour(),
                        TimePart::Minute => t.minute(),
                        TimePart::Second => t.second(),
                    })
                })
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

/// `MOD(a, b)`: `a % b`, in the type the `%` of the two gives.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Mod {
    signature: Signature,
}

impl Mod {
    fn new() -> Self {
        Self {
            signature: Signature::any(2, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for Mod {
    fn name(&self) -> &str {
        "mod"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        let [a, b] = args else {
            return plan_err!("MOD takes two numbers, as MOD(a, b)");
        };
        if !(a.is_numeric() || a.is_null()) || !(b.is_numeric() || b.is_null()) {
            return plan_err!("MOD takes two numbers, as MOD(a, b); got {a} and {b}");
        }
        BinaryTypeCoercer::new(a, &Operator::Modulo, b).get_result_type()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let [a, b] = args.args.as_slice() else {
            return exec_err!("MOD takes two arguments");
        };
        let to = args.return_type().clone();
        let (a, b) = (array_of(a, n, &to)?, array_of(b, n, &to)?);
        Ok(ColumnarValue::Array(rem(&a, &b)?))
    }
}

/// `SPLIT_INDEX(s, sep, i)` (see the module's text).
#[derive(Debug, PartialEq, Eq, Hash)]
struct SplitIndex {
    signature: Signature,
}

impl SplitIndex {
    fn new() -> Self {
        Self {
            signature: Signature::any(3, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for SplitIndex {
    fn name(&self) -> &str {
        "split_index"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match args {
            [s, sep, i] if is_text(s) && is_text(sep) && (i.is_integer() || i.is_null()) => {
                Ok(DataType::Utf8)
            }
            _ => plan_err!(
                "SPLIT_INDEX takes text, a separator and a position from 0, as \
                 SPLIT_INDEX(s, ',', 1); got {args:?}"
            ),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let [s, sep, i] = args.args.as_slice() else {
            return exec_err!("SPLIT_INDEX takes three arguments");
        };
        let s = array_of(s, n, &DataType::Utf8)?;
        let sep = array_of(sep, n, &DataType::Utf8)?;
        let i = array_of(i, n, &DataType::Int64)?;
        let (s, sep, i) = (
            s.as_string::<i32>(),
            sep.as_string::<i32>(),
            i.as_primitive::<Int64Type>(),
        );
        let out: StringArray = (0..n)
            .map(|r| {
                if s.is_null(r) || sep.is_null(r) || i.is_null(r) {
                    return None;
                }
                let at = usize::try_from(i.value(r)).ok()?;
                let sep = sep.value(r);
                if sep.is_empty() {
                    // Java's split on an empty separator gives each character.
                    return s.value(r).chars().nth(at).map(String::from);
                }
                s.value(r).split(sep).nth(at).map(String::from)
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

fn is_text(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null
    )
}

/// `REGEXP_EXTRACT(s, regex[, i])` (see the module's text).
#[derive(Debug, PartialEq, Eq, Hash)]
struct RegexpExtract {
    signature: Signature,
}

impl RegexpExtract {
    fn new() -> Self {
        Self {
            signature: Signature::variadic_any(Volatility::Immutable),
        }
    }
}

/// `regex` compiled, or why it cannot be.
fn compile(regex: &str) -> std::result::Result<regex::Regex, String> {
    regex::Regex::new(regex).map_err(|e| {
        format!(
            "REGEXP_EXTRACT: '{regex}' is not a regular expression Sluice reads (no look-around \
             or back-references): {e}"
        )
    })
}

impl ScalarUDFImpl for RegexpExtract {
    fn name(&self) -> &str {
        "regexp_extract"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match args {
            [s, r] if is_text(s) && is_text(r) => Ok(DataType::Utf8),
            [s, r, i] if is_text(s) && is_text(r) && (i.is_integer() || i.is_null()) => {
                Ok(DataType::Utf8)
            }
            _ => plan_err!(
                "REGEXP_EXTRACT takes text, a regular expression and a group number, as \
                 REGEXP_EXTRACT(s, 'id=([0-9]+)', 1); got {args:?}"
            ),
        }
    }

    /// Refuses a constant regular expression it cannot read when the query
    /// is planned.
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        text_checking_constant(self, &args, compile)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let (s, regex) = match args.args.as_slice() {
            [s, r] | [s, r, _] => (s, r),
            _ => return exec_err!("REGEXP_EXTRACT takes two or three arguments"),
        };
        let s = array_of(s, n, &DataType::Utf8)?;
        let regexes = array_of(regex, n, &DataType::Utf8)?;
        let group = match args.args.get(2) {
            Some(i) => array_of(i, n, &DataType::Int64)?,
            None => Arc::new(Int64Array::from_value(0, n)),
        };
        let (s, regexes, group) = (
            s.as_string::<i32>(),
            regexes.as_string::<i32>(),
            group.as_primitive::<Int64Type>(),
        );
        let mut compiled = ReadOnce::new(compile);
        let mut out = Vec::with_capacity(n);
        for r in 0..n {
            if s.is_null(r) || regexes.is_null(r) || group.is_null(r) {
                out.push(None);
                continue;
            }
            let text = regexes.value(r);
            let regex = compiled.get(text)?;
            let Ok(at) = usize::try_from(group.value(r)) else {
                return exec_err!(
                    "REGEXP_EXTRACT: group {} is below 0; groups count from 1 (0 is the whole \
                     match)",
                    group.value(r)
                );
            };
            if at >= regex.captures_len() {
                return exec_err!(
                    "REGEXP_EXTRACT: '{text}' has {} group(s), so there is no group {at}",
                    regex.captures_len() - 1
                );
            }
            let found = regex.captures(s.value(r)).and_then(|c| c.get(at));
            out.push(found.map(|m| m.as_str().to_string()));
        }
        Ok(ColumnarValue::Array(Arc::new(StringArray::from(out))))
    }
}

/// `IF(condition, a, b)`: `a` where the condition holds, else `b` (also
/// where it is NULL), in the type the two share.
#[derive(Debug, PartialEq, Eq, Hash)]
struct If {
    signature: Signature,
}

impl If {
    fn new() -> Self {
        Self {
            signature: Signature::any(3, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for If {
    fn name(&self) -> &str {
        "if"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        let [c, a, b] = args else {
            return plan_err!("IF takes a condition and two values, as IF(n > 0, 'yes', 'no')");
        };
        if !matches!(c, DataType::Boolean | DataType::Null) {
            return plan_err!("IF's condition is {c}, not a BOOLEAN");
        }
        match comparison_coercion(a, b) {
            Some(t) => Ok(t),
            None => plan_err!("IF's two values have no common type: {a} and {b}"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let [c, a, b] = args.args.as_slice() else {
            return exec_err!("IF takes three arguments");
        };
        let to = args.return_type().clone();
        let condition = array_of(c, n, &DataType::Boolean)?;
        let condition = condition.as_boolean();
        // A NULL condition takes the second value.
        let condition = if condition.null_count() > 0 {
            prep_null_mask_filter(condition)
        } else {
            condition.clone()
        };
        let (a, b) = (array_of(a, n, &to)?, array_of(b, n, &to)?);
        Ok(ColumnarValue::Array(zip(&condition, &a, &b)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::util::display::array_value_to_string;

    /// The one value `sql` (a SELECT of one row, one column) gives, as text.
    async fn one(sql: &str) -> Result<String> {
        let ctx = SessionContext::new();
        register(&ctx);
        let batches = ctx.sql(sql).await?.collect().await?;
        Ok(array_value_to_string(batches[0].column(0), 0)?)
    }

    #[tokio::test]
    async fn date_format_reads_java_patterns() {
        let ts = "TIMESTAMP '2026-03-04 17:06:07.089123'";
        for (pattern, want) in [
            ("yyyy-MM-dd HH:mm:ss", "2026-03-04 17:06:07"),
            ("yyyy-MM-dd HH:mm:ss.SSS", "2026-03-04 17:06:07.089"),
            ("yy/M/d h:m a", "26/3/4 5:6 PM"),
            ("dd MMM yyyy, EEEE", "04 Mar 2026, Wednesday"),
            ("MMMM D", "March 63"),
            ("yyyy-MM-dd'T'HH:mm", "2026-03-04T17:06"),
            ("'at' HH 'o''clock'", "at 17 o'clock"),
            ("SSSSSS", "089123"),
        ] {
            let quoted = pattern.replace('\'', "''");
            let got = one(&format!("SELECT DATE_FORMAT({ts}, '{quoted}')"))
                .await
                .unwrap();
            assert_eq!(got, want, "pattern {pattern}");
        }
        // Text is read as a time first, as Flink reads it.
        let got = one("SELECT DATE_FORMAT('2026-03-04 17:06:07', 'HH:mm')")
            .await
            .unwrap();
        assert_eq!(got, "17:06");
    }

    #[tokio::test]
    async fn a_date_format_pattern_outside_javas_letters_is_refused_when_planned() {
        let ctx = SessionContext::new();
        register(&ctx);
        let err = ctx
            .sql("SELECT DATE_FORMAT(TIMESTAMP '2026-03-04 17:06:07', 'yyyy-Q')")
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("'Q' is not a pattern letter"), "{err}");
    }

    #[tokio::test]
    async fn time_parts_mod_split_index_and_regexp_extract_have_flinks_meaning() {
        let ts = "TIMESTAMP '2026-03-04 17:06:07'";
        for (sql, want) in [
            (format!("SELECT HOUR({ts})"), "17"),
            (format!("SELECT MINUTE({ts})"), "6"),
            (format!("SELECT SECOND({ts})"), "7"),
            ("SELECT MOD(-7, 3)".to_string(), "-1"),
            ("SELECT MOD(7.5, 2)".to_string(), "1.5"),
            ("SELECT SPLIT_INDEX('a,b,c', ',', 1)".to_string(), "b"),
            ("SELECT SPLIT_INDEX('a,b,c', ',', 3)".to_string(), ""),
            ("SELECT SPLIT_INDEX('a,b,c', ',', -1)".to_string(), ""),
            (
                "SELECT REGEXP_EXTRACT('foothebar', 'foo(.*?)(bar)', 2)".to_string(),
                "bar",
            ),
            (
                "SELECT REGEXP_EXTRACT('foothebar', 'foo(.*?)(bar)')".to_string(),
                "foothebar",
            ),
            (
                "SELECT REGEXP_EXTRACT('x=1', 'y=([0-9])', 1)".to_string(),
                "",
            ),
        ] {
            assert_eq!(one(&sql).await.unwrap(), want, "{sql}");
        }
        for (sql, want) in [
            ("SELECT FROM_UNIXTIME(1772643967)", "2026-03-04 17:06:07"),
            (
                "SELECT FROM_UNIXTIME(1772643967, 'yyyy/MM/dd')",
                "2026/03/04",
            ),
            ("SELECT IF(1 > 0, 'yes', 'no')", "yes"),
            ("SELECT IF(1 < 0, 1, 2.5)", "2.5"),
            ("SELECT IF(CAST(NULL AS BOOLEAN), 'yes', 'no')", "no"),
        ] {
            assert_eq!(one(sql).await.unwrap(), want, "{sql}");
        }
        let none = one("SELECT SPLIT_INDEX('a,b,c', ',', 3) IS NULL")
            .await
            .unwrap();
        assert_eq!(none, "true");
        let err = one("SELECT REGEXP_EXTRACT('ab', '(?<=a)b', 0)")
            .await
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("not a regular expression"),
            "{err}"
        );
    }
}
