//! The user function Flink's Nexmark q14 declares with `CREATE FUNCTION
//! count_char AS 'com.github.nexmark.flink.udf.CountChar'`, written in Rust
//! so that the query file runs unchanged: Sluice loads no Java class, and
//! its `CREATE FUNCTION` resolves to a function the program registered.

use std::sync::Arc;

use arrow::array::{Array, AsArray, Int64Array};
use arrow::datatypes::DataType;
use datafusion::logical_expr::{create_udf, ColumnarValue, ScalarUDF, Volatility};

/// `count_char(text, letter)`: how many times `letter` occurs in `text`
/// (NULL if either is NULL), as Flink nexmark's `CountChar`.
///
/// ```
/// use datafusion::execution::FunctionRegistry;
/// use datafusion::prelude::SessionContext;
///
/// let ctx = SessionContext::new();
/// ctx.register_udf(sluice_nexmark::count_char());
/// // Now `CREATE FUNCTION count_char AS '...'` finds it, and SQL calls
/// // `count_char(extra, 'c')`.
/// assert!(ctx.udf("count_char").is_ok());
/// ```
pub fn count_char() -> ScalarUDF {
    create_udf(
        "count_char",
        vec![DataType::Utf8, DataType::Utf8],
        DataType::Int64,
        Volatility::Immutable,
        Arc::new(|args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let (text, letter) = (arrays[0].as_string::<i32>(), arrays[1].as_string::<i32>());
            let counts: Int64Array = (0..text.len())
                .map(|i| {
                    (!text.is_null(i) && !letter.is_null(i))
                        .then(|| text.value(i).matches(letter.value(i)).count() as i64)
                })
                .collect();
            Ok(ColumnarValue::Array(Arc::new(counts)))
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;

    #[test]
    fn counts_each_occurrence_and_keeps_nulls() {
        let text: StringArray = vec![Some("accbc"), Some(""), None, Some("ccc")].into();
        let letter: StringArray = vec![Some("c"), Some("c"), Some("c"), None].into();
        let args = [
            ColumnarValue::Array(Arc::new(text)),
            ColumnarValue::Array(Arc::new(letter)),
        ];
        let udf = count_char();
        let out = udf
            .invoke_with_args(datafusion::logical_expr::ScalarFunctionArgs {
                args: args.to_vec(),
                arg_fields: vec![],
                number_rows: 4,
                return_field: Arc::new(arrow::datatypes::Field::new("n", DataType::Int64, true)),
                config_options: Arc::new(Default::default()),
            })
            .unwrap();
        let ColumnarValue::Array(out) = out else {
            panic!("an array")
        };
        let out = out.as_primitive::<arrow::datatypes::Int64Type>();
        assert_eq!(
            out.iter().collect::<Vec<_>>(),
            [Some(3), Some(0), None, None]
        );
    }
}
