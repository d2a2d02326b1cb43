//! Several sinks of one statement set behind one [`Sink`].
//!
//! Each part is a sink made for some of the set's statements (one
//! connector's [`sink_set`](crate::Connector::sink_set)) and gets their
//! outputs. At most one part may keep its own commit record (the
//! transactional Kafka sink): it decides which epochs are committed, so it
//! is written last, after the others have their output durable; the others
//! are at-least-once, as they would be alone.

use async_trait::async_trait;
use std::sync::Arc;

use super::{CommittedEpoch, EpochOutput, Sink};
use crate::checkpoint::EpochCommit;
use crate::error::{Result, SluiceError};
use crate::source::Handover;

/// A sink made of parts, each writing the outputs of the statements at its
/// indices. Connectors build one through [`FanOut::combine`] in their
/// [`sink_set`](crate::Connector::sink_set).
#[derive(Debug)]
pub struct FanOut {
    parts: Vec<(Arc<dyn Sink>, Vec<usize>)>,
}

impl FanOut {
    /// `parts`: each sink with the indices of the statements it writes.
    /// Refused when more than one part keeps its own commit record: no
    /// single commit could then decide the epoch.
    pub fn new(parts: Vec<(Arc<dyn Sink>, Vec<usize>)>) -> Result<Self> {
        let recording: Vec<String> = parts
            .iter()
            .filter(|(s, _)| s.records_commits())
            .map(|(s, _)| s.describe())
            .collect();
        if recording.len() > 1 {
            return Err(SluiceError::config(format!(
                "{} each keep their own record of committed epochs, so one statement set cannot \
                 commit them atomically; write them from separate queries, or (Kafka) give them \
                 the same 'bootstrap.servers' and options so they share one transaction",
                recording.join(" and ")
            )));
        }
        Ok(Self { parts })
    }

    /// One sink for `statements` statements out of `parts` (each a sink
    /// with the indices of the statements it writes): the part itself when
    /// one covers them all in order, else a [`FanOut`] over them.
    pub fn combine(
        mut parts: Vec<(Arc<dyn Sink>, Vec<usize>)>,
        statements: usize,
    ) -> Result<Arc<dyn Sink>> {
        let whole = parts.len() == 1 && parts[0].1.iter().copied().eq(0..statements);
        match parts.pop() {
            Some((sink, _)) if whole => Ok(sink),
            Some(last) => {
                parts.push(last);
                Ok(Arc::new(Self::new(parts)?))
            }
            None => Err(SluiceError::Internal(
                "a statement set without sinks".into(),
            )),
        }
    }

    /// The part taking what sources hand the sink (dead letters, group
    /// offsets): the one whose commit decides the epoch when it accepts
    /// them (so they are in the epoch's transaction), else the first that
    /// accepts them.
    fn source_commits_part(&self) -> Option<usize> {
        self.parts
            .iter()
            .position(|(s, _)| s.records_commits() && s.accepts_source_commits())
            .or_else(|| {
                self.parts
                    .iter()
                    .position(|(s, _)| s.accepts_source_commits())
            })
    }
}

#[async_trait]
impl Sink for FanOut {
    async fn open(&self) -> Result<()> {
        for (sink, _) in &self.parts {
            sink.open().await?;
        }
        Ok(())
    }

    async fn committed_epoch(&self) -> Result<CommittedEpoch> {
        for (sink, _) in &self.parts {
            if sink.records_commits() {
                return sink.committed_epoch().await;
            }
        }
        Ok(CommittedEpoch::NotRecorded)
    }

    async fn write_epoch(
        &self,
        epoch: &EpochCommit,
        output: &EpochOutput,
        handover: &Handover,
    ) -> Result<()> {
        self.write_epoch_set(epoch, std::slice::from_ref(output), handover)
            .await
    }

    async fn write_epoch_set(
        &self,
        epoch: &EpochCommit,
        outputs: &[EpochOutput],
        handover: &Handover,
    ) -> Result<()> {
        let takes_source_commits = self.source_commits_part();
        // The part that records commits goes last: once it commits, the
        // epoch is done, so everything else must be written by then.
        let mut order: Vec<usize> = (0..self.parts.len()).collect();
        order.sort_by_key(|&i| self.parts[i].0.records_commits());
        let nothing = Handover::default();
        for i in order {
            let (sink, indices) = &self.parts[i];
            let mut mine = Vec::with_capacity(indices.len());
            for &index in indices {
                mine.push(outputs.get(index).cloned().ok_or_else(|| {
                    SluiceError::Internal(format!("statement set output {index} missing"))
                })?);
            }
            let handover = if takes_source_commits == Some(i) {
                handover
            } else {
                &nothing
            };
            sink.write_epoch_set(epoch, &mine, handover).await?;
        }
        Ok(())
    }

    fn accepts_source_commits(&self) -> bool {
        self.source_commits_part().is_some()
    }

    fn records_commits(&self) -> bool {
        self.parts.iter().any(|(s, _)| s.records_commits())
    }

    fn needs_checkpoint(&self) -> bool {
        self.parts.iter().any(|(s, _)| s.needs_checkpoint())
    }

    fn describe(&self) -> String {
        let parts: Vec<String> = self.parts.iter().map(|(s, _)| s.describe()).collect();
        parts.join(" + ")
    }
}
