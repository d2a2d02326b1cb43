//! State kept as two buffers of rows and written whole every epoch, a
//! snapshot each time (`over`: pending rows and history; `temporal_join`:
//! pending rows and versions): staging, writing, restoring and sizing it.

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;

use crate::error::{Result, SluiceError};
use crate::state::chain::{ChainReader, Staged};
use crate::state::codec::{ipc_bytes, read_ipc, split_two_parts, two_parts};

/// A buffer of rows, `None` before the first epoch.
type Buffer = Option<RecordBatch>;

/// What the epoch stages: a snapshot once there is any state.
pub(crate) fn stage(buffers: [&Buffer; 2]) -> Staged {
    match buffers.iter().all(|b| b.is_none()) {
        true => Staged::Nothing,
        false => Staged::Snapshot,
    }
}

/// Writes both buffers (each of its schema; empty before the first
/// epoch) as one snapshot; `what` names the state in an error.
pub(crate) fn write(
    w: &mut dyn std::io::Write,
    buffers: [(&Buffer, SchemaRef); 2],
    what: &str,
) -> Result<()> {
    let part = |(b, schema): &(&Buffer, SchemaRef)| match b {
        Some(b) => ipc_bytes(b),
        None => ipc_bytes(&RecordBatch::new_empty(schema.clone())),
    };
    let [first, second] = &buffers;
    w.write_all(&two_parts(&part(first)?, &part(second)?))
        .map_err(|e| SluiceError::io(format!("writing {what}"), e))
}

/// The buffers of the committed `chain`, in the `schemas` they were
/// written with: its last snapshot (each epoch writes one), or `None` for
/// an empty chain.
pub(crate) fn restore(
    chain: ChainReader<'_>,
    schemas: [&SchemaRef; 2],
    what: &str,
) -> Result<Option<(RecordBatch, RecordBatch)>> {
    let mut last = None;
    for file in chain {
        last = Some(file?);
    }
    let Some(bytes) = last else {
        return Ok(None);
    };
    let (first, second) = split_two_parts(&bytes, what)?;
    Ok(Some((
        read_ipc(first, schemas[0])?,
        read_ipc(second, schemas[1])?,
    )))
}

/// Rows and bytes the buffers hold.
pub(crate) fn size(buffers: [&Buffer; 2]) -> crate::state::StateSize {
    buffers
        .into_iter()
        .flatten()
        .fold(Default::default(), |total, b| {
            total
                + crate::state::StateSize::in_memory(
                    b.num_rows() as u64,
                    b.get_array_memory_size() as u64,
                )
        })
}
