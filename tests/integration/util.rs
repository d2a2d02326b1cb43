//! Shared helpers for the integration tests.

use std::sync::Arc;

use sluice::arrow::array::{Int64Array, StringArray};
use sluice::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use sluice::arrow::record_batch::RecordBatch;

/// `(id BIGINT, name VARCHAR)`.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]))
}

/// Rows `id` in `ids`, named `n<id>`.
pub fn batch(ids: std::ops::Range<i64>) -> RecordBatch {
    let names: Vec<String> = ids.clone().map(|i| format!("n{i}")).collect();
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(ids)),
            Arc::new(StringArray::from(names)),
        ],
    )
    .expect("valid batch")
}

/// The Int64 column `name` of every batch, concatenated.
pub fn ints(batches: &[RecordBatch], name: &str) -> Vec<i64> {
    use sluice::arrow::array::AsArray;
    use sluice::arrow::datatypes::Int64Type;
    batches
        .iter()
        .flat_map(|b| {
            b.column_by_name(name)
                .expect("column exists")
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect()
}

/// A small deterministic generator: no dependency, a fixed seed in CI.
pub struct Lcg(pub u64);

impl Lcg {
    /// A number in `0..below`.
    pub fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}
