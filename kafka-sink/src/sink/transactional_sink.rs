//! The exactly-once Kafka sink: each epoch's output and its progress record
//! in one Kafka transaction (docs/architecture.md §4).
//!
//! ```text
//! open:   wait for the brokers ─► progress topic exists ─► transaction timeout
//!         ≤ broker maximum ─► init_transactions (fences older instances,
//!         aborts or completes their open transaction)
//! recover: last progress record (read_committed) = last committed epoch C
//! epoch N: begin ─► produce output (headers: query id, epoch)
//!          ─► produce progress record {epoch N, offsets, state files}
//!          ─► commit            ── the decision point
//! ```
//!
//! With `'epoch.pipeline' = 'true'` (the engine's `Pipelining`) an appending
//! statement's output is sent ahead, batch by batch as the epoch computes it ([`Sink::send_ahead`]): the transaction begins at the
//! first batch, and the epoch's write sends the rest, the progress record,
//! and commits. Nothing of it is visible before the commit either way.
//!
//! # Guarantee
//! A `read_committed` reader sees each epoch's output exactly once: output
//! and progress record commit or vanish together, and after any crash the
//! engine resumes after the epoch the progress topic names. Everything the
//! engine decides before the commit (offsets, staged state) is immutable and
//! versioned, so it can wait for the commit's outcome.
//!
//! # Fencing
//! `transactional.id = <prefix><query id>` (prefix `sluice-` unless
//! `'sink.transactional-id-prefix'` says otherwise), where the query id is
//! the query's `pipeline.name` when it has one: stable across restarts and
//! across checkpoint locations. After [`Sink::open`] returns, every older
//! instance of the query is fenced: its next transactional call fails
//! fatally and it stops, saying another instance took over.
//!
//! # Errors, by class (librdkafka's flags)
//! - retriable: call the same operation again;
//! - abortable: abort the transaction and produce the epoch again (up to
//!   [`MAX_ATTEMPTS`] times): its output is still in memory;
//! - fenced: another instance took over; the query stops, saying so;
//! - fatal: the producer is dead; the query stops, and a restart resumes;
//! - none of these (the broker stopped answering): the engine recovers and
//!   retries the epoch with backoff (see `epoch`).
//!
//! # Not handled here, deliberately
//! - Restarts that outlast `transaction.timeout.ms` cannot lose data: the
//!   broker aborts the open transaction and the epoch is redone.
//! - Sinks on different clusters cannot share a transaction: a statement
//!   set's exactly-once Kafka sinks must name the same brokers and producer
//!   settings (checked when the set starts).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::record_batch::RecordBatch;
use rdkafka::admin::{AdminOptions, ResourceSpecifier};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::ClientConfig;
use sluice_engine::{
    fail_point, CommittedEpoch, EpochCommit, EpochOutput, Handover, Result, Sink, SluiceError,
};

use super::config::Transactions;
use crate::sink::progress_topic::{self, ProgressRecord};
use crate::sink::{create_producer, flush_within, send, Groups, SinkConfig, SinkProducer};

/// Times an epoch is produced again after abortable errors before the query
/// fails.
pub(crate) const MAX_ATTEMPTS: usize = 5;

/// Cheap to move onto a blocking thread.
pub(crate) struct TransactionalSink(Arc<Inner>);

struct Inner {
    /// The first statement's settings: brokers, producer settings and query
    /// id, which all targets share.
    config: SinkConfig,
    /// `<prefix><query id>`: the same for every instance of the query.
    transactional_id: String,
    /// Where each statement's output goes, in statement order (the first is
    /// `config`).
    targets: Vec<SinkConfig>,
    progress_topic: String,
    transaction_timeout: Duration,
    /// What the producer is made from: a recovery that cannot abort the
    /// failed epoch's transaction makes a new one (see [`Inner::resolve`]).
    producer_config: ClientConfig,
    producer: Mutex<Arc<SinkProducer>>,
    /// True from `begin_transaction` until the transaction is committed or
    /// aborted.
    in_transaction: AtomicBool,
    /// An abort of the open transaction timed out while the brokers
    /// answered: the producer is stuck, and [`Inner::resolve`] replaces it
    /// instead of aborting again.
    abort_stuck: AtomicBool,
    /// The epoch whose output is being sent ahead in the open transaction.
    ahead: Mutex<Option<Ahead>>,
    groups: Groups,
}

/// An epoch's output sent ahead (see [`Sink::send_ahead`]), in the
/// transaction begun for it.
struct Ahead {
    epoch: u64,
    /// Per target, how many of the epoch's output batches went.
    sent: Vec<usize>,
    /// When its transaction began.
    began: Instant,
    /// Sending failed and the transaction was aborted: the rest is not
    /// sent ahead, and the epoch's write sends it all again.
    failed: bool,
}

impl std::fmt::Debug for TransactionalSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionalSink")
            .field("topics", &self.0.topics())
            .field("progress_topic", &self.0.progress_topic)
            .finish_non_exhaustive()
    }
}

/// How to react to a transactional error.
enum ErrorClass {
    Retriable,
    Abortable,
    Fatal,
}

fn classify(e: &KafkaError) -> ErrorClass {
    match e {
        KafkaError::Transaction(t) if t.is_retriable() => ErrorClass::Retriable,
        KafkaError::Transaction(t) if t.txn_requires_abort() => ErrorClass::Abortable,
        _ => ErrorClass::Fatal,
    }
}

impl TransactionalSink {
    /// One transactional producer for the outputs of `targets` (one per
    /// statement, at least one), which must share their brokers and
    /// producer settings.
    pub(crate) fn new(targets: Vec<SinkConfig>, transactions: Transactions) -> Result<Self> {
        let Transactions {
            transactional_id,
            progress_topic,
            timeout: transaction_timeout,
        } = transactions;
        let Some(config) = targets.first().cloned() else {
            return Err(SluiceError::Internal(
                "a transactional sink without a topic".into(),
            ));
        };
        for other in &targets[1..] {
            let differs = if other.client.bootstrap() != config.client.bootstrap() {
                Some(format!(
                    "brokers '{}' and '{}'",
                    config.client.bootstrap(),
                    other.client.bootstrap()
                ))
            } else if other.client != config.client {
                Some("different 'kafka.*' or 'connect.timeout' settings".to_string())
            } else {
                None
            };
            if let Some(differs) = differs {
                return Err(SluiceError::config(format!(
                    "the Kafka sinks of one statement set share one transactional producer, so \
                     they need the same 'bootstrap.servers', 'connect.timeout' and 'kafka.*' \
                     settings: topics '{}' and '{}' have {differs}",
                    config.topic, other.topic
                )));
            }
        }
        let mut producer_config = config.producer_config();
        producer_config
            .set("transactional.id", &transactional_id)
            .set(
                "transaction.timeout.ms",
                transaction_timeout.as_millis().to_string(),
            );
        let producer = create_producer(&config.client, &producer_config)?;
        Ok(Self(Arc::new(Inner {
            config,
            transactional_id,
            targets,
            progress_topic,
            transaction_timeout,
            producer_config,
            producer: Mutex::new(Arc::new(producer)),
            in_transaction: AtomicBool::new(false),
            abort_stuck: AtomicBool::new(false),
            ahead: Mutex::new(None),
            groups: Groups::default(),
        })))
    }
}

impl Inner {
    fn fenced(&self, e: &KafkaError) -> SluiceError {
        SluiceError::Stopped(format!(
            "query {}: another instance took over (transactional id {} was initialised by a \
             newer producer), so this one stops; nothing it had not committed is visible to \
             read_committed readers ({e})",
            self.config.query_id, self.transactional_id
        ))
    }

    /// The error for a transactional call (`what`) that failed and can be
    /// neither retried nor aborted in place. Fenced: another instance took
    /// over, stop. Otherwise fatal: the producer is dead, stop and let a
    /// restart resume. Otherwise (a broker that stopped answering): the
    /// engine retries the epoch after recovery, with backoff.
    fn stopped(&self, what: &str, e: &KafkaError) -> SluiceError {
        use rdkafka::types::RDKafkaErrorCode as Code;
        let (fatal, code) = match e {
            KafkaError::Transaction(t) => (t.is_fatal(), Some(t.code())),
            other => (false, other.rdkafka_error_code()),
        };
        let fenced = matches!(
            code,
            Some(
                Code::Fenced
                    | Code::ProducerFenced
                    | Code::InvalidProducerEpoch
                    | Code::TransactionCoordinatorFenced
            )
        );
        if fenced {
            self.fenced(e)
        } else if fatal {
            SluiceError::External {
                what: format!("kafka sink, topic '{}'", self.config.topic),
                message: format!("{what} failed and the transactional producer cannot go on: {e}"),
                hint: Some(
                    "start the query again: it resumes after its last committed epoch, and \
                     nothing of the failed one is visible to read_committed readers"
                        .into(),
                ),
            }
        } else {
            self.config.unreachable(format!("{what} failed: {e}"))
        }
    }

    /// The broker's `transaction.max.timeout.ms`, when it can be read.
    async fn broker_max_timeout(&self) -> Result<Option<Duration>> {
        let client = &self.config.client;
        let admin = client.admin("kafka sink admin client")?;
        let metadata = admin
            .inner()
            .fetch_metadata(None, self.config.client.timeout())
            .map_err(|e| self.config.unreachable(format!("fetching metadata: {e}")))?;
        let Some(broker) = metadata.brokers().first().map(|b| b.id()) else {
            return Ok(None);
        };
        let options = AdminOptions::new().request_timeout(Some(self.config.client.timeout()));
        let results = admin
            .describe_configs([&ResourceSpecifier::Broker(broker)], &options)
            .await
            .map_err(|e| {
                self.config
                    .unreachable(format!("describing broker configs: {e}"))
            })?;
        Ok(results
            .into_iter()
            .flatten()
            .find_map(|r| {
                r.get("transaction.max.timeout.ms")
                    .and_then(|e| e.value.as_ref())
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .map(Duration::from_millis))
    }

    fn topics(&self) -> String {
        let topics: Vec<&str> = self.targets.iter().map(|t| t.topic.as_str()).collect();
        topics.join(", ")
    }

    /// The current producer.
    fn producer(&self) -> Arc<SinkProducer> {
        Arc::clone(&self.producer.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn init(&self) -> Result<()> {
        let producer = self.producer();
        for target in &self.targets {
            target.wait_for_topic(producer.client(), &target.topic)?;
        }
        self.init_transactions(&producer)
    }

    fn init_transactions(&self, producer: &SinkProducer) -> Result<()> {
        // A cluster whose transaction coordinator cannot come up answers
        // "retriable" for ever: the start fails after 'connect.timeout'.
        retrying("init_transactions", self.config.client.timeout(), || {
            producer.init_transactions(self.config.client.timeout())
        })
        .map_err(|e| self.stopped("init_transactions", &e))?;
        self.in_transaction.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Before a recovery reads the progress topic: whatever the failed
    /// epoch left of its transaction is ended, so that it can neither hide
    /// the last committed epoch from the read (an open transaction holds
    /// back the last stable offset) nor commit after it. While no broker
    /// answers, that waits for the next recovery.
    ///
    /// First by aborting it in place, which also tells whether another
    /// instance took over meanwhile (fenced: stop). Only a transaction that
    /// cannot be aborted in place gets a new producer under the same
    /// transactional id, whose `init_transactions` completes or aborts it:
    /// a commit whose outcome never arrived, a producer librdkafka declared
    /// dead, or an abort that timed out while the brokers answered. That
    /// last one is a producer stuck on the transaction coordinator it lost
    /// in an outage (seen after a broker restart under load: the abort
    /// timed out for minutes while the restarted broker served reads). A
    /// newer instance cannot be what holds it, since its
    /// `init_transactions` would have made the abort fail as fenced.
    /// Re-initialising every time instead would fence a newer instance
    /// that took over during an outage, and the older one would win.
    fn resolve(&self) -> Result<()> {
        *self.ahead.lock().unwrap_or_else(|p| p.into_inner()) = None;
        if !self.in_transaction.load(Ordering::SeqCst) {
            return Ok(());
        }
        let producer = self.producer();
        if !self.brokers_answer(&producer) {
            return Err(self.config.unreachable(
                "no broker answers yet, so the failed epoch's transaction cannot be ended".into(),
            ));
        }
        if !self.abort_stuck.load(Ordering::SeqCst) {
            let aborted = retrying("abort_transaction", self.transaction_timeout, || {
                producer.abort_transaction(self.transaction_timeout)
            });
            match aborted {
                Ok(()) => {
                    self.in_transaction.store(false, Ordering::SeqCst);
                    return Ok(());
                }
                Err(e) => {
                    let error = self.stopped("abort_transaction", &e);
                    if matches!(error, SluiceError::Stopped(_)) {
                        return Err(error);
                    }
                    tracing::warn!(error = %e, "the failed epoch's transaction cannot be aborted in place; re-initialising the producer");
                }
            }
        }
        let producer = Arc::new(create_producer(&self.config.client, &self.producer_config)?);
        self.init_transactions(&producer)?;
        *self.producer.lock().unwrap_or_else(|p| p.into_inner()) = producer;
        self.abort_stuck.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Whether a broker answers a metadata request for the progress topic
    /// now, within the connect timeout.
    fn brokers_answer(&self, producer: &SinkProducer) -> bool {
        producer
            .client()
            .fetch_metadata(Some(&self.progress_topic), self.config.client.timeout())
            .is_ok()
    }

    /// Produces epoch `record.epoch` (`outputs[i]` to the i-th target) and
    /// its progress record in one transaction and commits it: begun (or
    /// resumed where output went ahead), produced, delivered, committed;
    /// a failure a retry can mend aborts the transaction and produces the
    /// epoch again, up to [`MAX_ATTEMPTS`] times.
    fn commit_epoch(
        &self,
        commit: &EpochCommit,
        outputs: &[EpochOutput],
        handover: &Handover,
    ) -> Result<()> {
        if outputs.len() != self.targets.len() {
            return Err(SluiceError::Internal(format!(
                "{} outputs for {} Kafka topics",
                outputs.len(),
                self.targets.len()
            )));
        }
        let epoch = commit.epoch();
        let progress = ProgressRecord::new(&self.config.query_id, commit).to_json()?;
        let producer = self.producer();
        let producer = producer.as_ref();
        // What went ahead is in the open transaction: the first attempt
        // sends the rest; a retry sends everything again.
        let mut ahead = self
            .ahead
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .filter(|a| a.epoch == epoch && !a.failed);
        for attempt in 1..=MAX_ATTEMPTS {
            let (began, sent) = match ahead.take() {
                Some(a) => (a.began, a.sent),
                None => (self.begin(producer)?, vec![0; outputs.len()]),
            };
            if let Err(e) = self.produce(producer, epoch, outputs, &sent, handover, &progress) {
                self.abort(producer)?;
                // Only Kafka's own trouble can pass on a retry; a record
                // Kafka never takes, a row that cannot be encoded, a
                // missing dead-letter topic stay what they are.
                if !matches!(e, SluiceError::External { .. }) {
                    return Err(e);
                }
                tracing::warn!(epoch, attempt, error = %e, "producing failed; the transaction was aborted");
                continue;
            }
            if !self.delivered(producer, epoch, attempt)? {
                continue;
            }
            fail_point("kafka-before-commit", epoch);
            if self.finish(producer, epoch, attempt, began)? {
                return Ok(());
            }
        }
        Err(self.config.external(format!(
            "epoch {epoch}: the transaction failed {MAX_ATTEMPTS} times; the epoch is not \
             committed and will be redone on restart"
        )))
    }

    /// Begins an epoch's transaction; returns when.
    fn begin(&self, producer: &SinkProducer) -> Result<Instant> {
        producer.context().take_error();
        if let Err(e) = producer.begin_transaction() {
            return Err(self.stopped("begin_transaction", &e));
        }
        self.in_transaction.store(true, Ordering::SeqCst);
        Ok(Instant::now())
    }

    /// Produces epoch `epoch` into the open transaction: each target's
    /// output after the `sent` batches that went ahead, the dead letters,
    /// the group offsets and the `progress` record.
    fn produce(
        &self,
        producer: &SinkProducer,
        epoch: u64,
        outputs: &[EpochOutput],
        sent: &[usize],
        handover: &Handover,
        progress: &[u8],
    ) -> Result<()> {
        for ((target, output), &sent) in self.targets.iter().zip(outputs).zip(sent) {
            let rest = output.rows.get(sent..).ok_or_else(|| {
                SluiceError::Internal(format!(
                    "epoch {epoch}: {sent} batches were sent ahead to topic '{}', but its \
                     output has {}",
                    target.topic,
                    output.rows.len()
                ))
            })?;
            target.send_output(producer, epoch, rest, output.retracted.as_ref())?;
        }
        self.config
            .send_dead_letters(producer, epoch, &handover.dead_letters)?;
        self.groups.send_in_transaction(
            producer,
            &self.config,
            &handover.group_offsets,
            self.transaction_timeout,
        )?;
        let r = BaseRecord::to(&self.progress_topic)
            .key(self.config.query_id.as_bytes())
            .payload(progress);
        send(producer, r).map_err(|e| self.config.external(e.to_string()))
    }

    /// Delivers what the open transaction holds before its commit: a
    /// delivery error is then known before the commit, and the fail point
    /// before it really leaves records of an open transaction on the
    /// broker. False when the transaction was aborted for the epoch to be
    /// produced again; a record the broker refuses as too large stops the
    /// query.
    fn delivered(&self, producer: &SinkProducer, epoch: u64, attempt: usize) -> Result<bool> {
        if let Err(e) = flush_within(producer, self.transaction_timeout) {
            tracing::warn!(epoch, attempt, error = %e, "flush failed; aborting the transaction");
            self.abort(producer)?;
            return Ok(false);
        }
        let Some(e) = producer.context().take_error() else {
            return Ok(true);
        };
        self.abort(producer)?;
        if e.code == Some(RDKafkaErrorCode::MessageSizeTooLarge) {
            return Err(SluiceError::Poison {
                epoch,
                reason: format!(
                    "the broker refused an output record as too large ({e}): the topic's \
                     max.message.bytes is lower than the producer's message.max.bytes"
                ),
                way_out: format!(
                    "raise the topic's max.message.bytes, or lower 'kafka.message.max.bytes' \
                     to it and set 'dead-letter.topic' on the sink (records over it then go \
                     there); topic(s): {}",
                    self.topics()
                ),
            });
        }
        tracing::warn!(epoch, attempt, error = %e, "a message was not delivered; the transaction was aborted");
        Ok(false)
    }

    /// Commits the epoch's transaction, `began` then. False when it was
    /// aborted for the epoch to be produced again.
    fn finish(
        &self,
        producer: &SinkProducer,
        epoch: u64,
        attempt: usize,
        began: Instant,
    ) -> Result<bool> {
        match self.commit(producer) {
            Ok(()) => {
                self.in_transaction.store(false, Ordering::SeqCst);
                fail_point("kafka-after-commit", epoch);
                Ok(true)
            }
            Err(e)
                if began.elapsed() >= self.transaction_timeout
                    && !matches!(classify(&e), ErrorClass::Retriable) =>
            {
                // The broker aborts a transaction open longer than its
                // timeout and bumps the producer's epoch, so the error
                // reads as if another instance had taken over. (A
                // commit that timed out unanswered is an outage.)
                Err(SluiceError::Poison {
                    epoch,
                    reason: format!(
                        "its transaction was open for {:.1?}, longer than \
                         'transaction.timeout' ({:?}), so the broker aborted it ({e}); \
                         nothing of it is visible to read_committed readers",
                        began.elapsed(),
                        self.transaction_timeout
                    ),
                    way_out: "raise 'transaction.timeout' (up to the broker's \
                              transaction.max.timeout.ms), or make epochs smaller \
                              ('max-records-per-epoch', 'max-bytes-per-epoch' on the source); \
                              the restart re-runs the epoch"
                        .into(),
                })
            }
            Err(e) => match classify(&e) {
                ErrorClass::Abortable | ErrorClass::Retriable => {
                    tracing::warn!(epoch, attempt, error = %e, "commit failed; aborting and producing the epoch again");
                    self.abort(producer)?;
                    Ok(false)
                }
                ErrorClass::Fatal => Err(self.stopped("commit_transaction", &e)),
            },
        }
    }

    /// Sends `rows`, a batch of target `statement`'s output of `epoch`,
    /// in the transaction begun for the epoch at its first batch (see
    /// [`Sink::send_ahead`]). An error a retry can mend aborts the
    /// transaction and is left to the epoch's write, which sends it all
    /// again; any other ends the epoch.
    fn send_ahead(&self, epoch: u64, statement: usize, rows: &RecordBatch) -> Result<()> {
        let mut ahead = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
        let producer = self.producer();
        let a = match &mut *ahead {
            Some(a) if a.epoch == epoch => a,
            _ => {
                // A transaction left open (a failed epoch not yet resolved)
                // is not this epoch's to continue.
                let failed = self.in_transaction.load(Ordering::SeqCst);
                if !failed {
                    producer.context().take_error();
                    if let Err(e) = producer.begin_transaction() {
                        return Err(self.stopped("begin_transaction", &e));
                    }
                    self.in_transaction.store(true, Ordering::SeqCst);
                }
                ahead.insert(Ahead {
                    epoch,
                    sent: vec![0; self.targets.len()],
                    began: Instant::now(),
                    failed,
                })
            }
        };
        if a.failed {
            return Ok(());
        }
        let target = self.targets.get(statement).ok_or_else(|| {
            SluiceError::Internal(format!(
                "output of statement {statement} for {} Kafka topics",
                self.targets.len()
            ))
        })?;
        match target.send_output(&producer, epoch, std::slice::from_ref(rows), None) {
            Ok(()) => {
                a.sent[statement] += 1;
                Ok(())
            }
            Err(e) => {
                a.failed = true;
                self.abort(&producer)?;
                if !matches!(e, SluiceError::External { .. }) {
                    return Err(e);
                }
                tracing::warn!(epoch, error = %e, "sending ahead failed; the transaction was aborted and the epoch's write sends it all again");
                Ok(())
            }
        }
    }

    /// `commit_transaction`, repeated while librdkafka says it is retriable
    /// (a timed-out commit may be retried with the same call).
    /// Retried for at most the transaction timeout: by then the broker has
    /// aborted the transaction anyway.
    fn commit(&self, producer: &SinkProducer) -> std::result::Result<(), KafkaError> {
        retrying("commit_transaction", self.transaction_timeout, || {
            producer.commit_transaction(self.transaction_timeout)
        })
    }

    /// Aborts the failed attempt's transaction. A producer librdkafka
    /// declared dead meanwhile (after a broker restart it once answered
    /// the abort with "invalid state") does not end the query: the epoch
    /// fails as an outage, and the recovery before its retry gives the
    /// transactional id a new producer ([`Self::resolve`]), as a restart
    /// would.
    fn abort(&self, producer: &SinkProducer) -> Result<()> {
        retrying("abort_transaction", self.transaction_timeout, || {
            producer.abort_transaction(self.transaction_timeout)
        })
        .map_err(|e| match self.stopped("abort_transaction", &e) {
            SluiceError::External { .. } => {
                if matches!(classify(&e), ErrorClass::Retriable) && self.brokers_answer(producer) {
                    self.abort_stuck.store(true, Ordering::SeqCst);
                }
                self.config.unreachable(format!(
                    "abort_transaction failed ({e}); the transaction is ended before the epoch \
                     is retried, by a new producer if it cannot be aborted in place"
                ))
            }
            other => other,
        })?;
        self.in_transaction.store(false, Ordering::SeqCst);
        Ok(())
    }
}

/// `op` again while librdkafka says its error is retriable, for at most
/// `limit`: every wait on Kafka is bounded, and the last outcome says why
/// it ended.
fn retrying<T>(
    what: &str,
    limit: Duration,
    mut op: impl FnMut() -> std::result::Result<T, KafkaError>,
) -> std::result::Result<T, KafkaError> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        match op() {
            Err(e)
                if matches!(classify(&e), ErrorClass::Retriable)
                    && std::time::Instant::now() < deadline =>
            {
                tracing::warn!(error = %e, "{what}: retrying");
            }
            other => return other,
        }
    }
}

#[async_trait]
impl Sink for TransactionalSink {
    /// After this returns, every older instance of the query is fenced.
    async fn open(&self) -> Result<()> {
        let inner = &self.0;
        progress_topic::ensure_topic(&inner.config, &inner.progress_topic).await?;
        for target in &inner.targets {
            if let Some(partitions) = target.partitions {
                target.ensure_partitions(partitions).await?;
            }
        }
        if let Some(max) = inner.broker_max_timeout().await? {
            if inner.transaction_timeout > max {
                return Err(SluiceError::config(format!(
                    "'transaction.timeout' is {:?} but the broker allows at most {max:?} \
                     (transaction.max.timeout.ms); lower it",
                    inner.transaction_timeout
                )));
            }
        }
        let inner = Arc::clone(&self.0);
        tokio::task::spawn_blocking(move || inner.init())
            .await
            .map_err(|e| SluiceError::Internal(format!("init task: {e}")))?
    }

    async fn committed_epoch(&self) -> Result<CommittedEpoch> {
        let inner = Arc::clone(&self.0);
        let last = tokio::task::spawn_blocking(move || {
            inner.resolve()?;
            // A foreign transaction on a shared progress topic ends by its
            // producer's timeout; ours is the best guess of it.
            let wait = inner.transaction_timeout.max(inner.config.client.timeout());
            progress_topic::read_last(
                &inner.config,
                &inner.progress_topic,
                &inner.config.query_id,
                wait,
            )
        })
        .await
        .map_err(|e| SluiceError::Internal(format!("recovery task: {e}")))??;
        Ok(CommittedEpoch::Recorded(last.map(|r| r.commit)))
    }

    async fn write_epoch(
        &self,
        commit: &EpochCommit,
        output: &EpochOutput,
        handover: &Handover,
    ) -> Result<()> {
        self.write_epoch_set(commit, std::slice::from_ref(output), handover)
            .await
    }

    async fn write_epoch_set(
        &self,
        commit: &EpochCommit,
        outputs: &[EpochOutput],
        handover: &Handover,
    ) -> Result<()> {
        let inner = Arc::clone(&self.0);
        let (record, outputs, handover) = (commit.clone(), outputs.to_vec(), handover.clone());
        // An epoch without output still commits its progress record, so the
        // next restart does not redo it.
        tokio::task::spawn_blocking(move || inner.commit_epoch(&record, &outputs, &handover))
            .await
            .map_err(|e| SluiceError::Internal(format!("transaction task: {e}")))?
    }

    fn sends_ahead(&self) -> bool {
        true
    }

    /// Side by side, sending ahead lost to whole epochs in the suite (see
    /// `Pipelining`): only `'epoch.pipeline' = 'true'` asks for it.
    fn pipelines_by_default(&self) -> bool {
        false
    }

    async fn send_ahead(&self, epoch: u64, statement: usize, rows: &RecordBatch) -> Result<()> {
        let inner = Arc::clone(&self.0);
        let rows = rows.clone();
        // Encoding and handing records to librdkafka is CPU work, and
        // waits when its queue is full.
        tokio::task::spawn_blocking(move || inner.send_ahead(epoch, statement, &rows))
            .await
            .map_err(|e| SluiceError::Internal(format!("send-ahead task: {e}")))?
    }

    fn accepts_source_commits(&self) -> bool {
        true
    }

    fn records_commits(&self) -> bool {
        true
    }

    /// With the transactional id, which names every epoch's transaction
    /// (the status page shows it with the last commit).
    fn describe(&self) -> String {
        format!(
            "kafka(topic={}, exactly-once, transactional.id={})",
            self.0.topics(),
            self.0.transactional_id
        )
    }
}
