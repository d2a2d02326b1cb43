//! Computed columns: `name AS expression` among a stream's declared
//! columns, as Flink declares them. Each is evaluated over every batch the
//! stream's source reads, before the watermark sees the batch, so a
//! watermark can be declared over one (`WATERMARK FOR dateTime AS ...`
//! with `dateTime AS CASE ... END`). A stream written to takes its other
//! columns only, as in Flink.

use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::DFSchema;
use datafusion::execution::context::SessionState;
use datafusion::physical_expr::PhysicalExpr;

use crate::error::{Result, SluiceError};
use crate::source::Partitions;
use crate::watermark::processing_time;

/// The field metadata key of a computed column: the source's columns its
/// expression reads, comma-separated (the planner asks where a column's
/// values come from, e.g. whether a deletion carries a version's time).
pub(crate) const COMPUTED_FROM: &str = "sluice.computed.from";

/// A computed column as declared.
///
/// ```
/// use sluice_engine::ComputedColumn;
/// let c = ComputedColumn::new("hour", "date_trunc('hour', ts)");
/// assert_eq!(c.name, "hour");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComputedColumn {
    /// The column's name.
    pub name: String,
    /// The SQL expression over the stream's other columns.
    pub expression: String,
}

impl ComputedColumn {
    /// `name AS expression`.
    pub fn new(name: impl Into<String>, expression: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            expression: expression.into(),
        }
    }
}

/// A stream's computed columns, planned against the columns its source
/// yields.
#[derive(Debug)]
pub(crate) struct Computed {
    expressions: Vec<Arc<dyn PhysicalExpr>>,
    /// The source's columns, then the computed ones.
    schema: SchemaRef,
}

impl Computed {
    /// Plans `columns` over `source` (the columns the source yields);
    /// `None` when there are none.
    pub(crate) fn plan(
        state: &SessionState,
        stream: &str,
        source: &SchemaRef,
        columns: &[ComputedColumn],
    ) -> Result<Option<Self>> {
        if columns.is_empty() {
            return Ok(None);
        }
        let df_schema = DFSchema::try_from(Arc::clone(source))?;
        let mut fields: Vec<Field> = source.fields().iter().map(|f| f.as_ref().clone()).collect();
        let mut expressions = Vec::with_capacity(columns.len());
        for c in columns {
            let named = |e: &dyn std::fmt::Display| {
                SluiceError::plan(format!(
                    "stream '{stream}': computed column '{}' AS {}: {e}",
                    c.name, c.expression
                ))
            };
            if source.index_of(&c.name).is_ok() || fields.iter().any(|f| f.name() == &c.name) {
                return Err(named(&"a column of that name exists already"));
            }
            let logical = state
                .create_logical_expr(&c.expression, &df_schema)
                .map_err(|e| named(&e))?;
            let proctime = processing_time::is_call(&logical);
            let mut reads: Vec<String> = logical
                .column_refs()
                .into_iter()
                .map(|c| c.name.clone())
                .collect();
            reads.sort();
            reads.dedup();
            let physical = state
                .create_physical_expr(logical, &df_schema)
                .map_err(|e| named(&e))?;
            let data_type = physical.data_type(source).map_err(|e| named(&e))?;
            let field = Field::new(&c.name, data_type, true).with_metadata(
                [(COMPUTED_FROM.to_string(), reads.join(","))]
                    .into_iter()
                    .collect(),
            );
            fields.push(match proctime {
                true => processing_time::mark_computed(field),
                false => field,
            });
            expressions.push(physical);
        }
        Ok(Some(Self {
            expressions,
            schema: Arc::new(Schema::new(fields)),
        }))
    }

    /// The source's columns, then the computed ones.
    pub(crate) fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Each batch with its computed columns.
    pub(crate) fn apply(&self, partitions: Partitions) -> Result<Partitions> {
        partitions
            .into_iter()
            .map(|batches| batches.iter().map(|b| self.apply_one(b)).collect())
            .collect()
    }

    fn apply_one(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let mut columns = batch.columns().to_vec();
        for e in &self.expressions {
            columns.push(e.evaluate(batch)?.into_array(batch.num_rows())?);
        }
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }
}
