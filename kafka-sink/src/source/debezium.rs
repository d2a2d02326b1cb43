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

use datafusion::arrow::array::{Array, AsArray, Int64Array, StructArray};
use datafusion::arrow::compute::interleave;
use datafusion::arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use sluice_engine::{Result, SluiceError};

use crate::format::json::decode_json;

/// The rows the change events `values` add (+1) and take back (−1), in
/// `schema` (the declared columns, then the sign), with the index of the
/// event each row came from; an error naming the first event that is not
/// a change.
///
/// The events are decoded as JSON by arrow-json, rows and all, in one
/// pass: a row's numbers go from the event's text to their columns as
/// they would from a plain JSON message, so a DECIMAL of any precision is
/// exact.
pub(crate) fn decode<'a>(
    schema: &SchemaRef,
    values: impl Iterator<Item = &'a [u8]>,
) -> Result<(RecordBatch, Vec<usize>)> {
    let columns = Arc::new(schema.project(&(0..schema.fields().len() - 1).collect::<Vec<_>>())?);
    // Inside a row that is null (an insert's `before`) every column is.
    let row = DataType::Struct(Fields::from_iter(
        columns
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true)),
    ));
    let change = Fields::from(vec![
        Field::new("op", DataType::Utf8, true),
        Field::new("before", row.clone(), true),
        Field::new("after", row, true),
    ]);
    // Kafka Connect's JSON converter with schemas puts the event under
    // "payload", beside its "schema".
    let mut fields: Vec<Field> = change.iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new("payload", DataType::Struct(change), true));
    let envelope = Arc::new(Schema::new(fields));
    let events = decode_json(&envelope, values)
        .map_err(|e| SluiceError::plan(format!("not a Debezium JSON change event: {e}")))?;
    let payload = events.column(3).as_struct();
    let sides: [&StructArray; 4] = [
        events.column(1).as_struct(),
        events.column(2).as_struct(),
        payload.column(1).as_struct(),
        payload.column(2).as_struct(),
    ];
    let (top_op, payload_op) = (
        events.column(0).as_string::<i32>(),
        payload.column(0).as_string::<i32>(),
    );
    // (which of `sides`, which row) of each row out, its sign, its event.
    let mut picks: Vec<(usize, usize)> = Vec::new();
    let mut signs: Vec<i64> = Vec::new();
    let mut from: Vec<usize> = Vec::new();
    for i in 0..events.num_rows() {
        let (op, at) = match payload.is_valid(i) {
            true => (payload_op, 2),
            false => (top_op, 0),
        };
        let Some(op) = op.is_valid(i).then(|| op.value(i)) else {
            return Err(SluiceError::plan(
                "a Debezium change event without 'op' (expected \"c\", \"r\", \"u\" or \"d\")",
            ));
        };
        let side = |name: &str| -> Result<(usize, usize)> {
            let s = at + usize::from(name == "after");
            if sides[s].is_valid(i) {
                return Ok((s, i));
            }
            Err(SluiceError::plan(format!(
                "a Debezium '{op}' event without its '{name}' row{}",
                if name == "before" {
                    " (it takes the old row back: PostgreSQL sends it with REPLICA IDENTITY FULL)"
                } else {
                    ""
                }
            )))
        };
        let rows = match op {
            "c" | "r" => vec![(side("after")?, 1)],
            "u" => vec![(side("before")?, -1), (side("after")?, 1)],
            "d" => vec![(side("before")?, -1)],
            other => {
                return Err(SluiceError::plan(format!(
                    "a Debezium change event with 'op' = '{other}' (expected \"c\", \"r\", \"u\" \
                     or \"d\")"
                )))
            }
        };
        for (pick, sign) in rows {
            picks.push(pick);
            signs.push(sign);
            from.push(i);
        }
    }
    let arrays: Vec<&dyn Array> = sides.iter().map(|s| *s as &dyn Array).collect();
    let rows = interleave(&arrays, &picks)?;
    let mut arrays = rows.as_struct().columns().to_vec();
    arrays.push(Arc::new(Int64Array::from(signs)));
    Ok((RecordBatch::try_new(Arc::clone(schema), arrays)?, from))
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
            ("[1, 2]", "not a Debezium JSON change event"),
            ("{", "not a Debezium JSON change event"),
        ] {
            let err = decode(&schema, [event.as_bytes()].into_iter()).unwrap_err();
            assert!(err.to_string().contains(problem), "{event}: {err}");
        }
    }

    /// Numbers go from the event's text to their columns, as from a plain
    /// JSON message: 30 significant digits stay exact (a float on the way
    /// kept about 16).
    #[test]
    fn decimals_are_exact_at_any_precision() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Decimal128(38, 10), true),
            Field::new(sluice_engine::CHANGELOG_SIGN, DataType::Int64, false),
        ]));
        let event = r#"{"before": {"id": 1, "v": 12345678901234567890.1234567891},
            "after": {"id": 1, "v": 98765432109876543210.9876543211}, "op": "u"}"#;
        let (batch, _) = decode(&schema, [event.as_bytes()].into_iter()).unwrap();
        let v = batch
            .column(1)
            .as_primitive::<datafusion::arrow::datatypes::Decimal128Type>();
        assert_eq!(v.value_as_string(0), "12345678901234567890.1234567891");
        assert_eq!(v.value_as_string(1), "98765432109876543210.9876543211");
    }
}
