//! Several stateful operators in one query (an aggregation over a join, a
//! join of a windowed aggregation with a stream, ...), run as one
//! operator: innermost first, each handing what it emits to the one above
//! it through the scan that replaced it in that one's plan (see the
//! planner's `split`).
//!
//! Per epoch the innermost operator processes the epoch's input; then each
//! in turn advances to the watermark, and what it emits is put in scope for
//! the operators above it (the next one's [`process`](Operator::process)
//! and any after it that read it too) until the epoch's last operator is
//! done. The last one's output is the query's.
//!
//! Its state is every operator's: a snapshot holds a part per operator
//! (each its snapshot), and each epoch's delta a tagged part per operator —
//! unchanged, its delta, or its snapshot (a delta needs the snapshot it
//! builds on) — so an aggregation or a join inside a pipeline (Nexmark
//! q4's maximum per auction) writes only its changes, as it does alone.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::SessionState;

use super::Operator;
use crate::error::{Result, SluiceError};
use crate::sink::EpochOutput;
use crate::state::chain::{ChainReader, Staged};
use crate::state::codec::{split_parts, write_part, PART_DELTA, PART_SNAPSHOT, PART_UNCHANGED};
use crate::table::EpochBatches;

/// Several operators, innermost first; the last one's output is the
/// query's.
#[derive(Debug)]
pub(crate) struct Pipeline {
    stages: Vec<PipelineStage>,
}

/// One operator of a [`Pipeline`].
#[derive(Debug)]
pub(crate) struct PipelineStage {
    operator: Box<dyn Operator>,
    /// Where its rows go for the operator above; `None` for the last.
    link: Option<Arc<EpochBatches>>,
    /// Whether the committed chain holds a snapshot of this operator, which
    /// its deltas build on.
    based: bool,
    /// Whether the state staged for the epoch being committed gives it one
    /// (`Some(true)`), none (`Some(false)`: it had no state), or leaves it
    /// as it was (`None`).
    staged_base: Option<bool>,
}

impl PipelineStage {
    /// `operator`, whose rows go to `link` (`None` for the last).
    pub(crate) fn new(operator: Box<dyn Operator>, link: Option<Arc<EpochBatches>>) -> Self {
        Self {
            operator,
            link,
            based: false,
            staged_base: None,
        }
    }
}

impl Pipeline {
    /// A pipeline of `stages`, innermost first.
    pub(crate) fn new(stages: Vec<PipelineStage>) -> Self {
        Self { stages }
    }
}

#[async_trait]
impl Operator for Pipeline {
    fn name(&self) -> &'static str {
        "pipeline"
    }

    fn drops_late(&self) -> bool {
        self.stages.iter().any(|s| s.operator.drops_late())
    }

    fn judge_by(&mut self, watermark: Option<i64>) {
        for s in self.stages.iter_mut() {
            s.operator.judge_by(watermark);
        }
    }

    async fn process(&mut self, ctx: &SessionState, watermark: Option<i64>) -> Result<EpochOutput> {
        // What each operator emitted stays in scope until the last one is
        // done: the operator it feeds need not be the next one (Nexmark q5's
        // join reads two aggregations of the pipeline).
        let mut emitted = Vec::new();
        let mut last = EpochOutput::default();
        for stage in self.stages.iter_mut() {
            let out = stage.operator.process(ctx, watermark).await?;
            match &stage.link {
                Some(link) => {
                    // Same columns; DataFusion's output may differ in field
                    // metadata or nullability from the scan's schema.
                    let schema = link.schema_ref();
                    let rows = out
                        .rows
                        .iter()
                        .map(|b| RecordBatch::try_new(Arc::clone(&schema), b.columns().to_vec()))
                        .collect::<std::result::Result<Vec<_>, _>>()?;
                    emitted.push(link.with_input(vec![rows]));
                }
                None => last = out,
            }
        }
        Ok(last)
    }

    fn stage(&mut self, snapshot_due: bool) -> Result<Staged> {
        if snapshot_due {
            return Ok(Staged::Snapshot);
        }
        let mut delta = Vec::new();
        let mut changed = false;
        for s in self.stages.iter_mut() {
            let (tag, bytes) = match s.operator.stage(false)? {
                Staged::Nothing | Staged::Unchanged => (PART_UNCHANGED, Vec::new()),
                Staged::Delta(bytes) | Staged::Sliced(bytes, _) if s.based => (PART_DELTA, bytes),
                // A delta needs the snapshot it builds on.
                Staged::Delta(_) | Staged::Sliced(..) | Staged::Snapshot => {
                    let mut bytes = Vec::new();
                    s.operator.write_snapshot(&mut bytes)?;
                    s.staged_base = Some(true);
                    (PART_SNAPSHOT, bytes)
                }
            };
            changed |= tag != PART_UNCHANGED;
            write_part(&mut delta, Some(tag), &bytes)
                .map_err(|e| SluiceError::io("writing the pipeline's state", e))?;
        }
        Ok(if changed {
            Staged::Delta(delta)
        } else {
            Staged::Unchanged
        })
    }

    /// Each stage's snapshot, as one untagged part each.
    fn write_snapshot(&mut self, w: &mut dyn std::io::Write) -> Result<()> {
        for s in self.stages.iter_mut() {
            let mut bytes = Vec::new();
            s.operator.write_snapshot(&mut bytes)?;
            s.staged_base = Some(!bytes.is_empty());
            write_part(w, None, &bytes)
                .map_err(|e| SluiceError::io("writing the pipeline's state", e))?;
        }
        Ok(())
    }

    async fn restore(&mut self, ctx: &SessionState, chain: ChainReader<'_>) -> Result<()> {
        // Each operator's own chain: its part of the snapshot, then its
        // deltas; a part that is a snapshot starts it anew. An empty
        // snapshot part: that operator had no state yet.
        let n = self.stages.len();
        let mut chains: Vec<Vec<Vec<u8>>> = vec![Vec::new(); n];
        if let Some(snapshot) = chain.next() {
            for (c, (_, part)) in chains
                .iter_mut()
                .zip(split_parts(&snapshot?, n, false, "snapshot")?)
            {
                if !part.is_empty() {
                    c.push(part.to_vec());
                }
            }
        }
        for delta in chain {
            let delta = delta?;
            for (c, (tag, part)) in chains
                .iter_mut()
                .zip(split_parts(&delta, n, true, "delta")?)
            {
                match tag {
                    PART_DELTA if c.is_empty() => {
                        return Err(SluiceError::Internal(
                            "a pipeline delta changes an operator that has no snapshot".into(),
                        ))
                    }
                    PART_DELTA => c.push(part.to_vec()),
                    PART_SNAPSHOT => *c = vec![part.to_vec()],
                    _ => {}
                }
            }
        }
        for (s, c) in self.stages.iter_mut().zip(chains) {
            s.based = !c.is_empty();
            s.staged_base = None;
            let mut chain = c.into_iter().map(Ok);
            s.operator.restore(ctx, &mut chain).await?;
        }
        Ok(())
    }

    fn after_commit(&mut self) {
        for s in self.stages.iter_mut() {
            if let Some(based) = s.staged_base.take() {
                s.based = based;
            }
            s.operator.after_commit();
        }
    }

    fn state_size(&self) -> crate::state::StateSize {
        self.stages
            .iter()
            .map(|s| s.operator.state_size())
            .fold(Default::default(), |total, size| total + size)
    }
}
