//! The query's stateful operator, if it has one: the one interface the
//! epoch loop drives, whatever the operator is. A query with several
//! stateful operators (an aggregation over a join, a join of a windowed
//! aggregation with a stream, ...) runs them as one [`Operator::Pipeline`]:
//! innermost first, each handing what it emits to the one above it
//! through the scan that replaced it in that one's plan (see the planner's
//! `split_stages`).

use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::SessionState;

use crate::aggregate::AggregateOperator;
use crate::error::{Result, SluiceError};
use crate::join::JoinOperator;
use crate::planner::{IncrementalPlan, StageConfig};
use crate::sink::EpochOutput;
use crate::table::EpochBatches;

/// A committed chain of state files, read one at a time as it is applied
/// (a snapshot, then the deltas after it), so that restoring holds one
/// file's bytes at a time.
pub(crate) type StateChain<'a> = &'a mut (dyn Iterator<Item = Result<Vec<u8>>> + Send);

/// What an operator stages for one epoch's commit.
#[derive(Debug)]
pub(crate) enum Staged {
    /// No state exists yet.
    Nothing,
    /// Nothing changed since the last stage: the committed chain stands.
    Unchanged,
    /// The changes since the last stage, to append to the chain.
    Delta(Vec<u8>),
    /// The whole state is due: a new chain starts with what
    /// [`Operator::write_snapshot`] writes.
    Snapshot,
}

/// A running stateful operator.
#[derive(Debug)]
pub(crate) enum Operator {
    /// GROUP BY, windowed aggregation, deduplication.
    Aggregate(Box<AggregateOperator>),
    /// Stream–stream join.
    Join(Box<JoinOperator>),
    /// Several operators, innermost first; the last one's output is the
    /// query's. Its state is every operator's: a snapshot of each, then
    /// per epoch what each one stages (see [`Operator::stage`]).
    Pipeline(Vec<PipelineStage>),
}

/// One operator of an [`Operator::Pipeline`].
#[derive(Debug)]
pub(crate) struct PipelineStage {
    pub operator: Operator,
    /// Where its rows go for the operator above; `None` for the last.
    pub link: Option<Arc<EpochBatches>>,
    /// Whether the committed chain holds a snapshot of this operator, which
    /// its deltas build on.
    based: bool,
}

/// How a pipeline delta carries one operator's part (see
/// [`Operator::stage`]).
const PART_UNCHANGED: u8 = 0;
const PART_DELTA: u8 = 1;
const PART_SNAPSHOT: u8 = 2;

impl Operator {
    /// The operator of a planned query: its stages and the outermost one.
    pub(crate) fn for_plan(plan: &mut IncrementalPlan) -> Result<Option<Self>> {
        let root = match (plan.aggregate.take(), plan.join.take()) {
            (Some(a), _) => Self::Aggregate(Box::new(AggregateOperator::new(a))),
            (None, Some(j)) => Self::Join(Box::new(JoinOperator::new(j)?)),
            (None, None) => return Ok(None),
        };
        if plan.stages.is_empty() {
            return Ok(Some(root));
        }
        let mut stages = Vec::with_capacity(plan.stages.len() + 1);
        for stage in plan.stages.drain(..) {
            let operator = match stage.config {
                StageConfig::Aggregate(a) => Self::Aggregate(Box::new(AggregateOperator::new(*a))),
                StageConfig::Join(j) => Self::Join(Box::new(JoinOperator::new(*j)?)),
            };
            stages.push(PipelineStage {
                operator,
                link: Some(stage.link),
                based: false,
            });
        }
        stages.push(PipelineStage {
            operator: root,
            link: None,
            based: false,
        });
        Ok(Some(Self::Pipeline(stages)))
    }
}

impl Operator {
    /// The operator's folder under `state/` in the checkpoint.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Aggregate(_) => "aggregate",
            Self::Join(_) => "join",
            Self::Pipeline(_) => "pipeline",
        }
    }

    /// Whether rows behind the watermark must be dropped before it sees
    /// them: its state is bounded by event time.
    pub(crate) fn drops_late(&self) -> bool {
        match self {
            Self::Aggregate(a) => a.is_windowed(),
            Self::Join(j) => j.is_bounded(),
            Self::Pipeline(stages) => stages.iter().any(|s| s.operator.drops_late()),
        }
    }

    /// Runs one epoch over the input set in the query's tables; returns
    /// what to emit. `watermark` is the query's, after this input.
    pub(crate) async fn run_epoch(
        &mut self,
        session: &SessionState,
        watermark: Option<i64>,
    ) -> Result<EpochOutput> {
        match self {
            Self::Aggregate(a) => a.run_epoch(session, watermark).await,
            Self::Join(j) => Ok(EpochOutput {
                rows: j.run_epoch(session, watermark).await?,
                retracted: None,
            }),
            Self::Pipeline(stages) => {
                let out = run_pipeline(stages, session, watermark).await;
                for link in stages.iter().filter_map(|s| s.link.as_ref()) {
                    link.set_input(Vec::new());
                }
                out
            }
        }
    }

    /// Stages the state for this epoch's commit: all of it when `full`,
    /// else (if the operator keeps deltas) what changed since the last
    /// stage.
    ///
    /// A pipeline's delta is a part per operator: a tag byte (unchanged,
    /// delta, or snapshot), the part's length (8 bytes, little endian) and
    /// its bytes. So an aggregation or a join inside a pipeline (Nexmark
    /// q4's maximum per auction) writes only its changes, as it does alone.
    pub(crate) fn stage(&mut self, full: bool) -> Result<Staged> {
        match self {
            Self::Aggregate(a) => a.stage(full),
            Self::Join(_) | Self::Pipeline(_) if full => Ok(Staged::Snapshot),
            Self::Join(j) if j.delta_outgrows_state() => Ok(Staged::Snapshot),
            Self::Join(j) if j.has_changes() => Ok(Staged::Delta(j.delta()?)),
            Self::Join(_) => Ok(Staged::Unchanged),
            Self::Pipeline(stages) => {
                let mut delta = Vec::new();
                let mut changed = false;
                for s in stages.iter_mut() {
                    let (tag, bytes) = match s.operator.stage(false)? {
                        Staged::Nothing | Staged::Unchanged => (PART_UNCHANGED, Vec::new()),
                        Staged::Delta(bytes) if s.based => (PART_DELTA, bytes),
                        // A delta needs the snapshot it builds on.
                        Staged::Delta(_) | Staged::Snapshot => {
                            let mut bytes = Vec::new();
                            s.operator.write_snapshot(&mut bytes)?;
                            s.based = true;
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
        }
    }

    /// Writes the whole state into `w` (streamed: a large state is never
    /// copied whole into memory first).
    pub(crate) fn write_snapshot(&mut self, w: &mut dyn std::io::Write) -> Result<()> {
        match self {
            Self::Aggregate(a) => a.write_snapshot(w),
            Self::Join(j) => w
                .write_all(&j.snapshot()?)
                .map_err(|e| SluiceError::io("writing the join's state", e)),
            // Each stage's snapshot, as one part each (see `parts`).
            Self::Pipeline(stages) => {
                for s in stages.iter_mut() {
                    let mut bytes = Vec::new();
                    s.operator.write_snapshot(&mut bytes)?;
                    s.based = !bytes.is_empty();
                    write_part(w, None, &bytes)
                        .map_err(|e| SluiceError::io("writing the pipeline's state", e))?;
                }
                Ok(())
            }
        }
    }

    /// Replaces the state with a committed chain: a snapshot, then the
    /// deltas after it, in order (recovery); an empty chain empties it.
    pub(crate) async fn restore(
        &mut self,
        session: &SessionState,
        chain: StateChain<'_>,
    ) -> Result<()> {
        match self {
            Self::Aggregate(a) => a.restore(session, chain).await,
            Self::Join(j) => {
                match chain.next() {
                    None => j.clear(),
                    Some(snapshot) => j.restore(&snapshot?)?,
                }
                for delta in chain {
                    j.apply_delta(&delta?)?;
                }
                Ok(())
            }
            Self::Pipeline(stages) => {
                // Each operator's own chain: its part of the snapshot, then
                // its deltas; a part that is a snapshot starts it anew. An
                // empty snapshot part: that operator had no state yet.
                let mut chains: Vec<Vec<Vec<u8>>> = vec![Vec::new(); stages.len()];
                if let Some(snapshot) = chain.next() {
                    for (c, part) in chains.iter_mut().zip(parts(&snapshot?, stages.len())?) {
                        if !part.is_empty() {
                            c.push(part.to_vec());
                        }
                    }
                }
                for delta in chain {
                    let delta = delta?;
                    for (c, (tag, part)) in
                        chains.iter_mut().zip(tagged_parts(&delta, stages.len())?)
                    {
                        match tag {
                            PART_DELTA if c.is_empty() => {
                                return Err(SluiceError::Internal(
                                    "a pipeline delta changes an operator that has no snapshot"
                                        .into(),
                                ))
                            }
                            PART_DELTA => c.push(part.to_vec()),
                            PART_SNAPSHOT => *c = vec![part.to_vec()],
                            _ => {}
                        }
                    }
                }
                for (s, c) in stages.iter_mut().zip(chains) {
                    s.based = !c.is_empty();
                    let mut chain = c.into_iter().map(Ok);
                    Box::pin(s.operator.restore(session, &mut chain)).await?;
                }
                Ok(())
            }
        }
    }

    /// Rows and bytes held in state.
    pub(crate) fn state_size(&self) -> (u64, u64) {
        match self {
            Self::Aggregate(a) => a.state_size(),
            Self::Join(j) => j.state_size(),
            Self::Pipeline(stages) => stages
                .iter()
                .map(|s| s.operator.state_size())
                .fold((0, 0), |(r, b), (sr, sb)| (r + sr, b + sb)),
        }
    }
}

/// Runs a pipeline's stages in order, each one's rows handed to the next.
async fn run_pipeline(
    stages: &mut [PipelineStage],
    session: &SessionState,
    watermark: Option<i64>,
) -> Result<EpochOutput> {
    let mut last = EpochOutput::default();
    for stage in stages.iter_mut() {
        let out = Box::pin(stage.operator.run_epoch(session, watermark)).await?;
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
                link.set_input(vec![rows]);
            }
            None => last = out,
        }
    }
    Ok(last)
}

/// A pipeline snapshot's `n` parts: each a length (8 bytes, little
/// endian), then that many bytes.
fn parts(bytes: &[u8], n: usize) -> Result<Vec<&[u8]>> {
    Ok(split_parts(bytes, n, false, "snapshot")?
        .into_iter()
        .map(|(_, part)| part)
        .collect())
}

/// A pipeline delta's `n` parts, each with its tag (see [`Operator::stage`]).
fn tagged_parts(bytes: &[u8], n: usize) -> Result<Vec<(u8, &[u8])>> {
    let parts = split_parts(bytes, n, true, "delta")?;
    if let Some((tag, _)) = parts.iter().find(|(tag, _)| *tag > PART_SNAPSHOT) {
        return Err(SluiceError::Internal(format!(
            "the pipeline's state delta has a part of unknown kind {tag}"
        )));
    }
    Ok(parts)
}

/// Writes one part of a pipeline's state file, as [`split_parts`] reads
/// it: the tag byte if any, the length (8 bytes, little endian), the bytes.
fn write_part(w: &mut dyn std::io::Write, tag: Option<u8>, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(tag) = tag {
        w.write_all(&[tag])?;
    }
    w.write_all(&(bytes.len() as u64).to_le_bytes())?;
    w.write_all(bytes)
}

/// `n` parts of a pipeline's state file (`what`): each a tag byte if
/// `tagged`, a length (8 bytes, little endian), then that many bytes.
fn split_parts<'a>(
    mut bytes: &'a [u8],
    n: usize,
    tagged: bool,
    what: &str,
) -> Result<Vec<(u8, &'a [u8])>> {
    let damaged = || SluiceError::Internal(format!("the pipeline's state {what} is truncated"));
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut tag = 0;
        if tagged {
            let (&t, rest) = bytes.split_first().ok_or_else(damaged)?;
            (tag, bytes) = (t, rest);
        }
        let (len, rest) = bytes.split_first_chunk::<8>().ok_or_else(damaged)?;
        let len = usize::try_from(u64::from_le_bytes(*len)).map_err(|_| damaged())?;
        if rest.len() < len {
            return Err(damaged());
        }
        let (part, rest) = rest.split_at(len);
        out.push((tag, part));
        bytes = rest;
    }
    if !bytes.is_empty() {
        return Err(SluiceError::Internal(format!(
            "the pipeline's state {what} has more parts than the query has operators"
        )));
    }
    Ok(out)
}
