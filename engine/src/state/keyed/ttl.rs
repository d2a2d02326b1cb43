//! State TTL: a key whose state no row has written for `state.ttl` is
//! dropped, with the meaning of Flink's `table.exec.state.ttl` (processing
//! time; the clock restarts when the key's state is created or written,
//! not when it is read; expired state is never seen).
//!
//! A store made [`expiring`](KeyedState::expiring) keeps one column more
//! than its operator's, last: the processing time, in milliseconds, of the
//! epoch that last wrote the row. The operator never sees it: rows going
//! in are stamped, rows coming out lose it. Being a column, it goes where
//! the row goes (the checkpoint's snapshots and deltas, local disk past
//! the memory limit), so a restored or faulted-in key keeps its age.
//!
//! The clock is the epoch's processing time, the `planned_at_ms` its
//! `offsets/N` records: an epoch that runs again after a failure expires
//! and stamps exactly what it did the first time, so a query with a TTL
//! stays exactly-once.
//!
//! [`expire`](KeyedState::expire), which an operator calls before its
//! epoch reads the store, drops every row older than the TTL, in memory
//! and on disk (read there only when the oldest stamp on disk has
//! expired), as removals in the epoch's delta. The operator emits nothing
//! for them: a key that comes back starts again, as in Flink.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::compute::kernels::cmp::lt;
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use datafusion::arrow::row::Row;
use datafusion::execution::SessionState;
use foldhash::HashMap;

use super::spill::LowestOf;
use super::{row_converter, KeyedState};
use crate::error::{Result, SluiceError};

/// A statement's state TTL and the processing time of the epoch it runs,
/// which its operators' stores read through the session's config (as they
/// read the [`StateBudget`](crate::state::StateBudget)).
#[derive(Debug)]
pub(crate) struct StateTtl {
    ttl_ms: i64,
    now_ms: AtomicI64,
}

impl StateTtl {
    /// A TTL of `ttl`, its clock at 0 until [`set_now`](Self::set_now).
    pub(crate) fn new(ttl: Duration) -> Arc<Self> {
        Arc::new(Self {
            ttl_ms: i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
            now_ms: AtomicI64::new(0),
        })
    }

    /// The statement's TTL, when its query sets one.
    pub(crate) fn of(ctx: &SessionState) -> Option<Arc<Self>> {
        ctx.config().get_extension::<Self>()
    }

    /// The epoch about to run was planned at `ms` (its processing time).
    pub(crate) fn set_now(&self, ms: i64) {
        self.now_ms.store(ms, Ordering::Release);
    }

    /// The processing time of the epoch running (ms).
    pub(crate) fn now(&self) -> i64 {
        self.now_ms.load(Ordering::Acquire)
    }

    /// Rows last written before this time have expired.
    pub(crate) fn expired_before(&self) -> i64 {
        self.now().saturating_sub(self.ttl_ms)
    }
}

/// The name of the stamp column; no operator's column is named so.
const STAMP: &str = "__sluice_written_ms";

impl KeyedState {
    /// This store with its keys expiring after `ttl` (none: as it is).
    /// Called on a new store, before [`within`](Self::within).
    pub(crate) fn expiring(mut self, ttl: Option<Arc<StateTtl>>) -> Result<Self> {
        let Some(ttl) = ttl else {
            return Ok(self);
        };
        let mut fields = self.schema.fields().to_vec();
        fields.push(Arc::new(Field::new(STAMP, DataType::Int64, false)));
        self.schema = Arc::new(Schema::new(fields));
        self.rows = RecordBatch::new_empty(Arc::clone(&self.schema));
        self.ttl = Some(ttl);
        Ok(self)
    }

    /// Drops the rows no epoch has written for the TTL, in memory and on
    /// disk, and returns them. Rows that share their first `together`
    /// columns (at most the key's) leave together, once none of them was
    /// written for the TTL: a Top-N's partition, a join key's rows on one
    /// side, whose rows are not all written when one changes. Such a store
    /// keeps its rows in memory. Nothing for a store without a TTL.
    pub(crate) fn expire(&mut self, together: usize) -> Result<RecordBatch> {
        let Some(ttl) = &self.ttl else {
            return Ok(RecordBatch::new_empty(self.outer_schema()?));
        };
        let before = ttl.expired_before();
        let stamp = self.schema.fields().len() - 1;
        let expired = move |rows: &RecordBatch| -> Result<BooleanArray> {
            Ok(lt(
                rows.column(stamp).as_primitive::<Int64Type>(),
                &Int64Array::new_scalar(before),
            )?)
        };
        if together < self.key_columns {
            if self.cold_rows() > 0 {
                return Err(SluiceError::Internal(
                    "a store whose rows expire together went to disk".into(),
                ));
            }
            return self.remove_where(|rows| {
                let stamps = rows.column(stamp).as_primitive::<Int64Type>();
                if together == 0 {
                    // One group: a Top-N without PARTITION BY.
                    let newest = datafusion::arrow::compute::max(stamps);
                    let all = newest.is_some_and(|at| at < before);
                    return Ok(BooleanArray::from(vec![all; rows.num_rows()]));
                }
                let groups = row_converter(
                    rows.schema().fields()[..together]
                        .iter()
                        .map(|f| f.data_type()),
                )?
                .convert_columns(&rows.columns()[..together])?;
                let mut newest: HashMap<Row<'_>, i64> = HashMap::default();
                for (i, group) in groups.iter().enumerate() {
                    let at = newest.entry(group).or_insert(i64::MIN);
                    *at = (*at).max(stamps.value(i));
                }
                Ok(groups
                    .iter()
                    .map(|group| Some(newest.get(&group).is_some_and(|&at| at < before)))
                    .collect())
            });
        }
        let in_memory = self.remove_where(expired)?;
        if self.cold_lowest().is_none_or(|low| low >= before) {
            return Ok(in_memory);
        }
        let on_disk = self.remove_cold_where(expired)?;
        Ok(concat_batches(&in_memory.schema(), [&in_memory, &on_disk])?)
    }

    /// For a store with a TTL, the least stamp of some rows, so that the
    /// disk can tell when its rows may have expired (`spill`).
    pub(super) fn lowest_stamp(&self) -> Option<LowestOf> {
        self.ttl.as_ref()?;
        let stamp = self.schema.fields().len() - 1;
        Some(Box::new(move |rows: &RecordBatch| {
            Ok(datafusion::arrow::compute::min(
                rows.column(stamp).as_primitive::<Int64Type>(),
            ))
        }))
    }

    /// The operator's schema: the store's, without the stamp.
    fn outer_schema(&self) -> Result<SchemaRef> {
        let columns: Vec<usize> = (0..self.outer_columns()).collect();
        Ok(Arc::new(self.schema.project(&columns)?))
    }

    /// The operator's columns: the store's, without the stamp.
    pub(super) fn outer_columns(&self) -> usize {
        self.schema.fields().len() - usize::from(self.ttl.is_some())
    }

    /// `rows` (the operator's columns) with the stamp of the epoch now
    /// running, for a store with a TTL.
    pub(super) fn stamped(&self, rows: RecordBatch) -> Result<RecordBatch> {
        let Some(ttl) = &self.ttl else {
            return Ok(rows);
        };
        let stamp: ArrayRef = Arc::new(Int64Array::from_value(ttl.now(), rows.num_rows()));
        let mut columns = rows.columns().to_vec();
        columns.push(stamp);
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }

    /// Stored `rows` as the operator sees them: without the stamp.
    pub(super) fn outer(&self, rows: RecordBatch) -> Result<RecordBatch> {
        if self.ttl.is_none() {
            return Ok(rows);
        }
        let columns: Vec<usize> = (0..self.outer_columns()).collect();
        Ok(rows.project(&columns)?)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

    use super::*;
    use crate::state::budget::StateBudget;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("n", DataType::Int64, false),
        ]))
    }

    fn rows(keys: &[&str], n: i64) -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(StringArray::from(keys.to_vec())),
                Arc::new(Int64Array::from(vec![n; keys.len()])),
            ],
        )
        .unwrap()
    }

    fn contents(s: &KeyedState, keys: &[&str]) -> BTreeMap<String, i64> {
        let found = s.lookup(&[rows(keys, 0)]).unwrap();
        assert_eq!(found.schema(), schema(), "the stamp never shows");
        let k = found.column(0).as_string::<i32>();
        let n = found.column(1).as_primitive::<Int64Type>();
        (0..found.num_rows())
            .map(|i| (k.value(i).to_string(), n.value(i)))
            .collect()
    }

    /// Keys written at 1 s and 5 s, the TTL 10 s: at 12 s the first are
    /// gone and the others stay; a key written again restarts its clock;
    /// the delta says which left, and a restore of the chain keeps each
    /// key's age, so it expires when it would have. The same past a
    /// memory limit, with the old keys on disk.
    #[test]
    fn keys_unwritten_for_the_ttl_leave_in_memory_on_disk_and_after_a_restore() {
        for limited in [false, true] {
            let ttl = StateTtl::new(Duration::from_secs(10));
            let budget = limited.then(|| StateBudget::for_process(1, None));
            let make = |ttl: &Arc<StateTtl>| {
                KeyedState::new(schema(), 1)
                    .unwrap()
                    .expiring(Some(Arc::clone(ttl)))
                    .unwrap()
                    .within(budget.clone())
                    .unwrap()
            };
            let mut s = make(&ttl);
            let mut chain = Vec::new();
            let mut epoch = |s: &mut KeyedState, now: i64, keys: &[&str], n: i64| {
                ttl.set_now(now);
                let gone = s.expire(1).unwrap().num_rows();
                s.fault_in(&[rows(keys, 0)]).unwrap();
                s.upsert(&[rows(keys, n)]).unwrap();
                chain.push(s.delta().unwrap());
                s.settle().unwrap();
                gone
            };
            assert_eq!(epoch(&mut s, 1_000, &["a", "b", "c"], 1), 0);
            assert_eq!(epoch(&mut s, 5_000, &["d", "e"], 2), 0);
            if limited {
                assert!(s.cold_rows() > 0, "the old keys went to disk");
            }
            // At 12 s: a, b, c (written at 1 s) expire; c comes back.
            assert_eq!(epoch(&mut s, 12_000, &["c"], 3), 3);
            let all = ["a", "b", "c", "d", "e"];
            s.fault_in(&[rows(&all, 0)]).unwrap();
            let expect: BTreeMap<String, i64> = [("c", 3), ("d", 2), ("e", 2)]
                .map(|(k, n)| (k.to_string(), n))
                .into();
            assert_eq!(contents(&s, &all), expect);
            assert_eq!(s.num_rows(), 3);

            // The chain's deltas rebuild it, ages and all: at 16 s d and e
            // (5 s) expire, c (12 s) stays.
            let mut restored = make(&ttl);
            for delta in &chain {
                restored.apply_delta(delta).unwrap();
            }
            restored.fault_in(&[rows(&all, 0)]).unwrap();
            assert_eq!(contents(&restored, &all), expect);
            ttl.set_now(16_000);
            assert_eq!(restored.expire(1).unwrap().num_rows(), 2);
            restored.fault_in(&[rows(&all, 0)]).unwrap();
            assert_eq!(contents(&restored, &all), [("c".to_string(), 3)].into());
        }
    }

    /// Rows sharing their first columns leave together, once none of them
    /// was written for the TTL; with none shared, all rows are one group.
    #[test]
    fn rows_expiring_together_leave_when_their_newest_has_expired() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("p", DataType::Int64, false),
            Field::new("rn", DataType::Int64, false),
        ]));
        let rows = |p: &[i64], rn: &[i64]| {
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(Int64Array::from(p.to_vec())),
                    Arc::new(Int64Array::from(rn.to_vec())),
                ],
            )
            .unwrap()
        };
        for together in [0, 1] {
            let ttl = StateTtl::new(Duration::from_secs(10));
            let mut s = KeyedState::new(Arc::clone(&schema), 2)
                .unwrap()
                .expiring(Some(Arc::clone(&ttl)))
                .unwrap();
            ttl.set_now(1_000);
            s.upsert(&[rows(&[1, 1, 2], &[1, 2, 1])]).unwrap();
            // Partition 1's second row is written again at 5 s.
            ttl.set_now(5_000);
            s.upsert(&[rows(&[1], &[2])]).unwrap();
            ttl.set_now(12_000);
            let gone = s.expire(together).unwrap();
            let left: Vec<i64> = gone.column(0).as_primitive::<Int64Type>().values().to_vec();
            match together {
                // One group, written at 5 s: nothing has expired.
                0 => assert!(left.is_empty(), "{left:?}"),
                // Partition 2 (1 s) leaves whole; partition 1 stays whole.
                _ => assert_eq!(left, vec![2]),
            }
            ttl.set_now(16_000);
            let gone = s.expire(together).unwrap().num_rows() + left.len();
            assert_eq!(gone, 3, "at 16 s every row has expired");
            assert_eq!(s.num_rows(), 0);
        }
    }

    #[test]
    fn a_store_without_a_ttl_expires_nothing_and_keeps_its_columns() {
        let mut s = KeyedState::new(schema(), 1)
            .unwrap()
            .expiring(None)
            .unwrap();
        s.upsert(&[rows(&["a"], 1)]).unwrap();
        assert_eq!(s.expire(1).unwrap().num_rows(), 0);
        assert_eq!(s.all().unwrap().schema(), schema());
    }
}
