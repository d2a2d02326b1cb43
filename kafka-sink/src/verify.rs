//! `sluice verify`: a Kafka query's committed output, checked against the
//! batch answer of the same query over the input it committed.
//!
//! 1. The query's progress topic names its last committed epoch and each
//!    input's end offsets and watermark (read `read_committed`).
//! 2. Each input is read again from where the query began up to those
//!    offsets, and DataFusion computes the batch answer
//!    ([`sluice_engine::BatchQuery`]); input produced after the commit is
//!    not read.
//! 3. The output topic is read `read_committed` to its end, and then the
//!    progress topic again. A record with the query's `sluice.epoch` header
//!    (`'sink.epoch-headers' = 'true'`) is sorted by its epoch: later
//!    epochs' (a query still running) are set aside. A record without one
//!    counts as output, as a consumer would see it: the query's, when it
//!    writes without headers, or another producer's. Without headers the
//!    query's later epochs cannot be told from the last committed one's,
//!    so a query that committed while verify read is not checked.
//! 4. Update and complete mode: the output folded by message key (the last
//!    record per key; a tombstone deletes) must equal the answer's rows by
//!    key. Append mode: the output values must equal the answer's rows as
//!    a multiset. Rows are compared as the sink encodes them; JSON numbers
//!    that are not integers within a relative 1e-9, since a sum over
//!    epochs adds in another order than a batch sum.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use sluice_engine::{
    repartition_step_of, unprefixed_key, BatchQuery, Checkpoint, EpochCommit, OutputMode, Result,
    SluiceError,
};

use crate::broker::ReadRecord;
use crate::connector::repartition_topic;
use crate::format::Format;
use crate::sink::config::{
    sink_settings, task_identity, Delivery, Transactions, DEFAULT_TRANSACTIONAL_ID_PREFIX,
};
use crate::sink::progress_topic::read_last;
use crate::sink::{Message, SinkConfig, EPOCH_HEADER, QUERY_ID_HEADER};
use crate::source::{ends as source_ends, union};

/// How many differences a report shows.
const SHOWN: usize = 10;

/// What `sluice verify` found for one query.
#[derive(Debug)]
pub struct Verdict {
    /// Whether the committed output equals the batch answer.
    pub ok: bool,
    /// The report: what was read and compared, then the differences.
    pub lines: Vec<String>,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.lines {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

/// One record of the output topic.
#[derive(Debug, Clone)]
struct OutputRecord {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    /// `None`: a tombstone.
    value: Option<Vec<u8>>,
    origin: Origin,
}

/// Who wrote an output record, as far as verify can tell.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Origin {
    /// The query, in its last committed epoch or before; for a query that
    /// writes without epoch headers, the query or another producer.
    Committed,
    /// The query, in a later epoch (its header says so).
    Later,
    /// Another producer: no epoch header of the query's, which writes them.
    Foreign,
}

impl OutputRecord {
    fn at(&self) -> String {
        let origin = if self.origin == Origin::Foreign {
            ", not written by this query (no sluice.query.id header of it)"
        } else {
            ""
        };
        format!(
            "partition {}, offset {}{origin}",
            self.partition, self.offset
        )
    }
}

/// Checks the committed output of `query` (a query whose sink is Kafka,
/// exactly-once) against its batch answer. A query verify cannot check
/// (its shape, its sink, no checkpoint) is a configuration error that says
/// why.
///
/// ```no_run
/// # async fn f() -> sluice_engine::Result<()> {
/// use std::sync::Arc;
/// let session = sluice_engine::Session::new();
/// session.register_connector(Arc::new(sluice_kafka::KafkaConnector));
/// let mut query = session
///     .read_stream()
///     .format("kafka")
///     .option("topic", "bids")
///     .option("bootstrap.servers", "localhost:9092")
///     .option("format", "raw")
///     .load()?
///     .write_stream()
///     .format("kafka")
///     .option("topic", "copy")
///     .option("bootstrap.servers", "localhost:9092")
///     .option("format", "raw")
///     .checkpoint_location("./checkpoints/copy")
///     .batch_query()?;
/// let verdict = sluice_kafka::verify(&mut query).await?;
/// assert!(verdict.ok, "{verdict}");
/// # Ok(()) }
/// ```
pub async fn verify(query: &mut BatchQuery) -> Result<Verdict> {
    let name = query.name().unwrap_or("query").to_string();
    let target = Target::open(query, &name)?;
    let mut lines = vec![format!(
        "query '{name}' (id {}, checkpoint {})",
        target.query_id,
        target.dir.display()
    )];
    let Some(committed) = target.committed(query, &name, &mut lines).await? else {
        lines.push(format!(
            "  nothing committed yet (progress topic '{}' has no record of it)",
            target.progress_topic
        ));
        lines.push("OK: nothing to compare".into());
        return Ok(Verdict { ok: true, lines });
    };
    let inputs = read_inputs_again(query, &committed, &mut lines).await?;
    let answer = query.answer(inputs, &committed.watermarks).await?;
    let config = &target.config;
    let mut expected = Vec::new();
    for batch in &answer {
        expected.extend(config.encode(batch)?.to_vec());
    }
    let records = target
        .committed_output(&name, &committed, &mut lines)
        .await?;
    let differences = compare(query, &name, config, &records, &expected, &mut lines)?;
    if differences.is_empty() {
        lines.push(format!(
            "OK: the committed output equals the batch answer ({} rows)",
            expected.len()
        ));
    } else {
        lines.push(format!(
            "DIFFERENT: {} difference(s){}",
            differences.len(),
            if differences.len() > SHOWN {
                format!(", the first {SHOWN}:")
            } else {
                ":".to_string()
            }
        ));
        lines.extend(differences.iter().take(SHOWN).map(|d| format!("  {d}")));
    }
    Ok(Verdict {
        ok: differences.is_empty(),
        lines,
    })
}

/// A query verify can check, and where its commits and output are: an
/// exactly-once query to Kafka with a checkpoint.
struct Target {
    dir: std::path::PathBuf,
    query_id: String,
    config: SinkConfig,
    progress_topic: String,
    /// Who commits: the query, or each of its tasks (their identities,
    /// which key their progress records and epoch headers).
    writers: Vec<String>,
    /// A divided query's tasks, by number; empty when it is not divided.
    tasks: Vec<u32>,
    /// What its repartition topics' names start with.
    repartition_prefix: String,
}

/// What a query committed, all its tasks together.
struct Committed {
    /// Per input of the batch query, where the committed ranges end.
    ends: BTreeMap<String, serde_json::Value>,
    /// The watermarks the batch answer's windows close by, keyed like the
    /// inputs.
    watermarks: BTreeMap<String, i64>,
    /// Per writer (see [`Target::writers`]), its last committed epoch.
    epochs: BTreeMap<String, u64>,
}

impl Target {
    /// Refuses, saying why, a query verify cannot check.
    fn open(query: &BatchQuery, name: &str) -> Result<Self> {
        if query.sink_connector() != Some("kafka") {
            return Err(SluiceError::config(format!(
                "query '{name}' writes to {}: verify checks queries whose sink is Kafka",
                query.sink_connector().unwrap_or("no sink")
            )));
        }
        if let Some(why) = query.unsupported() {
            return Err(SluiceError::config(format!(
                "query '{name}' cannot be verified: {why}"
            )));
        }
        let dir = query.checkpoint_location().ok_or_else(|| {
            SluiceError::config(format!(
                "query '{name}' has no checkpoint location: verify finds the query's id there; \
                 SET 'checkpoint.location' as when the query runs"
            ))
        })?;
        let checkpoint = Checkpoint::open_existing(dir)?;
        let tasks = checkpoint.tasks()?;
        let query_id = checkpoint.metadata().query_id.clone();
        let writers = match tasks.is_empty() {
            true => vec![query_id.clone()],
            false => tasks.iter().map(|&i| task_identity(&query_id, i)).collect(),
        };
        let args = query.sink_args(&query_id);
        let repartition_prefix = args
            .options
            .get("sink.transactional-id-prefix")
            .unwrap_or(DEFAULT_TRANSACTIONAL_ID_PREFIX)
            .to_string();
        let settings = sink_settings(args)?;
        let Delivery::ExactlyOnce(Transactions { progress_topic, .. }) = settings.delivery else {
            return Err(SluiceError::config(format!(
                "query '{name}' writes with 'sink.delivery' = 'at-least-once', which may repeat \
                 output after a crash, and keeps no record of what it committed: verify checks \
                 exactly-once queries"
            )));
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            query_id,
            config: settings.config,
            progress_topic,
            writers,
            tasks,
            repartition_prefix,
        })
    }

    /// Each writer's last committed epoch, if it committed any.
    async fn read_commits(&self) -> Result<BTreeMap<String, Option<EpochCommit>>> {
        let mut commits = BTreeMap::new();
        for id in &self.writers {
            let (config, topic) = (self.config.clone(), self.progress_topic.clone());
            let (key, wait) = (id.clone(), config.client.timeout());
            let last = blocking(move || read_last(&config, &topic, &key, wait)).await?;
            commits.insert(id.clone(), last.map(|r| r.commit));
        }
        Ok(commits)
    }

    /// What the query committed (`None`: nothing yet): its last epoch's
    /// ends, or for a divided query every task's put together. A divided
    /// query's rows still crossing a repartition topic are not in its
    /// output yet, so while any are, it cannot be checked.
    async fn committed(
        &self,
        query: &BatchQuery,
        name: &str,
        lines: &mut Vec<String>,
    ) -> Result<Option<Committed>> {
        let commits = self.read_commits().await?;
        let epochs: BTreeMap<String, u64> = commits
            .iter()
            .filter_map(|(id, c)| Some((id.clone(), c.as_ref()?.epoch())))
            .collect();
        if epochs.is_empty() {
            return Ok(None);
        }
        let progress_topic = &self.progress_topic;
        let inputs: Vec<&str> = query.inputs().into_iter().map(|(k, _)| k).collect();
        if self.tasks.is_empty() {
            let Some(Some(last)) = commits.into_values().next() else {
                return Ok(None);
            };
            lines.push(format!(
                "  last committed epoch {} (progress topic '{progress_topic}')",
                last.epoch()
            ));
            let mut ends = BTreeMap::new();
            for key in inputs {
                let range =
                    last.plan.sources.get(key).ok_or_else(|| {
                        SluiceError::config(format!(
                        "the progress record of epoch {} has no input '{key}': the file's query \
                         is not the one that committed (inputs there: {})",
                        last.epoch(),
                        last.plan.sources.keys().cloned().collect::<Vec<_>>().join(", ")
                    ))
                    })?;
                ends.insert(key.to_string(), range.end.clone());
            }
            return Ok(Some(Committed {
                ends,
                watermarks: last.watermarks,
                epochs,
            }));
        }
        lines.push(format!(
            "  divided into {} tasks, last committed epochs {} (progress topic \
             '{progress_topic}')",
            self.tasks.len(),
            self.tasks
                .iter()
                .zip(&self.writers)
                .map(|(i, id)| match epochs.get(id) {
                    Some(e) => format!("{i}: {e}"),
                    None => format!("{i}: none"),
                })
                .collect::<Vec<_>>()
                .join(", ")
        ));
        // Each task's ranges of the inputs, and of each channel its
        // partition of it and the watermark its rows were judged by.
        let mut ranges: BTreeMap<String, Vec<&serde_json::Value>> = BTreeMap::new();
        let mut read: BTreeMap<(usize, i32), i64> = BTreeMap::new();
        let mut steps = std::collections::BTreeSet::new();
        let mut channel_watermark: Option<i64> = None;
        let mut own_watermarks = false;
        for (&task, id) in self.tasks.iter().zip(&self.writers) {
            let Some(Some(commit)) = commits.get(id) else {
                continue;
            };
            for (key, range) in &commit.plan.sources {
                let bare = unprefixed_key(key);
                // A task's statements number their inputs each from 0 (a
                // join's sides are two statements): an input is known by
                // its stream.
                let reads = inputs.iter().filter(|i| stream_of(i) == stream_of(bare));
                let mut read_input = false;
                for input in reads {
                    ranges
                        .entry(input.to_string())
                        .or_default()
                        .push(&range.end);
                    read_input = true;
                }
                if read_input {
                    own_watermarks |= commit.watermarks.contains_key(key);
                } else if let Some(step) = repartition_step_of(bare) {
                    steps.insert(step);
                    let partition = i32::try_from(task).unwrap_or(i32::MAX);
                    if let Some(&end) = source_ends(&range.end)?.get(&partition) {
                        read.insert((step, partition), end);
                    }
                    if let Some(&w) = commit.watermarks.get(key) {
                        channel_watermark = Some(channel_watermark.map_or(w, |c| c.min(w)));
                    }
                }
            }
        }
        for step in &steps {
            self.drained(*step, &read, name).await?;
        }
        let mut watermarks = BTreeMap::new();
        if query.closes_windows() {
            match (steps.is_empty(), channel_watermark, own_watermarks) {
                // Every downstream task has read every upstream task's
                // last watermark (the channels are drained): theirs is the
                // one watermark the windows closed by.
                (false, Some(w), _) => {
                    for key in &inputs {
                        watermarks.insert(key.to_string(), w);
                    }
                }
                (false, None, _) => {}
                (true, _, true) => {
                    return Err(SluiceError::config(format!(
                        "query '{name}' is divided into tasks that close windows each by its \
                         own partition's watermark: verify does not yet check that; it checks \
                         divided queries whose windows go through a repartition step, and \
                         undivided ones"
                    )))
                }
                (true, _, false) => {}
            }
        }
        let mut ends = BTreeMap::new();
        for (key, tasks_ends) in ranges {
            ends.insert(key, union(&tasks_ends)?);
        }
        Ok(Some(Committed {
            ends,
            watermarks,
            epochs,
        }))
    }

    /// Checks that every row written to repartition step `step`'s topic
    /// has been read by a committed epoch (`read`: per step and partition,
    /// where the committed reads end; a partition not read yet from its
    /// start), so that the output holds all the committed input.
    async fn drained(
        &self,
        step: usize,
        read: &BTreeMap<(usize, i32), i64>,
        name: &str,
    ) -> Result<()> {
        let topic = repartition_topic(&self.repartition_prefix, &self.query_id, step);
        let partitions: Vec<(i32, i64)> = self
            .tasks
            .iter()
            .filter_map(|&t| i32::try_from(t).ok())
            .map(|p| (p, read.get(&(step, p)).copied().unwrap_or(0)))
            .collect();
        let config = self.config.clone();
        let unread = {
            let topic = topic.clone();
            blocking(move || {
                crate::broker::count_committed_after(&config.client, &topic, &partitions)
            })
            .await?
        };
        if unread.is_empty() {
            return Ok(());
        }
        Err(SluiceError::config(format!(
            "query '{name}' has rows in flight through its repartition topic '{topic}' \
             ({}), which its committed output cannot hold yet: run verify again once the \
             query has caught up",
            unread
                .iter()
                .map(|(p, n)| format!("{n} unread in partition {p}"))
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }

    /// The output topic's committed records up to epoch `last`, those of
    /// later epochs set aside (by their headers); a headerless query that
    /// committed meanwhile cannot be told apart and is refused.
    async fn committed_output(
        &self,
        name: &str,
        committed: &Committed,
        lines: &mut Vec<String>,
    ) -> Result<Vec<OutputRecord>> {
        let config = &self.config;
        let records = {
            let config = config.clone();
            blocking(move || read_output(&config)).await?
        };
        // Whatever of the query the output read saw was committed before this
        // second read, so an epoch it names is the newest the output can hold.
        if !config.epoch_headers {
            for (id, commit) in self.read_commits().await? {
                let last = committed.epochs.get(&id).copied().unwrap_or(0);
                let Some(newest) = commit.map(|c| c.epoch()).filter(|&n| n > last) else {
                    continue;
                };
                return Err(SluiceError::config(format!(
                    "query '{name}' committed epochs {} to {newest} (as '{id}') while verify \
                     read its output, and its records carry no epoch headers to tell them from \
                     epoch {last}'s: run verify again once the query has stopped, or have it \
                     write the headers ('sink.epoch-headers' = 'true')",
                    last + 1,
                )));
            }
        }
        let (later, records): (Vec<OutputRecord>, Vec<OutputRecord>) = records
            .into_iter()
            .map(|r| OutputRecord::sorted(r, &committed.epochs, config.epoch_headers))
            .partition(|r| r.origin == Origin::Later);
        let later = later.len();
        let upto = match committed.epochs.len() {
            1 => committed.epochs.values().map(u64::to_string).collect(),
            _ => "each task's last".to_string(),
        };
        lines.push(format!(
            "  output topic '{}': {} records up to epoch {upto}{}",
            config.topic,
            records.len(),
            if later > 0 {
                format!(" ({later} of later epochs set aside)")
            } else {
                String::new()
            }
        ));
        Ok(records)
    }
}

/// The stream an input's checkpoint key (`<position>:<stream>`) reads.
fn stream_of(key: &str) -> &str {
    key.split_once(':').map_or(key, |(_, stream)| stream)
}

/// Every input of `query` read again from where the query began to where
/// its committed ranges end.
async fn read_inputs_again(
    query: &BatchQuery,
    committed: &Committed,
    lines: &mut Vec<String>,
) -> Result<BTreeMap<String, sluice_engine::Partitions>> {
    let mut inputs = BTreeMap::new();
    for (key, source) in query.inputs() {
        let end = committed.ends.get(key);
        let partitions = match end.filter(|e| !e.is_null()) {
            None => Vec::new(),
            Some(end) => {
                let span = source.since_start(end).await?.ok_or_else(|| {
                    SluiceError::config(format!(
                        "input '{key}' cannot be read again from where the query began (a Kafka \
                     stream with 'scan.startup.mode' = 'latest' began wherever the topic ended \
                     then): verify checks queries that read their input from the start"
                    ))
                })?;
                let partitions = source.read(None, &span).await?;
                lines.push(format!(
                    "  input {key}: {} rows, read again over {span}",
                    partitions
                        .iter()
                        .flatten()
                        .map(|b| b.num_rows())
                        .sum::<usize>()
                ));
                partitions
            }
        };
        inputs.insert(key.to_string(), partitions);
    }
    Ok(inputs)
}

/// The differences between the committed `records` and the `expected`
/// messages: by key (the last record per key) for a keyed changelog, as
/// multisets in append mode.
fn compare(
    query: &BatchQuery,
    name: &str,
    config: &SinkConfig,
    records: &[OutputRecord],
    expected: &[Message],
    lines: &mut Vec<String>,
) -> Result<Vec<String>> {
    let mode = query.output_mode();
    if mode != OutputMode::Append && !config.key_fields.is_empty() {
        lines.push(format!(
            "  compared by key ({mode} mode: the last record per key): {} rows in the batch \
             answer",
            expected.len()
        ));
        return Ok(compare_by_key(config, records, expected));
    }
    if mode != OutputMode::Append {
        return Err(SluiceError::config(format!(
            "query '{name}' writes {mode} mode without a message key, so its output cannot be \
             folded by key: set 'key.fields' on the sink"
        )));
    }
    lines.push(format!(
        "  compared as a multiset (append mode): {} rows in the batch answer",
        expected.len()
    ));
    Ok(compare_multiset(config, records, expected))
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SluiceError::Internal(format!("kafka read task: {e}")))?
}

/// Every record of the sink's topic, `read_committed`, in partition and
/// offset order.
fn read_output(config: &SinkConfig) -> Result<Vec<ReadRecord>> {
    crate::broker::read_topic(&config.client, &config.topic, true, config.client.timeout())
}

impl OutputRecord {
    /// `r`, sorted by who wrote it: by its epoch header when its query id
    /// header names one of the query's writers (`last`: each one's last
    /// committed epoch), against that writer's last epoch. When the query
    /// writes epoch headers (`headers`), a record without them is another
    /// producer's; else it may be either, and counts as output.
    fn sorted(r: ReadRecord, last: &BTreeMap<String, u64>, headers: bool) -> Self {
        let header = |name: &str| {
            r.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_slice())
        };
        let writer = header(QUERY_ID_HEADER)
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|id| last.get(id));
        let epoch = header(EPOCH_HEADER)
            .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
            .zip(writer);
        let origin = match epoch {
            Some((e, &last)) if e <= last => Origin::Committed,
            Some(_) => Origin::Later,
            None if headers => Origin::Foreign,
            None => Origin::Committed,
        };
        Self {
            partition: r.partition,
            offset: r.offset,
            key: r.key,
            value: r.value,
            origin,
        }
    }
}

/// Update and complete mode: the last record per key against the answer's
/// row of that key.
fn compare_by_key(
    config: &SinkConfig,
    records: &[OutputRecord],
    expected: &[Message],
) -> Vec<String> {
    let mut differences = Vec::new();
    // A key's records share a partition, so offset order is their order.
    let mut folded: BTreeMap<Vec<u8>, &OutputRecord> = BTreeMap::new();
    for r in records {
        match &r.key {
            Some(k) => {
                folded.insert(k.clone(), r);
            }
            None => differences.push(format!("output record at {} has no key", r.at())),
        }
    }
    let mut answer: BTreeMap<Vec<u8>, &[u8]> = BTreeMap::new();
    for (key, value) in expected {
        answer.insert(key.clone().unwrap_or_default(), value);
    }
    let show = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    for (key, want) in &answer {
        match folded.get(key).map(|r| (r, r.value.as_deref())) {
            None => differences.push(format!(
                "key {}: missing from the output; the batch answer is {}",
                show(key),
                show(want)
            )),
            Some((r, None)) => differences.push(format!(
                "key {}: deleted by the tombstone at {}; the batch answer is {}",
                show(key),
                r.at(),
                show(want)
            )),
            Some((r, Some(got))) if !same_row(config.format, got, want) => {
                differences.push(format!(
                    "key {}: the output has {} at {}; the batch answer is {}",
                    show(key),
                    show(got),
                    r.at(),
                    show(want)
                ))
            }
            Some(_) => {}
        }
    }
    for (key, r) in &folded {
        if let (false, Some(got)) = (answer.contains_key(key), &r.value) {
            differences.push(format!(
                "key {}: the output has {} at {}; the batch answer has no such key",
                show(key),
                show(got),
                r.at()
            ));
        }
    }
    differences
}

/// Append mode: the output values against the answer's rows, as multisets.
fn compare_multiset(
    config: &SinkConfig,
    records: &[OutputRecord],
    expected: &[Message],
) -> Vec<String> {
    let canonical = |bytes: &[u8]| canonical(config.format, bytes);
    let mut want: HashMap<String, usize> = HashMap::new();
    for (_, value) in expected {
        *want.entry(canonical(value)).or_default() += 1;
    }
    let mut differences = Vec::new();
    for r in records {
        let got = r.value.as_deref().map(canonical);
        match got.as_ref().and_then(|g| want.get_mut(g)) {
            Some(n) if *n > 0 => *n -= 1,
            _ => differences.push(format!(
                "output record at {}: {} is not in the batch answer{}",
                r.at(),
                r.value
                    .as_deref()
                    .map_or("a tombstone".to_string(), |v| String::from_utf8_lossy(v)
                        .into_owned()),
                if got.as_ref().is_some_and(|g| want.contains_key(g)) {
                    " that often"
                } else {
                    ""
                }
            )),
        }
    }
    let mut missing: Vec<(&String, &usize)> = want.iter().filter(|(_, n)| **n > 0).collect();
    missing.sort();
    for (row, n) in missing {
        differences.push(format!(
            "batch answer row {row} is missing from the output{}",
            if *n > 1 {
                format!(" ({n} times)")
            } else {
                String::new()
            }
        ));
    }
    differences
}

/// Whether two encoded rows hold the same values (JSON: numbers that are
/// not integers within a relative 1e-9).
fn same_row(format: Format, a: &[u8], b: &[u8]) -> bool {
    if format != Format::Json {
        return a == b;
    }
    match (
        serde_json::from_slice::<serde_json::Value>(a),
        serde_json::from_slice::<serde_json::Value>(b),
    ) {
        (Ok(a), Ok(b)) => same_value(&a, &b),
        _ => a == b,
    }
}

fn same_value(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if !(x.is_f64() || y.is_f64()) => x == y,
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y || (x - y).abs() <= 1e-9 * x.abs().max(y.abs()),
            _ => false,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_value(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => a == b,
    }
}

/// A row as text to count in a multiset: JSON with non-integer numbers
/// rounded to 9 significant digits.
fn canonical(format: Format, bytes: &[u8]) -> String {
    fn round(v: serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match v {
            Value::Number(n) if n.is_f64() => match n.as_f64() {
                Some(f) => Value::String(format!("{f:.8e}")),
                None => Value::Number(n),
            },
            Value::Array(a) => Value::Array(a.into_iter().map(round).collect()),
            Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, round(v))).collect()),
            other => other,
        }
    }
    if format == Format::Json {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes) {
            return round(v).to_string();
        }
    }
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_sorted_by_their_epoch_header_and_count_without_one() {
        let record = |headers: &[(&str, &str)]| ReadRecord {
            partition: 0,
            offset: 3,
            key: None,
            value: Some(b"v".to_vec()),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
        };
        // A divided query's tasks, each at its own last epoch.
        let last = BTreeMap::from([("q-0".to_string(), 7), ("q-1".to_string(), 3)]);
        let origin = |r, headers| OutputRecord::sorted(r, &last, headers).origin;
        let epoch = |e| [("sluice.query.id", "q-0"), ("sluice.epoch", e)];
        let other = [("sluice.query.id", "other"), ("sluice.epoch", "1")];
        for headers in [true, false] {
            assert_eq!(origin(record(&epoch("7")), headers), Origin::Committed);
            assert_eq!(origin(record(&epoch("8")), headers), Origin::Later);
            // Each task's records against its own last epoch.
            let task_1 = [("sluice.query.id", "q-1"), ("sluice.epoch", "4")];
            assert_eq!(origin(record(&task_1), headers), Origin::Later);
        }
        // A query writing headers: a record without its own is foreign.
        assert_eq!(origin(record(&[]), true), Origin::Foreign);
        assert_eq!(origin(record(&other), true), Origin::Foreign);
        // Without them, such a record may be the query's, and counts.
        assert_eq!(origin(record(&[]), false), Origin::Committed);
        assert_eq!(origin(record(&other), false), Origin::Committed);
    }

    #[test]
    fn rows_compare_with_float_tolerance_but_exact_integers() {
        let f = Format::Json;
        assert!(same_row(
            f,
            br#"{"k":1,"avg":0.1}"#,
            br#"{"k":1,"avg":0.10000000000000002}"#
        ));
        assert!(!same_row(
            f,
            br#"{"k":1,"avg":0.1}"#,
            br#"{"k":1,"avg":0.1001}"#
        ));
        assert!(!same_row(f, br#"{"k":1,"n":2}"#, br#"{"k":1,"n":3}"#));
        assert!(!same_row(f, br#"{"k":1}"#, br#"{"k":1,"n":3}"#));
        assert_eq!(
            canonical(f, br#"{"s":0.30000000000000004}"#),
            canonical(f, br#"{"s":0.3}"#)
        );
        assert_ne!(canonical(f, br#"{"n":3}"#), canonical(f, br#"{"n":4}"#));
    }
}
