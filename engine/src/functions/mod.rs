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
//! | `TO_TIMESTAMP(s[, pattern])`, `UNIX_TIMESTAMP([s[, pattern]])` | text read by a Java pattern as a TIMESTAMP(3), or as seconds since 1970 |
//! | `TIMESTAMPADD(unit, n, ts)`, `TIMESTAMPDIFF(unit, t1, t2)` | a time moved by, or the whole units between two times (the unit a bare word, passed as text by the SQL layer) |
//! | `TO_TIMESTAMP_LTZ(n, precision)` | `n` seconds (0) or milliseconds (3) since 1970 as a TIMESTAMP(3) |
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

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array, StringArray};
use datafusion::arrow::compute::kernels::numeric::rem;
use datafusion::arrow::compute::kernels::zip::zip;
use datafusion::arrow::compute::{cast, prep_null_mask_filter};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Int64Type};
use datafusion::common::{exec_err, plan_err, ScalarValue};
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::type_coercion::binary::{comparison_coercion, BinaryTypeCoercer};
use datafusion::logical_expr::{
    ColumnarValue, Operator, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, Volatility,
};

mod time;

/// Registers Flink's functions in `ctx`, in place of DataFusion's of the
/// same name.
pub fn register(ctx: &SessionContext) {
    time::register(ctx);
    ctx.register_udf(ScalarUDF::from(If::new()));
    ctx.register_udf(ScalarUDF::from(Mod::new()));
    ctx.register_udf(ScalarUDF::from(SplitIndex::new()));
    ctx.register_udf(ScalarUDF::from(RegexpExtract::new()));
}

/// The field of `udf` over `args`: its name, and the type its
/// `return_type` gives for the arguments' types (an error for wrong ones).
fn typed_field(udf: &dyn ScalarUDFImpl, args: &ReturnFieldArgs) -> Result<FieldRef> {
    let types: Vec<DataType> = args
        .arg_fields
        .iter()
        .map(|f| f.data_type().clone())
        .collect();
    let data_type = udf.return_type(&types)?;
    Ok(Arc::new(Field::new(udf.name(), data_type, true)))
}

/// The field of `udf` over `args`, once its second argument, when a
/// constant, reads with `read`: a pattern it cannot read is refused when
/// the query is planned, not at its first row.
fn checking_constant<T>(
    udf: &dyn ScalarUDFImpl,
    args: &ReturnFieldArgs,
    read: fn(&str) -> std::result::Result<T, String>,
) -> Result<FieldRef> {
    let field = typed_field(udf, args)?;
    if let Some(text) = constant_text(args.scalar_arguments.get(1).copied().flatten()) {
        if let Err(e) = read(text) {
            return plan_err!("{e}");
        }
    }
    Ok(field)
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
        checking_constant(self, &args, compile)
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
        for (sql, want) in [
            (
                "SELECT TO_TIMESTAMP('2026-03-04 17:06:07')",
                "2026-03-04T17:06:07",
            ),
            (
                "SELECT TO_TIMESTAMP('04/03/2026 17:06', 'dd/MM/yyyy HH:mm')",
                "2026-03-04T17:06:00",
            ),
            (
                "SELECT TO_TIMESTAMP('2026-03-04 17:06:07.250', 'yyyy-MM-dd HH:mm:ss.SSS')",
                "2026-03-04T17:06:07.250",
            ),
            (
                "SELECT TO_TIMESTAMP('2026-03-04', 'yyyy-MM-dd')",
                "2026-03-04T00:00:00",
            ),
            (
                "SELECT TO_TIMESTAMP('March 4', 'yyyy-MM-dd') IS NULL",
                "true",
            ),
            ("SELECT UNIX_TIMESTAMP('2026-03-04 17:06:07')", "1772643967"),
            (
                "SELECT UNIX_TIMESTAMP('2026/03/04', 'yyyy/MM/dd')",
                "1772582400",
            ),
            ("SELECT UNIX_TIMESTAMP() > 1772643967", "true"),
            (
                "SELECT TO_TIMESTAMP_LTZ(1772643967250, 3)",
                "2026-03-04T17:06:07.250",
            ),
            (
                "SELECT TO_TIMESTAMP_LTZ(1772643967, 0)",
                "2026-03-04T17:06:07",
            ),
            (
                "SELECT TIMESTAMPADD('HOUR', 2, TIMESTAMP '2026-03-04 23:06:07')",
                "2026-03-05T01:06:07",
            ),
            (
                "SELECT TIMESTAMPADD('MONTH', 1, TIMESTAMP '2026-01-31 10:00:00')",
                "2026-02-28T10:00:00",
            ),
            (
                "SELECT TIMESTAMPADD('YEAR', -1, TIMESTAMP '2026-03-04 00:00:00')",
                "2025-03-04T00:00:00",
            ),
            (
                "SELECT TIMESTAMPDIFF('DAY', TIMESTAMP '2003-01-02 10:00:00', TIMESTAMP '2003-01-03 10:00:00')",
                "1",
            ),
            (
                "SELECT TIMESTAMPDIFF('MONTH', TIMESTAMP '2026-01-31 00:00:00', TIMESTAMP '2026-02-28 00:00:00')",
                "1",
            ),
            (
                "SELECT TIMESTAMPDIFF('MONTH', TIMESTAMP '2026-01-15 00:00:00', TIMESTAMP '2026-04-15 00:00:00')",
                "3",
            ),
            (
                "SELECT TIMESTAMPDIFF('MONTH', TIMESTAMP '2026-01-15 10:00:00', TIMESTAMP '2026-04-15 09:00:00')",
                "2",
            ),
            (
                "SELECT TIMESTAMPDIFF('SECOND', TIMESTAMP '2026-01-01 00:00:10', TIMESTAMP '2026-01-01 00:00:00')",
                "-10",
            ),
        ] {
            assert_eq!(one(sql).await.unwrap(), want, "{sql}");
        }
        for (sql, problem) in [
            (
                "SELECT TO_TIMESTAMP('2026', 'yyyy-Q')",
                "'Q' is not a pattern letter",
            ),
            (
                "SELECT TO_TIMESTAMP('1', 'ss.SS')",
                "fraction of a second of 3, 6 or 9 digits",
            ),
            (
                "SELECT TO_TIMESTAMP_LTZ(1, 2)",
                "precision is 0 (seconds) or 3 (milliseconds)",
            ),
            ("SELECT TO_TIMESTAMP(1)", "TO_TIMESTAMP_LTZ(n, 0)"),
            (
                "SELECT TIMESTAMPADD('FORTNIGHT', 1, TIMESTAMP '2026-01-01 00:00:00')",
                "'FORTNIGHT' is not a unit",
            ),
        ] {
            let err = one(sql).await.err().map(|e| e.to_string());
            assert!(
                err.as_deref().is_some_and(|e| e.contains(problem)),
                "{sql}: {err:?}"
            );
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
