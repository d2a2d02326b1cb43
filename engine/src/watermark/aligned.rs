//! Watermarks across a repartition step, aligned as Flink aligns them
//! over a task's input channels.
//!
//! A downstream task reads what every upstream task sends it, so its
//! rows are only as far along in event time as the slowest upstream task.
//! Row times alone cannot tell it how far that is (an upstream task may
//! send it nothing for a while), so the upstream tasks say it:
//! - After its rows of an epoch that read any, each upstream task writes
//!   one *watermark row* to every partition of the channel, in the same
//!   transaction: its data columns null, [`FROM`] its task number,
//!   [`WATERMARK`] its watermark (ns), [`TO`] the partition.
//! - A partition keeps each producer's order, and `read_committed` shows a
//!   transaction whole, so a downstream task that reads task *j*'s
//!   watermark row has read every row *j* wrote before it.
//! - A downstream task's watermark is the minimum of the latest watermark
//!   of every upstream task. Until each has sent one it has none: an
//!   upstream task not started yet (its process down, its partition not
//!   handed out) would otherwise find its rows late.
//! - With an idle timeout (`watermark.idle-timeout`, Flink's
//!   `table.exec.source.idle-timeout`), an upstream task heard nothing
//!   from for that long (by the downstream's epoch times) is left out of
//!   the minimum until it sends again; its rows may then be late.
//!
//! The rows are judged late downstream, by this watermark, before they
//! reach the operator; upstream, a plain projection, drops nothing. So
//! each row is counted late once, where it is dropped.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, BooleanArray, Int32Array, Int64Array, RecordBatch,
};
use datafusion::arrow::compute::{filter_record_batch, is_null};
use datafusion::arrow::datatypes::{Field, Int32Type, Int64Type, Schema, SchemaRef};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{lit, Expr};

use crate::error::{Result, SluiceError};
use crate::source::Partitions;

/// The upstream task that wrote a watermark row (null on data rows).
pub(crate) const FROM: &str = "wm_from";
/// A watermark row's watermark, ns since the Unix epoch.
pub(crate) const WATERMARK: &str = "wm";
/// The channel partition a watermark row goes to.
pub(crate) const TO: &str = "wm_to";

/// How the stream that reads a channel back gets its watermark: from the
/// watermark rows of `tasks` upstream tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Aligned {
    /// How many upstream tasks write to the channel.
    pub(crate) tasks: u32,
    /// `watermark.idle-timeout`.
    pub(crate) idle_timeout: Option<Duration>,
}

/// The columns the upstream's output ends with, null on its data rows.
pub(crate) fn columns() -> Vec<Expr> {
    vec![
        lit(ScalarValue::Int32(None)).alias(FROM),
        lit(ScalarValue::Int64(None)).alias(WATERMARK),
        lit(ScalarValue::Int32(None)).alias(TO),
    ]
}

/// `schema` with every column nullable (a watermark row's data columns
/// are null), its fields' metadata kept.
pub(crate) fn nullable(schema: &Schema) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// Upstream task `from`'s watermark rows, one for each of the channel's
/// `partitions`, in the upstream output's columns (`schema`, ending with
/// [`columns`]).
pub(crate) fn rows(
    schema: &Schema,
    from: u32,
    partitions: u32,
    watermark: i64,
) -> Result<RecordBatch> {
    let n = partitions as usize;
    let from = i32::try_from(from).map_err(|_| SluiceError::Internal("task number".into()))?;
    let to: Vec<i32> = (0..partitions)
        .filter_map(|p| i32::try_from(p).ok())
        .collect();
    let schema = nullable(schema);
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| -> ArrayRef {
            match f.name().as_str() {
                FROM => Arc::new(Int32Array::from(vec![from; n])),
                WATERMARK => Arc::new(Int64Array::from(vec![watermark; n])),
                TO => Arc::new(Int32Array::from(to.clone())),
                _ => new_null_array(f.data_type(), n),
            }
        })
        .collect();
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// What a downstream task knows of its upstream tasks' watermarks.
#[derive(Debug)]
pub(crate) struct Upstream {
    from: usize,
    watermark: usize,
    aligned: Aligned,
    /// Per upstream task, when (the epoch's planned time, ms) its last
    /// watermark row was read; before any, when this task started.
    heard: BTreeMap<u32, i64>,
    started: Option<i64>,
}

impl Upstream {
    /// For a channel read back with `schema` (which holds [`FROM`] and
    /// [`WATERMARK`]).
    pub(crate) fn new(schema: &Schema, aligned: Aligned) -> Result<Self> {
        let index = |name: &str| {
            schema.index_of(name).map_err(|_| {
                SluiceError::Internal(format!("a repartition channel without column '{name}'"))
            })
        };
        Ok(Self {
            from: index(FROM)?,
            watermark: index(WATERMARK)?,
            aligned,
            heard: BTreeMap::new(),
            started: None,
        })
    }

    /// Takes the watermark rows out of `partitions` (an epoch's read of
    /// the channel), raising each sender's entry in `watermarks`, read at
    /// `now_ms`; returns the data rows.
    pub(crate) fn take(
        &mut self,
        partitions: Partitions,
        watermarks: &mut BTreeMap<u32, i64>,
        now_ms: i64,
    ) -> Result<Partitions> {
        self.started.get_or_insert(now_ms);
        let mut kept = Vec::with_capacity(partitions.len());
        for partition in partitions {
            let mut out = Vec::with_capacity(partition.len());
            for batch in partition {
                let from = batch.column(self.from);
                if from.null_count() == from.len() {
                    out.push(batch);
                    continue;
                }
                let senders = from.as_primitive::<Int32Type>();
                let marks = batch.column(self.watermark).as_primitive::<Int64Type>();
                for i in 0..batch.num_rows() {
                    if senders.is_null(i) || marks.is_null(i) {
                        continue;
                    }
                    let Ok(sender) = u32::try_from(senders.value(i)) else {
                        continue;
                    };
                    let mark = watermarks.entry(sender).or_insert(marks.value(i));
                    *mark = (*mark).max(marks.value(i));
                    self.heard.insert(sender, now_ms);
                }
                let data: BooleanArray = is_null(from)?;
                out.push(filter_record_batch(&batch, &data)?);
            }
            kept.push(out);
        }
        Ok(kept)
    }

    /// The watermark `watermarks` (each upstream task's latest) give at
    /// `now_ms`: their minimum once every upstream task not idle has sent
    /// one; `None` while one has not, or when all are idle.
    pub(crate) fn watermark(&self, watermarks: &BTreeMap<u32, i64>, now_ms: i64) -> Option<i64> {
        let idle = |task: u32| {
            let Some(timeout) = self.aligned.idle_timeout else {
                return false;
            };
            let last = self.heard.get(&task).copied().or(self.started);
            let timeout = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
            last.is_some_and(|at| now_ms.saturating_sub(at) >= timeout)
        };
        let mut least: Option<i64> = None;
        for task in (0..self.aligned.tasks).filter(|t| !idle(*t)) {
            let mark = *watermarks.get(&task)?;
            least = Some(least.map_or(mark, |l| l.min(mark)));
        }
        least
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::DataType;

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("c0", DataType::Int64, false),
            Field::new(FROM, DataType::Int32, true),
            Field::new(WATERMARK, DataType::Int64, true),
            Field::new(TO, DataType::Int32, true),
        ])
    }

    /// Data rows `values`, then `from`'s watermark row.
    fn read(values: &[i64], from: u32, watermark: i64) -> Partitions {
        let s = Arc::new(nullable(&schema()));
        let n = values.len();
        let data = RecordBatch::try_new(
            Arc::clone(&s),
            vec![
                Arc::new(Int64Array::from(values.to_vec())),
                new_null_array(&DataType::Int32, n),
                new_null_array(&DataType::Int64, n),
                new_null_array(&DataType::Int32, n),
            ],
        )
        .unwrap();
        let marks = rows(&schema(), from, 1, watermark).unwrap();
        vec![vec![data, marks]]
    }

    fn aligned(tasks: u32, idle_ms: Option<u64>) -> Upstream {
        let idle_timeout = idle_ms.map(Duration::from_millis);
        Upstream::new(
            &nullable(&schema()),
            Aligned {
                tasks,
                idle_timeout,
            },
        )
        .unwrap()
    }

    #[test]
    fn the_watermark_waits_for_every_upstream_task_then_is_their_minimum() {
        let mut up = aligned(2, None);
        let mut marks = BTreeMap::new();
        let kept = up.take(read(&[1, 2], 0, 500), &mut marks, 0).unwrap();
        // The watermark row is taken out; the data rows stay.
        assert_eq!(kept[0].iter().map(|b| b.num_rows()).sum::<usize>(), 2);
        assert_eq!(up.watermark(&marks, 0), None, "task 1 has sent nothing");
        up.take(read(&[3], 1, 300), &mut marks, 10).unwrap();
        assert_eq!(up.watermark(&marks, 10), Some(300));
        // A task's watermark never goes back.
        up.take(read(&[], 1, 200), &mut marks, 20).unwrap();
        up.take(read(&[], 1, 900), &mut marks, 30).unwrap();
        assert_eq!(up.watermark(&marks, 30), Some(500));
        // Without an idle timeout, a silent task holds it for ever.
        assert_eq!(up.watermark(&marks, 1_000_000), Some(500));
    }

    #[test]
    fn an_idle_upstream_task_is_left_out_until_it_sends_again() {
        let mut up = aligned(3, Some(1_000));
        let mut marks = BTreeMap::new();
        up.take(read(&[], 0, 500), &mut marks, 0).unwrap();
        up.take(read(&[], 1, 800), &mut marks, 0).unwrap();
        // Task 2 never sent: it holds the watermark until the timeout.
        assert_eq!(up.watermark(&marks, 999), None);
        assert_eq!(up.watermark(&marks, 1_000), None, "0 and 1 idle too");
        up.take(read(&[], 0, 600), &mut marks, 900).unwrap();
        up.take(read(&[], 1, 900), &mut marks, 900).unwrap();
        assert_eq!(up.watermark(&marks, 1_500), Some(600));
        // Task 2 sends: it counts again.
        up.take(read(&[], 2, 100), &mut marks, 1_600).unwrap();
        assert_eq!(up.watermark(&marks, 1_600), Some(100));
    }
}
