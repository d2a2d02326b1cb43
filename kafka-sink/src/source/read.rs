//! Reading a planned epoch: its ranges taken from the lanes (the
//! partitions' consumer, fetching ahead) and decoded; a range whose start
//! is gone by the time it is read is data loss, as at planning.

use std::collections::BTreeMap;

use sluice_engine::{Partitions, Result, SluiceError};

use super::fetch::{LaneError, Lanes, Taken};
use super::{new_consumer, PlannedRanges, SourceInner};

/// A read found a range starting where records are gone.
struct OutOfRange;

impl SourceInner {
    /// Makes the lanes stand at `starts`: kept when they do, else opened
    /// there on a new consumer.
    pub(super) fn lanes_at(&self, starts: &BTreeMap<i32, i64>) -> Result<()> {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        if lanes.as_ref().is_some_and(|l| l.at(starts)) {
            return Ok(());
        }
        // The old consumer goes first: two would fetch the same partitions.
        *lanes = None;
        let consumer = new_consumer(&self.config)?;
        *lanes = Some(
            Lanes::open(consumer, &self.config.topic, starts)
                .map_err(|e| self.unreachable("assigning partitions", e))?,
        );
        Ok(())
    }

    /// Reads every range of `plan`; one partition of rows per Kafka
    /// partition. A range whose start is gone by now (deleted since it was
    /// planned, or before a replay) is data loss, as at planning.
    pub(super) fn read(&self, plan: &PlannedRanges) -> Result<Partitions> {
        let mut wanted: Vec<(i32, i64, i64)> = plan
            .ranges
            .iter()
            .filter(|(_, (from, to))| to > from)
            .map(|(p, (from, to))| (*p, *from, *to))
            .collect();
        let mut starts: BTreeMap<i32, i64> = plan
            .ranges
            .iter()
            .map(|(&p, &(from, _))| (p, from))
            .collect();
        loop {
            starts.extend(wanted.iter().map(|&(p, from, _)| (p, from)));
            match self.read_ranges(&starts, &wanted)? {
                Ok(fetched) => return self.decode_partitions(fetched),
                Err(OutOfRange) => wanted = self.what_is_left(&wanted)?,
            }
        }
    }

    /// What of `wanted` can still be read, after one of them started where
    /// records are gone: each range starting below its partition's first
    /// offset is data loss (see [`data_loss`](Self::data_loss)) and, when
    /// that is accepted, starts at the first offset left.
    fn what_is_left(&self, wanted: &[(i32, i64, i64)]) -> Result<Vec<(i32, i64, i64)>> {
        let marks = self.watermarks()?;
        let mut left = Vec::with_capacity(wanted.len());
        for &(p, from, to) in wanted {
            let (low, high) = marks.get(&p).copied().unwrap_or((to, to));
            let why = "were deleted (retention or delete_records) before the query read them";
            let start = if from < low {
                self.data_loss(p, from, low.min(to), why)?;
                low.min(to)
            } else if high < from {
                self.data_loss(p, from, to, "are gone: the topic was deleted and recreated")?;
                to
            } else {
                from
            };
            left.push((p, start, to));
        }
        if left == wanted {
            return Err(SluiceError::External {
                what: format!("kafka source '{}'", self.config.stream),
                message: format!(
                    "topic '{}': reading {wanted:?} found an offset out of range, but every \
                     range is within its partition now",
                    self.config.topic
                ),
                hint: Some("restart the query; it re-reads the epoch".into()),
            });
        }
        Ok(left)
    }

    /// The records of `wanted`, by partition, or `Err(OutOfRange)` when a
    /// range starts where records are gone.
    /// The lanes stand at `starts` (every partition of the plan) for it.
    fn read_ranges(
        &self,
        starts: &BTreeMap<i32, i64>,
        wanted: &[(i32, i64, i64)],
    ) -> Result<std::result::Result<Taken, OutOfRange>> {
        self.lanes_at(starts)?;
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        let Some(held) = lanes.as_mut() else {
            return Err(SluiceError::Internal("kafka source: no lanes".into()));
        };
        let stall = self.config.client.timeout();
        let mut fetched = Vec::with_capacity(wanted.len());
        for &(p, _, to) in wanted {
            match held.take(p, to, stall) {
                Ok(records) => fetched.push((p, records)),
                Err(e) => {
                    *lanes = None;
                    return match e {
                        LaneError::OutOfRange => Ok(Err(OutOfRange)),
                        LaneError::Stalled(last) => {
                            let why = last.map_or(String::new(), |e| format!(" (last error: {e})"));
                            Err(self
                                .unreachable("reading", format!("no progress for {stall:?}{why}")))
                        }
                    };
                }
            }
        }
        let (count, bytes) = fetched
            .iter()
            .flat_map(|(_, chunks)| chunks)
            .fold((0, 0), |(n, b), f| (n + f.len(), b + f.payload_bytes()));
        if count > 0 {
            *self.record_bytes.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((bytes as f64 / count as f64).max(1.0));
        }
        Ok(Ok(fetched))
    }
}
