//! `connector = 'nexmark'`: one of the Nexmark streams (`table` = `person`,
//! `auction` or `bid`), generated as the query reads it.
//!
//! The offset is `{"end", "anchor_event", "anchor_ms"}`: events below `end`
//! exist, and event `n` happens at `anchor_ms + (n - anchor_event) / rate`.
//! With `pace = 'wall-clock'` (the default) events appear at `rate` per
//! second from when the query starts, and their event time is when they
//! appear, like Spark's rate source. With `pace = 'none'` all of
//! `max-events` exist at once, on a fixed timeline from `base-time-ms`
//! (Beam's 2015-07-15 by default), which is how benchmarks drain a known
//! input. Either way every value a row depends on is in the offsets, so a
//! replayed epoch reads the same rows.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, Int64Builder, StringBuilder, TimestampNanosecondBuilder};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};
use sluice_engine::{
    columns, Connector, Offset, Partitions, Result, SluiceError, Source, SourceArgs, SourceFactory,
};

use crate::generator::{Generator, Kind, Timeline};

/// Rows per record batch.
const BATCH_ROWS: usize = 64 * 1024;

/// Beam's base time: 2015-07-15T00:00:00Z.
const BEAM_BASE_TIME_MS: i64 = 1_436_918_400_000;

/// Events per epoch with `pace = 'none'` unless set: bounds an epoch's
/// memory when a drain run plans everything at once.
const DEFAULT_NONE_PACED_EPOCH: u64 = 1_000_000;

const OPTIONS: &[&str] = &[
    "table",
    "events-per-second",
    "max-events",
    "max-events-per-epoch",
    "pace",
    "base-time-ms",
    "seed",
    "generator",
    "num-partitions",
];

/// The `nexmark` connector.
#[derive(Debug, Default)]
pub struct NexmarkConnector;

impl Connector for NexmarkConnector {
    fn name(&self) -> &str {
        "nexmark"
    }

    fn is_source(&self) -> bool {
        true
    }

    fn source(&self, mut args: SourceArgs) -> Result<Arc<dyn SourceFactory>> {
        let o = &mut args.options;
        let table = match o
            .take_choice("table", &["person", "auction", "bid"])?
            .as_deref()
        {
            Some("person") => Kind::Person,
            Some("auction") => Kind::Auction,
            Some("bid") => Kind::Bid,
            _ => {
                return Err(SluiceError::config(format!(
                    "stream '{}': connector 'nexmark' needs 'table' = 'person', 'auction' or \
                     'bid'",
                    args.stream
                )))
            }
        };
        let rate = o
            .take_parsed::<u64>("events-per-second", "a whole number of events per second")?
            .unwrap_or(10_000);
        let max_events = o.take_parsed::<u64>("max-events", "a whole number of events")?;
        let paced = o
            .take_choice("pace", &["wall-clock", "none"])?
            .is_none_or(|p| p == "wall-clock");
        let per_epoch = o
            .take_parsed::<u64>("max-events-per-epoch", "a whole number of events")?
            .or((!paced).then_some(DEFAULT_NONE_PACED_EPOCH));
        let base_time_ms = o
            .take_parsed::<i64>("base-time-ms", "milliseconds since the Unix epoch")?
            .unwrap_or(BEAM_BASE_TIME_MS);
        let seed = o.take_parsed::<u64>("seed", "a whole number")?.unwrap_or(0);
        // Flink's generator adds a channel and a URL to each bid.
        let flink = o
            .take_choice("generator", &["beam", "flink"])?
            .is_some_and(|g| g == "flink");
        let partitions = o
            .take_parsed::<usize>("num-partitions", "a whole number of partitions")?
            .unwrap_or(args.default_partitions)
            .max(1);
        o.finish("nexmark", OPTIONS)?;
        if rate == 0 || per_epoch == Some(0) {
            return Err(SluiceError::config(format!(
                "stream '{}': 'events-per-second' and 'max-events-per-epoch' must be at least 1",
                args.stream
            )));
        }
        if !paced && max_events.is_none() {
            return Err(SluiceError::config(format!(
                "stream '{}': 'pace' = 'none' makes every event exist at once, so it needs \
                 'max-events'",
                args.stream
            )));
        }
        let schema = schema(table, flink);
        if let Some(declared) = &args.schema {
            if declared.fields() != schema.fields() {
                return Err(SluiceError::config(format!(
                    "stream '{}': the nexmark {table:?} stream has fixed columns ({}); leave \
                     the column list out",
                    args.stream,
                    columns(&schema)
                )));
            }
        }
        Ok(Arc::new(NexmarkFactory(Config {
            table,
            rate,
            max_events,
            per_epoch,
            paced,
            base_time_ms,
            seed,
            flink,
            partitions,
            schema,
        })))
    }
}

/// The columns of each stream; `flink`: Flink's generator's bids, with
/// their channel and URL.
fn schema(table: Kind, flink: bool) -> SchemaRef {
    let id = |name: &str| Field::new(name, DataType::Int64, false);
    let text = |name: &str| Field::new(name, DataType::Utf8, false);
    let time =
        |name: &str| Field::new(name, DataType::Timestamp(TimeUnit::Nanosecond, None), false);
    Arc::new(Schema::new(match table {
        Kind::Person => vec![
            id("id"),
            text("name"),
            text("email_address"),
            text("credit_card"),
            text("city"),
            text("state"),
            time("date_time"),
            text("extra"),
        ],
        Kind::Auction => vec![
            id("id"),
            text("item_name"),
            text("description"),
            id("initial_bid"),
            id("reserve"),
            time("date_time"),
            time("expires"),
            id("seller"),
            id("category"),
            text("extra"),
        ],
        Kind::Bid if flink => vec![
            id("auction"),
            id("bidder"),
            id("price"),
            text("channel"),
            text("url"),
            time("date_time"),
            text("extra"),
        ],
        Kind::Bid => vec![
            id("auction"),
            id("bidder"),
            id("price"),
            time("date_time"),
            text("extra"),
        ],
    }))
}

#[derive(Debug, Clone)]
struct Config {
    table: Kind,
    rate: u64,
    max_events: Option<u64>,
    per_epoch: Option<u64>,
    paced: bool,
    base_time_ms: i64,
    seed: u64,
    flink: bool,
    partitions: usize,
    schema: SchemaRef,
}

#[derive(Debug)]
struct NexmarkFactory(Config);

impl SourceFactory for NexmarkFactory {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.0.schema)
    }

    fn create(&self) -> Result<Arc<dyn Source>> {
        Ok(Arc::new(NexmarkSource {
            config: self.0.clone(),
            anchor: Mutex::new(None),
            cap: Mutex::new(None),
        }))
    }

    fn describe(&self) -> String {
        let c = &self.0;
        format!(
            "nexmark({:?}, {} events/s{}{})",
            c.table,
            c.rate,
            if c.paced { "" } else { ", unpaced" },
            c.max_events
                .map(|m| format!(", {m} events"))
                .unwrap_or_default()
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct NexmarkOffset {
    end: i64,
    anchor_event: i64,
    anchor_ms: i64,
}

#[derive(Debug)]
struct NexmarkSource {
    config: Config,
    /// `(anchor_event, anchor_ms)`, set on the first plan of this run.
    anchor: Mutex<Option<(i64, i64)>>,
    /// Upper bound on `end` once prepared for available-now.
    cap: Mutex<Option<i64>>,
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn parse(offset: &Offset) -> Result<NexmarkOffset> {
    serde_json::from_value(offset.clone())
        .map_err(|e| SluiceError::Internal(format!("nexmark offset {offset}: {e}")))
}

impl NexmarkSource {
    /// The anchor of this run, and the events existing at `now`.
    fn available(&self, start_end: i64, now: i64) -> (i64, (i64, i64)) {
        let c = &self.config;
        if !c.paced {
            let max = c.max_events.unwrap_or(0).min(i64::MAX as u64) as i64;
            return (max, (0, c.base_time_ms));
        }
        let mut anchor = self.anchor.lock().unwrap_or_else(|p| p.into_inner());
        let (event, ms) = *anchor.get_or_insert((start_end, now));
        let produced = i128::from((now - ms).max(0)) * i128::from(c.rate) / 1000;
        let mut end = event.saturating_add(produced.min(i128::from(i64::MAX)) as i64);
        if let Some(max) = c.max_events {
            end = end.min(max.min(i64::MAX as u64) as i64);
        }
        (end, (event, ms))
    }
}

#[async_trait]
impl Source for NexmarkSource {
    async fn latest_offset(&self, start: Option<&Offset>) -> Result<Option<Offset>> {
        let start_end = start.map(parse).transpose()?.map_or(0, |o| o.end);
        let (mut end, (anchor_event, anchor_ms)) = self.available(start_end, now_ms());
        if let Some(cap) = *self.cap.lock().unwrap_or_else(|p| p.into_inner()) {
            end = end.min(cap);
        }
        if let Some(per_epoch) = self.config.per_epoch {
            end = end.min(start_end.saturating_add(per_epoch.min(i64::MAX as u64) as i64));
        }
        if end <= start_end {
            return Ok(None);
        }
        let offset = NexmarkOffset {
            end,
            anchor_event,
            anchor_ms,
        };
        serde_json::to_value(offset)
            .map(Some)
            .map_err(|e| SluiceError::Internal(e.to_string()))
    }

    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<Partitions> {
        let start = start.map(parse).transpose()?.map_or(0, |o| o.end);
        let end = parse(end)?;
        let generator = Generator {
            seed: self.config.seed,
            flink: self.config.flink,
            timeline: Timeline {
                anchor_event: end.anchor_event,
                anchor_ms: end.anchor_ms,
                rate: self.config.rate,
            },
        };
        // Generation is CPU work: one blocking task per partition.
        let n = self.config.partitions;
        let tasks: Vec<_> = (0..n)
            .map(|p| {
                let (schema, table) = (Arc::clone(&self.config.schema), self.config.table);
                tokio::task::spawn_blocking(move || {
                    let events = (start + p as i64..end.end).step_by(n);
                    generate(&schema, table, &generator, events)
                })
            })
            .collect();
        let mut partitions = Vec::with_capacity(n);
        for task in tasks {
            partitions
                .push(task.await.map_err(|e| {
                    SluiceError::Internal(format!("nexmark generator task: {e}"))
                })??);
        }
        Ok(partitions)
    }

    async fn prepare_available_now(&self) -> Result<()> {
        let start = self
            .anchor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map_or(0, |(event, _)| event);
        let (available, _) = self.available(start, now_ms());
        *self.cap.lock().unwrap_or_else(|p| p.into_inner()) = Some(available);
        Ok(())
    }
}

/// The rows of `table` among `events`, in batches of [`BATCH_ROWS`].
fn generate(
    schema: &SchemaRef,
    table: Kind,
    generator: &Generator,
    events: impl Iterator<Item = i64>,
) -> Result<Vec<RecordBatch>> {
    let mut batches = Vec::new();
    let mut rows = Rows::new(table, schema);
    for e in events.filter(|e| Kind::of(*e) == table) {
        rows.push(generator, e);
        if rows.len == BATCH_ROWS {
            batches.push(rows.finish(schema)?);
        }
    }
    if rows.len > 0 {
        batches.push(rows.finish(schema)?);
    }
    Ok(batches)
}

/// Column builders for one stream's rows.
struct Rows {
    table: Kind,
    len: usize,
    ints: Vec<Int64Builder>,
    texts: Vec<StringBuilder>,
    times: Vec<TimestampNanosecondBuilder>,
}

const NANOS_PER_MS: i64 = 1_000_000;

impl Rows {
    /// Builders for `schema`'s columns, by type.
    fn new(table: Kind, schema: &SchemaRef) -> Self {
        let of = |t: &DataType| {
            schema
                .fields()
                .iter()
                .filter(|f| f.data_type() == t)
                .count()
        };
        let ints = of(&DataType::Int64);
        let texts = of(&DataType::Utf8);
        let times = schema.fields().len() - ints - texts;
        Self {
            table,
            len: 0,
            ints: (0..ints).map(|_| Int64Builder::new()).collect(),
            texts: (0..texts).map(|_| StringBuilder::new()).collect(),
            times: (0..times)
                .map(|_| TimestampNanosecondBuilder::new())
                .collect(),
        }
    }

    fn push(&mut self, generator: &Generator, e: i64) {
        let (i, s, t) = (&mut self.ints, &mut self.texts, &mut self.times);
        match self.table {
            Kind::Person => {
                let p = generator.person(e);
                i[0].append_value(p.id);
                s[0].append_value(&p.name);
                s[1].append_value(&p.email_address);
                s[2].append_value(&p.credit_card);
                s[3].append_value(p.city);
                s[4].append_value(p.state);
                t[0].append_value(p.date_time * NANOS_PER_MS);
                s[5].append_value(&p.extra);
            }
            Kind::Auction => {
                let a = generator.auction(e);
                i[0].append_value(a.id);
                s[0].append_value(&a.item_name);
                s[1].append_value(&a.description);
                i[1].append_value(a.initial_bid);
                i[2].append_value(a.reserve);
                t[0].append_value(a.date_time * NANOS_PER_MS);
                t[1].append_value(a.expires * NANOS_PER_MS);
                i[3].append_value(a.seller);
                i[4].append_value(a.category);
                s[2].append_value(&a.extra);
            }
            Kind::Bid => {
                let b = generator.bid(e);
                i[0].append_value(b.auction);
                i[1].append_value(b.bidder);
                i[2].append_value(b.price);
                t[0].append_value(b.date_time * NANOS_PER_MS);
                let extra = match &b.channel {
                    Some(c) => {
                        s[0].append_value(&c.name);
                        s[1].append_value(&c.url);
                        2
                    }
                    None => 0,
                };
                s[extra].append_value(&b.extra);
            }
        }
        self.len += 1;
    }

    /// The rows so far as a batch, in the schema's column order; the
    /// builders start over.
    fn finish(&mut self, schema: &SchemaRef) -> Result<RecordBatch> {
        let mut ints = self
            .ints
            .iter_mut()
            .map(|b| Arc::new(b.finish()) as ArrayRef);
        let mut texts = self
            .texts
            .iter_mut()
            .map(|b| Arc::new(b.finish()) as ArrayRef);
        let mut times = self
            .times
            .iter_mut()
            .map(|b| Arc::new(b.finish()) as ArrayRef);
        let mut columns = Vec::with_capacity(schema.fields().len());
        for field in schema.fields() {
            let next = match field.data_type() {
                DataType::Int64 => ints.next(),
                DataType::Utf8 => texts.next(),
                _ => times.next(),
            };
            columns.push(next.ok_or_else(|| {
                SluiceError::Internal(format!("nexmark column {} has no builder", field.name()))
            })?);
        }
        self.len = 0;
        Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Int64Type;

    fn source(table: Kind, partitions: usize) -> NexmarkSource {
        NexmarkSource {
            config: Config {
                table,
                rate: 10_000,
                max_events: Some(5_000),
                per_epoch: Some(1_000),
                paced: false,
                base_time_ms: BEAM_BASE_TIME_MS,
                seed: 0,
                flink: false,
                partitions,
                schema: schema(table, false),
            },
            anchor: Mutex::new(None),
            cap: Mutex::new(None),
        }
    }

    fn all(parts: &Partitions, column: usize) -> Vec<i64> {
        let mut v: Vec<i64> = parts
            .iter()
            .flatten()
            .flat_map(|b| {
                b.column(column)
                    .as_primitive::<Int64Type>()
                    .values()
                    .to_vec()
            })
            .collect();
        v.sort_unstable();
        v
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn epochs_cover_the_events_once_and_a_replay_reads_the_same_rows() {
        let src = source(Kind::Person, 3);
        let mut start = None;
        let mut ids = Vec::new();
        while let Some(end) = src.latest_offset(start.as_ref()).await.unwrap() {
            let parts = src.read(start.as_ref(), &end).await.unwrap();
            assert_eq!(parts.len(), 3);
            // Another instance, as after a restart, reads the same rows.
            let again = source(Kind::Person, 3)
                .read(start.as_ref(), &end)
                .await
                .unwrap();
            assert_eq!(parts, again);
            ids.extend(all(&parts, 0));
            start = Some(end);
        }
        // 5 000 events hold 100 people: ids 1000..1100, each once.
        ids.sort_unstable();
        assert_eq!(ids, (1000..1100).collect::<Vec<_>>());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn bids_are_the_generators_bids() {
        let src = source(Kind::Bid, 2);
        let end = src.latest_offset(None).await.unwrap().unwrap();
        let parts = src.read(None, &end).await.unwrap();
        let generator = Generator {
            seed: 0,
            flink: false,
            timeline: Timeline {
                anchor_event: 0,
                anchor_ms: BEAM_BASE_TIME_MS,
                rate: 10_000,
            },
        };
        let mut want: Vec<i64> = (0..1_000)
            .filter(|e| Kind::of(*e) == Kind::Bid)
            .map(|e| generator.bid(e).price)
            .collect();
        want.sort_unstable();
        assert_eq!(all(&parts, 2), want);
    }
}
