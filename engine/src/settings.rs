//! A query's settings, whatever sets them: SQL `SET`s, a
//! [`DataStreamWriter`](crate::DataStreamWriter) or a
//! [`StatementSet`](crate::StatementSet).

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Result, SluiceError};
use crate::options::{closest, parse_duration, quoted_list};
use crate::state::chain::SnapshotPolicy;
use crate::task::Tasks;
use crate::trigger::Trigger;

/// The settings of a query, whatever builds it: SQL `SET`s, a
/// [`DataStreamWriter`](crate::DataStreamWriter) (which, started alone,
/// hands its own to the [`StatementSet`](crate::StatementSet) of one it
/// runs as) or a statement set.
///
/// ```
/// use std::time::Duration;
/// use sluice_engine::{QuerySettings, Trigger};
/// let mut settings = QuerySettings::default();
/// settings.trigger = Trigger::ProcessingTime(Duration::from_secs(1));
/// settings.checkpoint = Some("./checkpoints/orders".into());
/// assert_eq!(settings.state_snapshot_interval, 10);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QuerySettings {
    /// Where the query keeps its checkpoint (SQL: `checkpoint.location`);
    /// without one a query whose sink needs none gets a temporary one.
    pub checkpoint: Option<PathBuf>,
    /// When epochs run (SQL: `trigger`, `trigger.interval`).
    pub trigger: Trigger,
    /// The query's name for progress, logs and metrics; within a set, the
    /// statement's.
    pub name: Option<String>,
    /// The query's stable identity (SQL: `pipeline.name`, Flink's key;
    /// Kafka Streams' `application.id`): its Kafka transactional id,
    /// progress record key and topic derive from it, so two runs of one
    /// pipeline are one query whatever their checkpoint locations — the
    /// newer fences the older, and neither writes what the other
    /// committed. Without one, the id generated into the checkpoint is the
    /// identity.
    pub pipeline_name: Option<String>,
    /// State files per chain (a snapshot and its deltas) before a new
    /// snapshot (SQL: `state.snapshot.interval`; default 10, at least 1).
    pub state_snapshot_interval: u64,
    /// Snapshots, each with its deltas, kept in the checkpoint (SQL:
    /// `state.retained.snapshots`; default 2, at least 1).
    pub state_retained_snapshots: usize,
    /// The bytes the process's keyed state may hold in memory, every
    /// query's operators and tasks together, before its least recently
    /// touched keys go to local disk (SQL: `state.memory.limit`, e.g.
    /// `'512 MB'`); `None` (the default): no limit, all in memory.
    pub state_memory_limit: Option<u64>,
    /// Where state past the limit goes (SQL: `state.local.dir`); `None`
    /// (the default): a temporary directory.
    pub state_local_dir: Option<PathBuf>,
    /// How long a key's state may go unwritten before it is dropped, as
    /// Flink's state TTL (SQL: `state.ttl`, or Flink's
    /// `table.exec.state.ttl`, e.g. `'1 hour'`); `None` (the default, or
    /// `'0'`): state is kept until the query's logic drops it.
    pub state_ttl: Option<Duration>,
    /// How long the query keeps retrying while its brokers are unreachable
    /// without committing an epoch, before it fails (SQL: `outage.limit`;
    /// default 5 minutes). Every wait on Kafka inside an attempt is bounded
    /// too (`connect.timeout`, `transaction.timeout`), so the query fails at
    /// most one attempt after the limit.
    pub outage_limit: Duration,
    /// How the query is divided into tasks (SQL: `tasks`; default one
    /// task): see [`Tasks`].
    pub tasks: Tasks,
    /// Whether the processes running this query share its tasks through
    /// their input's group, each task running in one of them (SQL:
    /// `tasks.group`; default false: this process runs every task).
    pub task_group: bool,
    /// How long a process of the group may stay silent before its tasks
    /// move to the others (SQL: `tasks.group.session.timeout`; default
    /// 10 s).
    pub task_group_session_timeout: Duration,
    /// Through a repartition step, how long an upstream task may send no
    /// watermark before the downstream tasks' watermarks go on without it
    /// (SQL: `watermark.idle-timeout`, or Flink's
    /// `table.exec.source.idle-timeout`); `None` (the default): it holds
    /// them back until it sends again.
    pub watermark_idle_timeout: Option<Duration>,
    /// With tasks, how many run an epoch at once in this process (SQL:
    /// `tasks.threads`); `None` (the default): one per core.
    pub task_threads: Option<usize>,
    /// Whether a query that is behind plans and reads its next epoch while
    /// the current one commits (SQL: `epoch.read-ahead`; default true; see
    /// docs/operations.md).
    pub read_ahead: bool,
    /// Whether an epoch reads, computes and writes at once (SQL:
    /// `epoch.pipeline`): see [`Pipelining`].
    pub pipelining: Pipelining,
}

/// Whether an epoch's reading, computing and writing overlap: an input
/// read lazily as the plan pulls it ([`Source::read_lazily`]), appended
/// rows sent to the sink as they are computed ([`Sink::send_ahead`]).
///
/// [`Source::read_lazily`]: crate::Source::read_lazily
/// [`Sink::send_ahead`]: crate::Sink::send_ahead
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pipelining {
    /// Where the source or sink says it costs nothing
    /// (`pipelines_by_default`): the rate generator, not Kafka (the
    /// default).
    #[default]
    Auto,
    /// Every source and sink that can.
    On,
    /// None: each epoch is read whole, then computed, then written.
    Off,
}

impl Pipelining {
    /// Whether a source or sink that can pipeline, and does so by default
    /// or not (`by_default`), pipelines.
    pub(crate) fn applies(self, by_default: bool) -> bool {
        match self {
            Self::Auto => by_default,
            Self::On => true,
            Self::Off => false,
        }
    }
}

impl Default for QuerySettings {
    fn default() -> Self {
        DEFAULT
    }
}

impl QuerySettings {
    /// Whether `name` can be a [`pipeline_name`](Self::pipeline_name): it
    /// names the query's Kafka progress topic and transactional id, so it
    /// keeps to the characters a topic name may have.
    pub fn check_pipeline_name(name: &str) -> Result<()> {
        let valid = !name.is_empty()
            && name.len() <= 200
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if valid {
            return Ok(());
        }
        Err(SluiceError::config(format!(
            "'pipeline.name' = '{name}' is not a valid query identity: use 1 to 200 letters, \
             digits, '.', '_' and '-' (it names the query's Kafka progress topic and \
             transactional id)"
        )))
    }

    /// Sets query-wide setting `name` (a row of [`SETTINGS`]) from its
    /// text, as SQL's `SET` does; refuses an unknown name (with the closest
    /// one), a setting that is not query-wide, and a value it does not
    /// take.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        match Setting::find(name).map(|s| &s.kind) {
            Some(Kind::Query { apply, .. }) => apply(self, value),
            Some(_) => Err(SluiceError::config(format!(
                "'{name}' is not a query-wide setting: it applies to the statements (or \
                 streams) after it in SQL"
            ))),
            None => Err(unknown_setting(name)),
        }
    }

    /// The first query-wide setting that differs from its default here,
    /// if any.
    pub(crate) fn first_set(&self) -> Option<&'static str> {
        SETTINGS.iter().find_map(|s| match s.kind {
            Kind::Query { is_set, .. } => is_set(self).then_some(s.name),
            _ => None,
        })
    }

    /// The snapshot policy these settings give the query's state chains.
    pub(crate) fn snapshots(&self) -> SnapshotPolicy {
        SnapshotPolicy {
            every: self.state_snapshot_interval.max(1),
            retained: self.state_retained_snapshots.max(1),
        }
    }
}

/// One setting of a query, as SQL's `SET` spells it: the values it
/// takes, its default, and how it applies. [`SETTINGS`] lists every one,
/// and everything that knows settings reads it there: `SET`, the builders'
/// [`set`](crate::DataStreamWriter::set), a statement set's refusal of a
/// statement's own settings, the error for an unknown name (with its
/// suggestion), and the table in `docs/sql.md` (a test holds it to this
/// list).
///
/// ```
/// use sluice_engine::{QuerySettings, SETTINGS};
/// let mut settings = QuerySettings::default();
/// settings.set("state.snapshot.interval", "5")?;
/// assert_eq!(settings.state_snapshot_interval, 5);
/// assert!(SETTINGS.iter().any(|s| s.name == "outage.limit" && s.default == "`5 minutes`"));
/// let typo = settings.set("outage.limt", "1 minute").unwrap_err().to_string();
/// assert!(typo.contains("did you mean 'outage.limit'?"), "{typo}");
/// # Ok::<(), sluice_engine::SluiceError>(())
/// ```
#[derive(Debug)]
pub struct Setting {
    /// Its name.
    pub name: &'static str,
    /// Other names `SET` takes for it.
    pub aliases: &'static [&'static str],
    /// The values it takes and what they do (Markdown).
    pub values: &'static str,
    /// What holds without it (Markdown).
    pub default: &'static str,
    kind: Kind,
}

/// How a setting applies.
#[derive(Debug)]
enum Kind {
    /// Query-wide, a field of [`QuerySettings`].
    Query {
        /// Sets it from the text of a `SET`; the error says what it takes.
        apply: fn(&mut QuerySettings, &str) -> Result<()>,
        /// Whether a query's settings differ from the default in it.
        is_set: fn(&QuerySettings) -> bool,
    },
    /// The output mode of the statements after it (a frame's
    /// `output_mode`), which SQL keeps itself.
    Statement,
    /// `kafka.<property>` (or `properties.<property>`): a client property
    /// for the Kafka streams declared after it, which SQL keeps itself.
    KafkaDefaults,
}

/// Every setting, in the order the docs list them.
pub const SETTINGS: &[Setting] = &[
    Setting {
        name: "pipeline.name",
        aliases: &[],
        values: "the query's stable identity (Flink's key, Kafka Streams' `application.id`): \
            1–200 letters, digits, `.`, `_`, `-`; one per query of a file. The Kafka \
            transactional id (`sluice-<name>`), the progress record's key and the \
            progress topic (`sluice-progress.<name>`) derive from it, so two runs of one \
            pipeline are one query whatever their checkpoint locations: the newer fences \
            the older, and a run from a new or lost checkpoint location resumes from \
            what Kafka says was committed instead of writing it again (a stateful query \
            then stops, saying which state files it lacks). A checkpoint written under \
            another identity is refused.",
        default: "none: an id generated into the checkpoint, so a new checkpoint location is a \
            new query (the start warns)",
        kind: Kind::Query {
            apply: set_pipeline_name,
            is_set: |s| s.pipeline_name.is_some(),
        },
    },
    Setting {
        name: "checkpoint.location",
        aliases: &[],
        values: "a directory (or `file:///dir`), or a prefix on object storage: \
            `s3://bucket/path` (also `s3a://`), `gs://bucket/path`, \
            `az://container/path`, with credentials from the store's standard \
            environment (see *Checkpoints on object storage* in docs/operations.md); one \
            per query (two `INSERT`s may not share one)",
        default: "none: required by the `kafka` sink; `console`, `blackhole` and `memory` use \
            a temporary one",
        kind: Kind::Query {
            apply: set_checkpoint,
            is_set: |s| s.checkpoint.is_some(),
        },
    },
    Setting {
        name: "trigger.interval",
        aliases: &["trigger"],
        values: "an interval (`'500 ms'`, `'1 second'`, `'2 minutes'`); `'0'` runs epochs \
            back to back; `'available-now'` processes what exists when the query starts, \
            commits, and stops",
        default: "`'0'`",
        kind: Kind::Query {
            apply: set_trigger,
            is_set: |s| s.trigger != Trigger::default(),
        },
    },
    Setting {
        name: "output.mode",
        aliases: &[],
        values: "`append`, `update`, `complete`",
        default: "`append` for stateless queries, windowed aggregations over a watermark, \
            `DISTINCT` and joins; else `update` for a `GROUP BY` (stateless queries \
            accept `update` as the same thing; `complete` needs an aggregation)",
        kind: Kind::Statement,
    },
    Setting {
        name: "state.snapshot.interval",
        aliases: &[],
        values: "a whole number of state files per chain: a snapshot, then deltas",
        default: "`10`",
        kind: Kind::Query {
            apply: set_snapshot_interval,
            is_set: |s| s.state_snapshot_interval != DEFAULT.state_snapshot_interval,
        },
    },
    Setting {
        name: "state.retained.snapshots",
        aliases: &[],
        values: "how many snapshots (each with its deltas) stay in the checkpoint",
        default: "`2`",
        kind: Kind::Query {
            apply: set_retained_snapshots,
            is_set: |s| s.state_retained_snapshots != DEFAULT.state_retained_snapshots,
        },
    },
    Setting {
        name: "state.memory.limit",
        aliases: &[],
        values: "a size (`'512 MB'`, `'1 GB'`; MB means MiB, as in Flink): what this \
            process's keyed state (every query's GROUP BY and deduplication, all tasks) may hold \
            in memory; past it the least recently touched keys go to local disk \
            (`state.local.dir`) and come back when met. Session windows, joins, Top-N, OVER \
            and complete mode keep theirs in memory (see *State beyond memory* in \
            docs/operations.md)",
        default: "none: all state in memory",
        kind: Kind::Query {
            apply: set_memory_limit,
            is_set: |s| s.state_memory_limit.is_some(),
        },
    },
    Setting {
        name: "state.local.dir",
        aliases: &[],
        values: "a directory for state past `state.memory.limit`: a cache of the committed \
            state, which the checkpoint holds, made afresh at each start",
        default: "a temporary directory",
        kind: Kind::Query {
            apply: |s, value| {
                s.state_local_dir = Some(value.into());
                Ok(())
            },
            is_set: |s| s.state_local_dir.is_some(),
        },
    },
    Setting {
        name: "state.ttl",
        aliases: &["table.exec.state.ttl"],
        values: "a duration (`'1 hour'`, `'7 days'`): a key whose state no row has written for \
            that long, by the epochs' processing time, is dropped, as Flink's state TTL: \
            GROUP BY without a window, deduplication, Top-N, joins without a time bound and upsert \
            streams' latest values. A key that comes back after that starts again (see *State \
            TTL*). `'0'` turns it off",
        default: "off: state is kept until the query's logic drops it",
        kind: Kind::Query {
            apply: set_state_ttl,
            is_set: |s| s.state_ttl.is_some(),
        },
    },
    Setting {
        name: "outage.limit",
        aliases: &[],
        values: "how long a query retries while its brokers are unreachable, without \
            committing an epoch, before it fails",
        default: "`5 minutes`",
        kind: Kind::Query {
            apply: set_outage_limit,
            is_set: |s| s.outage_limit != DEFAULT.outage_limit,
        },
    },
    Setting {
        name: "tasks",
        aliases: &[],
        values: "`'1'`: the query is one task, one transaction per epoch over all its \
            partitions; `'per-partition'`: one task per partition of its Kafka inputs \
            (which must have equal partition counts), each with its own epochs, state, \
            checkpoint folder and Kafka transaction, run side by side (see *Scaling out* \
            in docs/operations.md). A `GROUP BY` not on the record key `_key` (or \
            `_partition`) goes through a repartition topic (windowed ones too, and with \
            `available-now`), and so does each side of a join of two streams; stacked \
            windowed operators (Nexmark q5, q7) run as a chain of statements joined by \
            such topics",
        default: "`'1'`",
        kind: Kind::Query {
            apply: set_tasks,
            is_set: |s| s.tasks != Tasks::default(),
        },
    },
    Setting {
        name: "tasks.threads",
        aliases: &[],
        values: "with `'tasks' = 'per-partition'`, how many tasks of the process run an epoch \
            at once",
        default: "the number of cores",
        kind: Kind::Query {
            apply: set_task_threads,
            is_set: |s| s.task_threads.is_some(),
        },
    },
    Setting {
        name: "tasks.group",
        aliases: &[],
        values: "`'true'`: the processes running this query (same `pipeline.name`, same \
            checkpoint location) share its tasks through Kafka's consumer group \
            `sluice-tasks-<pipeline.name>`, each task running in one of them; needs \
            `'tasks' = 'per-partition'`, `'pipeline.name'` and a trigger other than \
            `available-now`",
        default: "`'false'`: this process runs every task",
        kind: Kind::Query {
            apply: set_task_group,
            is_set: |s| s.task_group,
        },
    },
    Setting {
        name: "tasks.group.session.timeout",
        aliases: &[],
        values: "how long a process of the group may go silent before its tasks move to the \
            others (at least the broker's `group.min.session.timeout.ms`, 6 s by \
            default). Shorter moves a dead process's tasks sooner; raise it where \
            brokers or processes may stall longer (Kafka's own default is 45 s), or a \
            stall moves every task",
        default: "`10 seconds`",
        kind: Kind::Query {
            apply: set_task_group_session_timeout,
            is_set: |s| s.task_group_session_timeout != DEFAULT.task_group_session_timeout,
        },
    },
    Setting {
        name: "watermark.idle-timeout",
        aliases: &["table.exec.source.idle-timeout"],
        values: "through a repartition step, how long an upstream task may send no watermark \
            (its partition of the input has no new rows) before the downstream tasks' \
            watermarks go on without it, as Flink's source idleness; rows it sends after \
            that may be late. `'0'` turns it off",
        default: "off: every upstream task holds the watermark until it sends one",
        kind: Kind::Query {
            apply: set_watermark_idle_timeout,
            is_set: |s| s.watermark_idle_timeout.is_some(),
        },
    },
    Setting {
        name: "epoch.read-ahead",
        aliases: &[],
        values: "`'true'`: a query that is behind (its sources hold two more epochs as large \
            as the last, or `available-now` has backlog left) plans and reads its next \
            epoch while the current one commits, so the sources' fetching and decoding \
            fill the wait on the broker; nothing of the next epoch is written before the \
            commit. `'false'`: each epoch is planned after the previous commit",
        default: "`'true'`",
        kind: Kind::Query {
            apply: set_read_ahead,
            is_set: |s| !s.read_ahead,
        },
    },
    Setting {
        name: "epoch.pipeline",
        aliases: &[],
        values: "whether an epoch reads, computes and writes at once: an input without a \
            watermark that one scan reads is read as the plan pulls it, and a statement \
            that appends rows without state sends them to the sink as they are computed, \
            inside the epoch's transaction. `'auto'`: where the source or sink says it \
            costs nothing (the `rate` generator; not Kafka, which lost to whole epochs in \
            the suite: benches/README.md, *Pipelined epochs*); `'true'`: every source and \
            sink that can (Kafka's too); `'false'`: none",
        default: "`'auto'`",
        kind: Kind::Query {
            apply: set_pipelining,
            is_set: |s| s.pipelining != Pipelining::Auto,
        },
    },
    Setting {
        name: "kafka.*",
        aliases: &[],
        values: "a Kafka client property for every `kafka` stream declared after it that does \
            not set the property itself: connection and security settings said once (see \
            *Connecting to a secured Kafka cluster*). `'kafka.bootstrap.servers'` stands \
            for a stream's `bootstrap.servers`",
        default: "none",
        kind: Kind::KafkaDefaults,
    },
];

impl Setting {
    /// The setting `name` stands for, by its name or an alias; a
    /// `kafka.`/`properties.` property is the Kafka defaults' row.
    pub fn find(name: &str) -> Option<&'static Setting> {
        let kafka = ["kafka.", "properties."]
            .iter()
            .any(|p| name.strip_prefix(p).is_some_and(|rest| !rest.is_empty()));
        SETTINGS.iter().find(|s| match s.kind {
            Kind::KafkaDefaults => kafka,
            _ => s.name == name || s.aliases.contains(&name),
        })
    }

    /// Whether it applies to the whole query (a field of
    /// [`QuerySettings`]), not to the statements or streams after it.
    pub fn is_query_wide(&self) -> bool {
        matches!(self.kind, Kind::Query { .. })
    }

    /// Its names as the docs' table shows them.
    pub fn heading(&self) -> String {
        let names = std::iter::once(self.name).chain(self.aliases.iter().copied());
        let shown: Vec<String> = names
            .map(|n| format!("`{}`", n.replace(".*", ".<property>")))
            .collect();
        match self.kind {
            Kind::KafkaDefaults => format!("{} (or `properties.<property>`)", shown.join(", ")),
            _ => shown.join(", "),
        }
    }
}

/// The error for a setting no row of [`SETTINGS`] names: the closest
/// name, if one is close, and every valid one.
pub fn unknown_setting(name: &str) -> SluiceError {
    let names: Vec<&str> = SETTINGS
        .iter()
        .flat_map(|s| std::iter::once(s.name).chain(s.aliases.iter().copied()))
        .collect();
    let hint = closest(name, names.iter().copied())
        .map(|c| format!(" (did you mean '{c}'?)"))
        .unwrap_or_default();
    SluiceError::config(format!(
        "unknown setting '{name}'{hint}; valid settings: {}",
        quoted_list(&names)
    ))
}

/// The defaults, for the settings' `is_set`.
const DEFAULT: QuerySettings = QuerySettings {
    checkpoint: None,
    trigger: Trigger::ProcessingTime(Duration::ZERO),
    name: None,
    pipeline_name: None,
    state_snapshot_interval: 10,
    state_retained_snapshots: 2,
    state_memory_limit: None,
    state_local_dir: None,
    state_ttl: None,
    outage_limit: Duration::from_secs(300),
    tasks: Tasks::One,
    task_group: false,
    task_group_session_timeout: Duration::from_secs(10),
    watermark_idle_timeout: None,
    task_threads: None,
    read_ahead: true,
    pipelining: Pipelining::Auto,
};

fn set_pipeline_name(s: &mut QuerySettings, value: &str) -> Result<()> {
    QuerySettings::check_pipeline_name(value)?;
    s.pipeline_name = Some(value.to_string());
    Ok(())
}

fn set_checkpoint(s: &mut QuerySettings, value: &str) -> Result<()> {
    s.checkpoint = Some(value.into());
    Ok(())
}

fn set_trigger(s: &mut QuerySettings, value: &str) -> Result<()> {
    s.trigger = value.parse()?;
    Ok(())
}

fn set_snapshot_interval(s: &mut QuerySettings, value: &str) -> Result<()> {
    s.state_snapshot_interval = whole_from_one(value, || {
        format!("'state.snapshot.interval' takes a whole number from 1, found '{value}'")
    })?;
    Ok(())
}

fn set_retained_snapshots(s: &mut QuerySettings, value: &str) -> Result<()> {
    s.state_retained_snapshots = whole_from_one(value, || {
        format!("'state.retained.snapshots' takes a whole number from 1, found '{value}'")
    })? as usize;
    Ok(())
}

fn set_memory_limit(s: &mut QuerySettings, value: &str) -> Result<()> {
    let bytes = parse_size(value).ok_or_else(|| {
        SluiceError::config(format!(
            "'state.memory.limit' takes a size such as '512 MB' or '1 GB', found '{value}'"
        ))
    })?;
    s.state_memory_limit = Some(bytes);
    Ok(())
}

/// A size as Flink writes one: a whole number and a unit, `B`, `KB`, `MB`,
/// `GB` or `TB` (each 1024 times the one before; `KiB`, `k`, `m`, `g`, `t`
/// alike), in any case; a number alone is bytes. `None` for anything else
/// or 0.
pub(crate) fn parse_size(value: &str) -> Option<u64> {
    let value = value.trim();
    let digits = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let number: u64 = value[..digits].parse().ok()?;
    let unit = value[digits..].trim().to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" | "bytes" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    number.checked_mul(1 << shift).filter(|&b| b > 0)
}

fn set_state_ttl(s: &mut QuerySettings, value: &str) -> Result<()> {
    let ttl =
        parse_duration(value).map_err(|e| SluiceError::config(format!("'state.ttl': {e}")))?;
    s.state_ttl = Some(ttl).filter(|t| !t.is_zero());
    Ok(())
}

fn set_outage_limit(s: &mut QuerySettings, value: &str) -> Result<()> {
    s.outage_limit =
        parse_duration(value).map_err(|e| SluiceError::config(format!("'outage.limit': {e}")))?;
    Ok(())
}

fn set_tasks(s: &mut QuerySettings, value: &str) -> Result<()> {
    s.tasks = value.parse()?;
    Ok(())
}

fn set_task_threads(s: &mut QuerySettings, value: &str) -> Result<()> {
    let n = whole_from_one(value, || {
        format!(
            "'tasks.threads' takes a whole number from 1 (how many tasks run an epoch at once), \
             found '{value}'"
        )
    })?;
    s.task_threads = Some(n as usize);
    Ok(())
}

fn set_task_group(s: &mut QuerySettings, value: &str) -> Result<()> {
    s.task_group = switch(value).ok_or_else(|| {
        SluiceError::config(format!(
            "'tasks.group' takes 'true' (the processes running this query share its tasks) \
             or 'false', found '{value}'"
        ))
    })?;
    Ok(())
}

fn set_pipelining(s: &mut QuerySettings, value: &str) -> Result<()> {
    s.pipelining = match value.trim().to_ascii_lowercase().as_str() {
        "auto" => Pipelining::Auto,
        other => match switch(other) {
            Some(true) => Pipelining::On,
            Some(false) => Pipelining::Off,
            None => {
                return Err(SluiceError::config(format!(
                    "'epoch.pipeline' takes 'auto' (where it costs nothing), 'true' (every \
                     source and sink that can) or 'false', found '{value}'"
                )))
            }
        },
    };
    Ok(())
}

fn set_read_ahead(s: &mut QuerySettings, value: &str) -> Result<()> {
    s.read_ahead = switch(value).ok_or_else(|| {
        SluiceError::config(format!(
            "'epoch.read-ahead' takes 'true' (a query that is behind reads its next epoch \
             while the current one commits) or 'false', found '{value}'"
        ))
    })?;
    Ok(())
}

/// `true`/`on` or `false`/`off`, in any case.
fn switch(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "on" => Some(true),
        "false" | "off" => Some(false),
        _ => None,
    }
}

fn set_task_group_session_timeout(s: &mut QuerySettings, value: &str) -> Result<()> {
    s.task_group_session_timeout = parse_duration(value)
        .map_err(|e| SluiceError::config(format!("'tasks.group.session.timeout': {e}")))?;
    Ok(())
}

fn set_watermark_idle_timeout(s: &mut QuerySettings, value: &str) -> Result<()> {
    let timeout = parse_duration(value)
        .map_err(|e| SluiceError::config(format!("'watermark.idle-timeout': {e}")))?;
    s.watermark_idle_timeout = Some(timeout).filter(|t| !t.is_zero());
    Ok(())
}

/// `value` as a whole number from 1, or the error `message` makes.
fn whole_from_one(value: &str, message: impl FnOnce() -> String) -> Result<u64> {
    value
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| SluiceError::config(message()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_flink_writes_them() {
        assert_eq!(parse_size("512 MB"), Some(512 << 20));
        assert_eq!(parse_size("1gb"), Some(1 << 30));
        assert_eq!(parse_size(" 64 KiB "), Some(64 << 10));
        assert_eq!(parse_size("1000"), Some(1000));
        for bad in ["", "MB", "1.5 GB", "0 MB", "12 parsecs", "99999999999 TB"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
        let mut s = QuerySettings::default();
        s.set("state.memory.limit", "1 GB").unwrap();
        assert_eq!(s.state_memory_limit, Some(1 << 30));
        let err = s.set("state.memory.limit", "lots").unwrap_err().to_string();
        assert!(err.contains("'1 GB'"), "{err}");
    }
}
