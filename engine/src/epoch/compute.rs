//! An epoch's compute and stage phases, statement by statement: each
//! admits its input (watermarks move, late rows are dropped), computes its
//! output through its plan and operators, and stages its operators' state
//! durably, so that the commit can name the files.

use super::read::EpochRead;
use super::EpochLoop;
use crate::error::Result;
use crate::sink::EpochOutput;
use crate::state::StateSize;
use crate::table::EpochInput;

/// What the stage phase wrote: each statement's state files (the chain
/// the commit names), and the state's size.
pub(super) struct Staged {
    pub(super) chains: Vec<Vec<String>>,
    pub(super) size: StateSize,
}

impl EpochLoop {
    /// Each statement admits its share of `read`'s input: its watermarks
    /// move, and late rows are dropped (counted in `read`). Returns the
    /// admitted inputs. `planned_at_ms` is the epoch's processing time.
    pub(super) fn admit(
        &mut self,
        read: &mut EpochRead,
        planned_at_ms: i64,
    ) -> Result<Vec<Vec<EpochInput>>> {
        let inputs = std::mem::take(&mut read.inputs);
        let mut admitted = Vec::with_capacity(self.statements.len());
        for (statement, input) in self.statements.iter_mut().zip(inputs) {
            let (input, late) = statement.admit(input, planned_at_ms)?;
            read.late_rows += late;
            admitted.push(input);
        }
        Ok(admitted)
    }

    /// Each statement's output of epoch `epoch` over its `admitted` input,
    /// then the late rows bound for a sink (see [`EpochLoop::late`]).
    /// With a sink that sends ahead, appended rows are written while the
    /// rest of the epoch is still read and computed.
    pub(super) async fn compute(
        &mut self,
        epoch: u64,
        admitted: Vec<Vec<EpochInput>>,
    ) -> Result<Vec<EpochOutput>> {
        let mut outputs = Vec::with_capacity(self.statements.len());
        let sends_ahead =
            self.sink.sends_ahead() && self.pipelining.applies(self.sink.pipelines_by_default());
        let sink = sends_ahead.then_some(self.sink.as_ref());
        for (index, (statement, input)) in self.statements.iter_mut().zip(admitted).enumerate() {
            let ahead = sink.map(|sink| (sink, epoch, index));
            outputs.push(statement.compute(input, ahead).await?);
        }
        // The late rows go out with the epoch that dropped them.
        for &(statement, input) in &self.late {
            outputs.push(EpochOutput {
                rows: self.statements[statement].take_late(input),
                retracted: None,
            });
        }
        Ok(outputs)
    }

    /// Stages every statement's state of epoch `epoch` durably, before the
    /// commit, so the commit can name it (docs/architecture.md §2).
    pub(super) fn stage(&mut self, epoch: u64) -> Result<Staged> {
        let mut staged = Staged {
            chains: Vec::with_capacity(self.statements.len()),
            size: StateSize::default(),
        };
        for statement in &mut self.statements {
            let (files, size) = statement.stage(
                self.checkpoint.dir(),
                epoch,
                &self.shared.run_id,
                self.snapshots,
            )?;
            staged.chains.push(files);
            staged.size = staged.size + size;
        }
        Ok(staged)
    }
}
