//! Flink's time functions: `DATE_FORMAT` and `FROM_UNIXTIME` (a time as
//! text by a Java pattern), `TO_TIMESTAMP` and `UNIX_TIMESTAMP` (text read
//! by one), `TO_TIMESTAMP_LTZ` (an epoch number as a time), and `HOUR`,
//! `MINUTE`, `SECOND`. Times are UTC: Sluice has no session time zone.

use std::sync::Arc;

use chrono::{DateTime, Datelike, NaiveDate, NaiveDateTime, Timelike};
use datafusion::arrow::array::{
    Array, AsArray, Int64Array, StringArray, TimestampMillisecondArray, TimestampNanosecondArray,
};
use datafusion::arrow::datatypes::{DataType, FieldRef, Int64Type, TimeUnit};
use datafusion::common::{exec_err, plan_err, ScalarValue};
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    TypeSignature, Volatility,
};

use super::{array_of, checking_constant, is_text, typed_field, ReadOnce};

/// Registers the time functions in `ctx`.
pub(super) fn register(ctx: &SessionContext) {
    ctx.register_udf(ScalarUDF::from(DateFormat::new()));
    ctx.register_udf(ScalarUDF::from(DateFormat::from_unixtime()));
    for part in [TimePart::Hour, TimePart::Minute, TimePart::Second] {
        ctx.register_udf(ScalarUDF::from(TimeOf::new(part)));
    }
    ctx.register_udf(ScalarUDF::from(ReadTime::to_timestamp()));
    ctx.register_udf(ScalarUDF::from(ReadTime::unix_timestamp()));
    ctx.register_udf(ScalarUDF::from(ToTimestampLtz::new()));
    ctx.register_udf(ScalarUDF::from(TimestampArith::add()));
    ctx.register_udf(ScalarUDF::from(TimestampArith::diff()));
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

    /// The pattern as chrono's format for reading text, and whether it
    /// reads a time of day (else the text is a date, at midnight).
    fn to_chrono(&self) -> std::result::Result<(String, bool), String> {
        let mut out = String::new();
        let mut time_of_day = false;
        for piece in &self.0 {
            let spec = match *piece {
                Piece::Text(ref t) => {
                    out.push_str(&t.replace('%', "%%"));
                    continue;
                }
                Piece::Field('y', 2) => "%y",
                Piece::Field('y', _) => "%Y",
                Piece::Field('M', 3) => "%b",
                Piece::Field('M', n) if n > 3 => "%B",
                Piece::Field('M', _) => "%m",
                Piece::Field('d', _) => "%d",
                Piece::Field('D', _) => "%j",
                Piece::Field('E', n) if n > 3 => "%A",
                Piece::Field('E', _) => "%a",
                Piece::Field(c, n) => {
                    time_of_day = true;
                    match (c, n) {
                        ('H', _) => "%H",
                        ('h', _) => "%I",
                        ('m', _) => "%M",
                        ('s', _) => "%S",
                        ('a', _) => "%p",
                        ('S', 3) => "%3f",
                        ('S', 6) => "%6f",
                        ('S', 9) => "%9f",
                        _ => {
                            return Err(format!(
                                "'{}' reads a fraction of a second of 3, 6 or 9 digits \
                                 (SSS, SSSSSS, SSSSSSSSS)",
                                "S".repeat(n)
                            ))
                        }
                    }
                }
            };
            out.push_str(spec);
        }
        Ok((out, time_of_day))
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
        checking_constant(self, &args, JavaPattern::parse)
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

/// How [`ReadTime`] reads text: by a Java pattern (as chrono's format, and
/// whether it has a time of day), or leniently (no pattern given).
struct Reading(Option<(String, bool)>);

impl Reading {
    fn of(pattern: &str) -> std::result::Result<Self, String> {
        let (format, time_of_day) = JavaPattern::parse(pattern)?
            .to_chrono()
            .map_err(|e| format!("pattern '{pattern}': {e}"))?;
        Ok(Self(Some((format, time_of_day))))
    }

    /// `text` as a time, or `None` where it does not match.
    fn read(&self, text: &str) -> Option<NaiveDateTime> {
        match &self.0 {
            Some((format, true)) => NaiveDateTime::parse_from_str(text, format).ok(),
            Some((format, false)) => NaiveDate::parse_from_str(text, format)
                .ok()
                .and_then(|d| d.and_hms_opt(0, 0, 0)),
            // Flink's default, 'yyyy-MM-dd HH:mm:ss', read leniently: a
            // fraction, a 'T', a zone or a date alone are taken too.
            None => datafusion::arrow::compute::kernels::cast_utils::string_to_timestamp_nanos(
                text.trim(),
            )
            .ok()
            .map(naive),
        }
    }
}

/// `TO_TIMESTAMP(text[, pattern])`: text read as a TIMESTAMP(3), NULL where
/// it does not match; `UNIX_TIMESTAMP([text[, pattern]])`: the same as
/// seconds since 1970-01-01 00:00:00 UTC, or the current time's seconds
/// without arguments. The default pattern is `yyyy-MM-dd HH:mm:ss`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct ReadTime {
    /// `UNIX_TIMESTAMP`: seconds, not a timestamp.
    seconds: bool,
    signature: Signature,
}

impl ReadTime {
    fn to_timestamp() -> Self {
        Self {
            seconds: false,
            signature: Signature::variadic_any(Volatility::Immutable),
        }
    }

    /// Volatile: `UNIX_TIMESTAMP()` is read at each row, never folded into
    /// a constant when the query is planned.
    fn unix_timestamp() -> Self {
        Self {
            seconds: true,
            signature: Signature::one_of(
                vec![TypeSignature::Nullary, TypeSignature::VariadicAny],
                Volatility::Volatile,
            ),
        }
    }
}

impl ScalarUDFImpl for ReadTime {
    fn name(&self) -> &str {
        if self.seconds {
            "unix_timestamp"
        } else {
            "to_timestamp"
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        let texts = args.iter().all(|t| is_text(t) || t.is_null());
        match (self.seconds, args.len()) {
            (true, 0..=2) if texts => Ok(DataType::Int64),
            (false, 1 | 2) if texts => Ok(DataType::Timestamp(TimeUnit::Millisecond, None)),
            (true, _) => plan_err!(
                "UNIX_TIMESTAMP takes nothing (now), or text and maybe a pattern, as \
                 UNIX_TIMESTAMP('2026-03-04 05:06:07') or UNIX_TIMESTAMP(s, 'yyyy/MM/dd'); \
                 got {args:?}"
            ),
            (false, _) => plan_err!(
                "TO_TIMESTAMP takes text and maybe a Java pattern, as TO_TIMESTAMP(s) or \
                 TO_TIMESTAMP(s, 'yyyy/MM/dd HH:mm'); got {args:?} (a number of seconds or \
                 milliseconds is TO_TIMESTAMP_LTZ(n, 0) or TO_TIMESTAMP_LTZ(n, 3))"
            ),
        }
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        checking_constant(self, &args, Reading::of)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let Some(text) = args.args.first() else {
            let now = chrono::Utc::now().timestamp();
            return Ok(ColumnarValue::Array(Arc::new(Int64Array::from(vec![
                now;
                n
            ]))));
        };
        let texts = array_of(text, n, &DataType::Utf8)?;
        let texts = texts.as_string::<i32>();
        let patterns = match args.args.get(1) {
            Some(p) => Some(array_of(p, n, &DataType::Utf8)?),
            None => None,
        };
        let patterns = patterns.as_ref().map(|p| p.as_string::<i32>());
        let lenient = Reading(None);
        let mut readings = ReadOnce::new(Reading::of);
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let reading = match patterns {
                _ if texts.is_null(i) => None,
                Some(p) if p.is_null(i) => None,
                Some(p) => Some(readings.get(p.value(i))?),
                None => Some(&lenient),
            };
            out.push(reading.and_then(|r| r.read(texts.value(i))).map(|t| {
                let t = t.and_utc();
                if self.seconds {
                    t.timestamp()
                } else {
                    t.timestamp_millis()
                }
            }));
        }
        Ok(ColumnarValue::Array(if self.seconds {
            Arc::new(Int64Array::from(out))
        } else {
            Arc::new(TimestampMillisecondArray::from(out))
        }))
    }
}

/// `TO_TIMESTAMP_LTZ(n, precision)`: `n` seconds (precision 0) or
/// milliseconds (3) since 1970-01-01 00:00:00 UTC as a TIMESTAMP(3).
#[derive(Debug, PartialEq, Eq, Hash)]
struct ToTimestampLtz {
    signature: Signature,
}

impl ToTimestampLtz {
    fn new() -> Self {
        Self {
            signature: Signature::any(2, Volatility::Immutable),
        }
    }
}

/// Milliseconds per unit of a `TO_TIMESTAMP_LTZ` precision.
fn ltz_unit(precision: &str) -> std::result::Result<i64, String> {
    match precision.trim() {
        "0" => Ok(1000),
        "3" => Ok(1),
        other => Err(format!(
            "TO_TIMESTAMP_LTZ's precision is 0 (seconds) or 3 (milliseconds), not {other}"
        )),
    }
}

impl ScalarUDFImpl for ToTimestampLtz {
    fn name(&self) -> &str {
        "to_timestamp_ltz"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match args {
            [n, p] if (n.is_integer() || n.is_null()) && p.is_integer() => {
                Ok(DataType::Timestamp(TimeUnit::Millisecond, None))
            }
            _ => plan_err!(
                "TO_TIMESTAMP_LTZ takes a whole number and its precision, 0 (seconds) or 3 \
                 (milliseconds), as TO_TIMESTAMP_LTZ(1767225600000, 3); got {args:?}"
            ),
        }
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        if let Some(Some(p)) = args.scalar_arguments.get(1) {
            if let Err(e) = ltz_unit(&p.to_string()) {
                return plan_err!("{e}");
            }
        }
        typed_field(self, &args)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let [numbers, precision] = args.args.as_slice() else {
            return exec_err!("TO_TIMESTAMP_LTZ takes two arguments");
        };
        let numbers = array_of(numbers, n, &DataType::Int64)?;
        let precisions = array_of(precision, n, &DataType::Int64)?;
        let precisions = precisions.as_primitive::<Int64Type>();
        let mut out = Vec::with_capacity(n);
        for (i, v) in numbers.as_primitive::<Int64Type>().iter().enumerate() {
            let (Some(v), false) = (v, precisions.is_null(i)) else {
                out.push(None);
                continue;
            };
            let unit = ltz_unit(&precisions.value(i).to_string())
                .map_err(datafusion::error::DataFusionError::Execution)?;
            out.push(v.checked_mul(unit));
        }
        Ok(ColumnarValue::Array(Arc::new(
            TimestampMillisecondArray::from(out),
        )))
    }
}

/// A unit of `TIMESTAMPADD` and `TIMESTAMPDIFF`: a fixed length, or months.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimeUnitOf {
    Nanos(i64),
    Months(i32),
}

fn time_unit(unit: &str) -> std::result::Result<TimeUnitOf, String> {
    const S: i64 = 1_000_000_000;
    Ok(match unit.trim().to_ascii_uppercase().as_str() {
        "SECOND" => TimeUnitOf::Nanos(S),
        "MINUTE" => TimeUnitOf::Nanos(60 * S),
        "HOUR" => TimeUnitOf::Nanos(3600 * S),
        "DAY" => TimeUnitOf::Nanos(86_400 * S),
        "WEEK" => TimeUnitOf::Nanos(7 * 86_400 * S),
        "MONTH" => TimeUnitOf::Months(1),
        "QUARTER" => TimeUnitOf::Months(3),
        "YEAR" => TimeUnitOf::Months(12),
        other => {
            return Err(format!(
                "'{other}' is not a unit of TIMESTAMPADD or TIMESTAMPDIFF: SECOND, MINUTE, HOUR, \
                 DAY, WEEK, MONTH, QUARTER or YEAR"
            ))
        }
    })
}

/// `TIMESTAMPADD(unit, n, ts)`: `ts` moved by `n` units (a month from
/// the 31st lands on the month's last day); `TIMESTAMPDIFF(unit, t1, t2)`:
/// how many whole units `t2` lies after `t1` (negative before), as Flink
/// computes them. The SQL layer passes the unit, a bare word in Flink's
/// syntax, as text.
#[derive(Debug, PartialEq, Eq, Hash)]
struct TimestampArith {
    diff: bool,
    signature: Signature,
}

impl TimestampArith {
    fn add() -> Self {
        Self {
            diff: false,
            signature: Signature::any(3, Volatility::Immutable),
        }
    }

    fn diff() -> Self {
        Self {
            diff: true,
            signature: Signature::any(3, Volatility::Immutable),
        }
    }
}

/// `t` moved by `months` months, the day clamped to the month's length.
fn add_months(t: NaiveDateTime, months: i64) -> Option<NaiveDateTime> {
    let months = i32::try_from(months).ok()?;
    if months >= 0 {
        t.checked_add_months(chrono::Months::new(months.unsigned_abs()))
    } else {
        t.checked_sub_months(chrono::Months::new(months.unsigned_abs()))
    }
}

/// Whole months from `a` to `b`, truncated toward zero.
fn months_between(a: NaiveDateTime, b: NaiveDateTime) -> i64 {
    let raw = i64::from(b.year() - a.year()) * 12 + i64::from(b.month()) - i64::from(a.month());
    // One month short where `b` has not reached `a`'s day and time.
    match add_months(a, raw) {
        Some(m) if raw > 0 && m > b => raw - 1,
        Some(m) if raw < 0 && m < b => raw + 1,
        _ => raw,
    }
}

impl ScalarUDFImpl for TimestampArith {
    fn name(&self) -> &str {
        if self.diff {
            "timestampdiff"
        } else {
            "timestampadd"
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match (self.diff, args) {
            (false, [u, n, t]) if is_text(u) && (n.is_integer() || n.is_null()) && is_time(t) => {
                Ok(DataType::Timestamp(TimeUnit::Nanosecond, None))
            }
            (true, [u, a, b]) if is_text(u) && is_time(a) && is_time(b) => Ok(DataType::Int64),
            (false, _) => plan_err!(
                "TIMESTAMPADD takes a unit, a whole number and a time, as TIMESTAMPADD(HOUR, 2, \
                 ts); got {args:?}"
            ),
            (true, _) => plan_err!(
                "TIMESTAMPDIFF takes a unit and two times, as TIMESTAMPDIFF(DAY, t1, t2); got \
                 {args:?}"
            ),
        }
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        if let Some(Some(unit)) = args.scalar_arguments.first() {
            if let Err(e) = time_unit(&unit.to_string()) {
                return plan_err!("{e}");
            }
        }
        typed_field(self, &args)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let [unit, a, b] = args.args.as_slice() else {
            return exec_err!("{} takes three arguments", self.name());
        };
        let units = array_of(unit, n, &DataType::Utf8)?;
        let units = units.as_string::<i32>();
        let mut read = ReadOnce::new(time_unit);
        let second = times(b, n)?;
        if self.diff {
            let first = times(a, n)?;
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                if units.is_null(i) || first.is_null(i) || second.is_null(i) {
                    out.push(None);
                    continue;
                }
                let (t1, t2) = (first.value(i), second.value(i));
                out.push(Some(match *read.get(units.value(i))? {
                    TimeUnitOf::Nanos(len) => (t2 - t1) / len,
                    TimeUnitOf::Months(m) => months_between(naive(t1), naive(t2)) / i64::from(m),
                }));
            }
            return Ok(ColumnarValue::Array(Arc::new(Int64Array::from(out))));
        }
        let counts = array_of(a, n, &DataType::Int64)?;
        let counts = counts.as_primitive::<Int64Type>();
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            if units.is_null(i) || counts.is_null(i) || second.is_null(i) {
                out.push(None);
                continue;
            }
            let (k, t) = (counts.value(i), second.value(i));
            out.push(match *read.get(units.value(i))? {
                TimeUnitOf::Nanos(len) => k.checked_mul(len).and_then(|d| t.checked_add(d)),
                TimeUnitOf::Months(m) => add_months(naive(t), k * i64::from(m))
                    .and_then(|m| m.and_utc().timestamp_nanos_opt()),
            });
        }
        Ok(ColumnarValue::Array(Arc::new(
            TimestampNanosecondArray::from(out),
        )))
    }
}
