//! `format = 'debezium-json'`: a table's change events, as Debezium writes
//! them, read as a changelog.
//!
//! Each message is one change: `{"before": {...}, "after": {...}, "op":
//! "c"}` (or that object under `"payload"`, when Kafka Connect's JSON
//! converter adds the schema beside it). A create (`c`) or a snapshot read
//! (`r`) adds its `after` row; an update (`u`) takes its `before` row back
//! and adds its `after` row; a delete (`d`) takes its `before` row back.
//! Rows are signed in the engine's changelog column
//! ([`sluice_engine::CHANGELOG_SIGN`]): +1 added, −1 taken back. An
//! aggregation over the stream then counts, sums and averages the table
//! as it is now, however often its rows changed.
//!
//! An update or delete without its `before` row cannot take the old row
//! back: it is a malformed record, with the reason (PostgreSQL needs
//! `REPLICA IDENTITY FULL` for Debezium to send it).

use std::sync::Arc;

use datafusion::arrow::array::Int64Array;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use serde_json::Value;
use sluice_engine::{Result, SluiceError};

use crate::format::json::decode_json;

/// The rows the change events `values` add (+1) and take back (−1), in
/// `schema` (the declared columns, then the sign), with the index of the
/// event each row came from; an error naming the first event that is not
/// a change.
pub(crate) fn decode<'a>(
    schema: &SchemaRef,
    values: impl Iterator<Item = &'a [u8]>,
) -> Result<(RecordBatch, Vec<usize>)> {
    let mut rows: Vec<String> = Vec::new();
    let mut signs: Vec<i64> = Vec::new();
    let mut from: Vec<usize> = Vec::new();
    for (i, value) in values.enumerate() {
        for (row, sign) in changes(value)? {
            rows.push(row);
            signs.push(sign);
            from.push(i);
        }
    }
    let columns = Arc::new(schema.project(&(0..schema.fields().len() - 1).collect::<Vec<_>>())?);
    let decoded = decode_json(&columns, rows.iter().map(String::as_bytes))?;
    let mut arrays = decoded.columns().to_vec();
    arrays.push(Arc::new(Int64Array::from(signs)));
    Ok((RecordBatch::try_new(Arc::clone(schema), arrays)?, from))
}

/// The signed rows (as JSON objects) of one change event.
fn changes(value: &[u8]) -> Result<Vec<(String, i64)>> {
    let event: Value = serde_json::from_slice(value)
        .map_err(|e| SluiceError::plan(format!("not a Debezium JSON change event: {e}")))?;
    // Kafka Connect's JSON converter with schemas: {"schema": ..., "payload": ...}.
    let event = match event.get("payload") {
        Some(payload) if event.get("schema").is_some() => payload,
        _ => &event,
    };
    let Some(op) = event.get("op").and_then(Value::as_str) else {
        return Err(SluiceError::plan(
            "a Debezium change event without 'op' (expected \"c\", \"r\", \"u\" or \"d\")",
        ));
    };
    let row = |side: &str| -> Result<String> {
        match event.get(side) {
            Some(v @ Value::Object(_)) => Ok(v.to_string()),
            _ => Err(SluiceError::plan(format!(
                "a Debezium '{op}' event without its '{side}' row{}",
                if side == "before" {
                    " (it takes the old row back: PostgreSQL sends it with REPLICA IDENTITY FULL)"
                } else {
                    ""
                }
            ))),
        }
    };
    Ok(match op {
        "c" | "r" => vec![(row("after")?, 1)],
        "u" => vec![(row("before")?, -1), (row("after")?, 1)],
        "d" => vec![(row("before")?, -1)],
        other => {
            return Err(SluiceError::plan(format!(
                "a Debezium change event with 'op' = '{other}' (expected \"c\", \"r\", \"u\" or \
                 \"d\")"
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};

    #[test]
    fn creates_updates_and_deletes_are_signed_rows() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Int64, true),
            Field::new(sluice_engine::CHANGELOG_SIGN, DataType::Int64, false),
        ]));
        let events = [
            r#"{"before": null, "after": {"id": 1, "v": 10}, "op": "c", "ts_ms": 1}"#,
            r#"{"schema": {}, "payload": {"before": {"id": 1, "v": 10}, "after": {"id": 1, "v": 11}, "op": "u"}}"#,
            r#"{"before": {"id": 1, "v": 11}, "after": null, "op": "d"}"#,
            r#"{"after": {"id": 2, "v": null}, "op": "r"}"#,
        ];
        let (batch, from) = decode(&schema, events.iter().map(|e| e.as_bytes())).unwrap();
        let column = |i: usize| -> Vec<Option<i64>> {
            batch.column(i).as_primitive::<Int64Type>().iter().collect()
        };
        assert_eq!(column(0), [Some(1), Some(1), Some(1), Some(1), Some(2)]);
        assert_eq!(column(1), [Some(10), Some(10), Some(11), Some(11), None]);
        assert_eq!(column(2), [Some(1), Some(-1), Some(1), Some(-1), Some(1)]);
        assert_eq!(from, [0, 1, 1, 2, 3]);

        for (event, problem) in [
            (r#"{"before": null, "after": {"id": 1}}"#, "without 'op'"),
            (
                r#"{"before": null, "after": {"id": 1}, "op": "u"}"#,
                "without its 'before' row",
            ),
            (r#"{"op": "t"}"#, "'op' = 't'"),
            ("[1, 2]", "without 'op'"),
            ("{", "not a Debezium JSON change event"),
        ] {
            let err = decode(&schema, [event.as_bytes()].into_iter()).unwrap_err();
            assert!(err.to_string().contains(problem), "{event}: {err}");
        }
    }
}
