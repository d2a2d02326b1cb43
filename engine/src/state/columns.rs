//! Column-level writes of the state store: an upsert's rows written into
//! the stored columns ([`Placement`]: in their own buffers for fixed-width
//! columns, so an epoch costs what changed, not the whole state), and view
//! arrays compacted ([`compact_views`]) so that stored rows do not keep
//! their epoch's input alive.

use std::sync::Arc;

use datafusion::arrow::array::{
    downcast_primitive, Array, ArrayRef, ArrowPrimitiveType, AsArray, GenericByteViewArray,
    RecordBatch,
};
use datafusion::arrow::compute::interleave;
use datafusion::arrow::datatypes::{ByteViewType, DataType};

use crate::error::Result;

/// `batch` with each string or binary view column that holds buffers of
/// much more than its values copied into buffers of its own. A view array
/// made by `filter`, `concat` or `interleave` still points into the
/// buffers of the arrays it came from, so state that keeps some rows of
/// every epoch (a join's buffers; stored groups with long string keys or
/// values) would otherwise hold every epoch's input in memory, and write it
/// to every snapshot.
pub(crate) fn compact_views(batch: RecordBatch) -> Result<RecordBatch> {
    compact(batch, 2)
}

/// `batch` with each view column whose buffers hold more than its values
/// (and 4 KB) copied into buffers of its own, before it is written to a
/// file: the IPC writer writes a view array's buffers whole, so each slice
/// of a state file would otherwise carry every buffer its rows point
/// into (a join's 4 slices of 230 000 bids wrote 142 MB for 50 MB).
pub(crate) fn compact_views_to_write(batch: RecordBatch) -> Result<RecordBatch> {
    compact(batch, 1)
}

/// `batch` with the view columns whose buffers hold more than `factor`
/// times their values' bytes copied.
fn compact(batch: RecordBatch, factor: usize) -> Result<RecordBatch> {
    let pins = |c: &ArrayRef| pins_unused_bytes(c, factor);
    if !batch.columns().iter().any(pins) {
        return Ok(batch);
    }
    let columns = batch
        .columns()
        .iter()
        .map(|c| -> ArrayRef {
            match c.data_type() {
                DataType::Utf8View if pins(c) => Arc::new(c.as_string_view().gc()),
                DataType::BinaryView if pins(c) => Arc::new(c.as_binary_view().gc()),
                _ => Arc::clone(c),
            }
        })
        .collect();
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// Whether `column` is a view array whose buffers hold more than `factor`
/// times the bytes its values use (plus a little).
fn pins_unused_bytes(column: &ArrayRef, factor: usize) -> bool {
    fn held_and_used<T: ByteViewType + ?Sized>(a: &GenericByteViewArray<T>) -> (usize, usize) {
        let held = a.data_buffers().iter().map(|b| b.len()).sum();
        // Values of up to 12 bytes live in the view itself.
        let used = a
            .views()
            .iter()
            .map(|v| *v as u32 as usize)
            .filter(|&len| len > 12)
            .sum();
        (held, used)
    }
    let (held, used) = match column.data_type() {
        DataType::Utf8View => held_and_used(column.as_string_view()),
        DataType::BinaryView => held_and_used(column.as_binary_view()),
        _ => return false,
    };
    held > factor * used + 4096
}

/// Where the rows of an upsert go: over stored rows, or after them.
/// Positions are `u32`, as in the state's index: an epoch over millions of
/// keys holds one pair per key.
#[derive(Default)]
pub(super) struct Placement {
    /// (stored position, row of the upsert).
    pub updates: Vec<(u32, u32)>,
    /// Rows of the upsert for new keys, in the order they are appended.
    pub appended: Vec<u32>,
}

impl Placement {
    /// `old` with the placed rows of `new` written over and after it.
    ///
    /// Fixed-width columns (every count, sum, min, max and the usual keys)
    /// are updated in their own buffers when nothing else holds them: the
    /// cost and the memory follow the rows that changed, not the whole
    /// state, which at 10M keys saves a full copy per epoch. Other columns,
    /// and buffers still shared (just restored, or handed out), are copied.
    pub(super) fn apply(&self, old: ArrayRef, new: &ArrayRef) -> Result<ArrayRef> {
        macro_rules! in_place {
            ($t:ty) => {
                self.apply_primitive::<$t>(old, new)
            };
        }
        let data_type = old.data_type().clone();
        downcast_primitive! {
            &data_type => (in_place),
            _ => self.apply_by_copy(old, new)
        }
    }

    fn apply_primitive<T: ArrowPrimitiveType>(
        &self,
        old: ArrayRef,
        new: &ArrayRef,
    ) -> Result<ArrayRef> {
        let typed = old.as_primitive::<T>().clone();
        // Drop the only other handle on the buffers, so they can be reused.
        drop(old);
        let new_typed = new.as_primitive::<T>();
        let mut builder = match typed.into_builder() {
            Ok(b) => b,
            Err(shared) => return self.apply_by_copy(Arc::new(shared), new),
        };
        let new_nulls = new_typed.nulls().filter(|n| n.null_count() > 0);
        if let Some(nulls) = new_nulls {
            // A stored row becoming null needs a validity buffer to write
            // into; without one, copy.
            if builder.validity_slice_mut().is_none()
                && self.updates.iter().any(|&(_, j)| nulls.is_null(j as usize))
            {
                let old: ArrayRef = Arc::new(builder.finish());
                return self.apply_by_copy(old, new);
            }
        }
        let (values, mut validity) = builder.slices_mut();
        for &(i, j) in &self.updates {
            let (i, j) = (i as usize, j as usize);
            values[i] = new_typed.value(j);
            if let Some(validity) = validity.as_deref_mut() {
                let valid = new_typed.is_valid(j);
                if valid {
                    validity[i / 8] |= 1 << (i % 8);
                } else {
                    validity[i / 8] &= !(1 << (i % 8));
                }
            }
        }
        for &j in &self.appended {
            let j = j as usize;
            if new_typed.is_valid(j) {
                builder.append_value(new_typed.value(j));
            } else {
                builder.append_null();
            }
        }
        Ok(Arc::new(builder.finish()))
    }

    fn apply_by_copy(&self, old: ArrayRef, new: &ArrayRef) -> Result<ArrayRef> {
        let mut from: Vec<(usize, usize)> = (0..old.len()).map(|i| (0, i)).collect();
        for &(i, j) in &self.updates {
            from[i as usize] = (1, j as usize);
        }
        from.extend(self.appended.iter().map(|&j| (1, j as usize)));
        Ok(interleave(&[old.as_ref(), new.as_ref()], &from)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use datafusion::arrow::array::{BooleanArray, Int64Array};
    use datafusion::arrow::compute::filter_record_batch;
    use datafusion::arrow::datatypes::{Field, Int64Type, Schema};

    use crate::state::KeyedState;

    fn nullable(keys: &[i64], values: &[Option<i64>]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(keys.to_vec())),
                Arc::new(Int64Array::from(values.to_vec())),
            ],
        )
        .unwrap()
    }

    #[test]
    fn fixed_width_columns_are_updated_in_their_own_buffers_unless_shared() {
        let b = nullable(&[1, 2, 3], &[Some(10), None, Some(30)]);
        let mut s = KeyedState::new(b.schema(), 1).unwrap();
        s.upsert(&[b]).unwrap();
        let buffer = |s: &KeyedState| s.all().unwrap().column(1).to_data().buffers()[0].as_ptr();
        let before = buffer(&s);
        s.upsert(&[nullable(&[3], &[Some(31)])]).unwrap();
        assert_eq!(buffer(&s), before, "an update copied the column");

        // Null to value, value to null, and a new key (which may move the
        // buffer as it grows).
        s.upsert(&[nullable(&[2, 1, 4], &[Some(20), None, Some(40)])])
            .unwrap();
        let got = s.lookup(&[nullable(&[1, 2, 3, 4], &[None; 4])]).unwrap();
        assert_eq!(
            got.column(1).as_primitive::<Int64Type>(),
            &Int64Array::from(vec![None, Some(20), Some(31), Some(40)])
        );
        let before = buffer(&s);
        s.upsert(&[nullable(&[4], &[Some(41)])]).unwrap();
        assert_eq!(buffer(&s), before, "an update copied the column");

        // A handed-out copy of the state is never changed under its holder.
        let held = s.all().unwrap();
        s.upsert(&[nullable(&[1], &[Some(11)])]).unwrap();
        assert_eq!(
            held.column(1).as_primitive::<Int64Type>(),
            &Int64Array::from(vec![None, Some(20), Some(31), Some(41)])
        );
        let got = s.lookup(&[nullable(&[1], &[None])]).unwrap();
        assert_eq!(
            got.column(1).as_primitive::<Int64Type>(),
            &Int64Array::from(vec![Some(11)])
        );
    }

    #[test]
    fn compacted_views_stop_pointing_into_the_batches_they_came_from() {
        use datafusion::arrow::array::StringViewArray;
        let long: Vec<String> = (0..1000).map(|i| format!("{i:0>64}")).collect();
        let strings = StringViewArray::from_iter_values(long.iter());
        let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(vec![
            datafusion::arrow::datatypes::Field::new("s", DataType::Utf8View, false),
        ]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(strings)]).unwrap();
        let one = filter_record_batch(
            &batch,
            &BooleanArray::from_iter((0..1000).map(|i| Some(i == 7))),
        )
        .unwrap();
        // The filtered row still holds the whole input's 64 KB.
        assert!(one.get_array_memory_size() > 60_000);
        let compact = compact_views(one.clone()).unwrap();
        assert_eq!(compact, one);
        assert!(compact.get_array_memory_size() < 1_000);
    }

    #[test]
    fn stored_long_string_keys_do_not_pin_the_batches_they_came_from() {
        use datafusion::arrow::array::StringViewArray;
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8View, false),
            Field::new("n", DataType::Int64, false),
        ]));
        let hot: Vec<String> = (0..1000).map(|i| format!("{i:0>40}")).collect();
        let mut state = KeyedState::new(Arc::clone(&schema), 1).unwrap();
        // Every epoch updates the same hot keys and adds one cold key that
        // never changes again: without compaction each cold key would keep
        // its whole batch's strings alive, one more batch per epoch.
        for epoch in 0..50usize {
            let mut keys = hot.clone();
            keys.push(format!("cold{epoch:0>40}"));
            let batch = RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(StringViewArray::from_iter_values(keys.iter())),
                    Arc::new(Int64Array::from(vec![epoch as i64; keys.len()])),
                ],
            )
            .unwrap();
            state.upsert(&[batch]).unwrap();
        }
        assert_eq!(state.num_rows(), 1050);
        let live = 1000 * 40 + 50 * 44;
        let held: usize = state
            .all()
            .unwrap()
            .column(0)
            .as_string_view()
            .data_buffers()
            .iter()
            .map(|b| b.len())
            .sum();
        assert!(
            held <= 2 * live + 4096,
            "{held} bytes held for {live} bytes of keys"
        );
    }
}
