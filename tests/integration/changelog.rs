//! Changelog sources: a table's Debezium change events (inserts, updates
//! that move rows between groups, deletes with their tombstones) read with
//! `format = 'debezium-json'`, aggregated, and checked against DataFusion's
//! batch answer over the table the events leave.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sluice::arrow::array::{Int64Array, RecordBatch, StringArray};
use sluice::arrow::datatypes::{DataType, Field, Schema};
use sluice::broker::{create_topic, fresh_topic};
use sluice::Session;

use crate::kafka::read;
use crate::util::{block_on, broker, property, start_sql, Lcg};

/// The query, over the stream and over the final table alike: a filter
/// that updates move rows in and out of, a HAVING that groups leave, and
/// `min`/`max`, which must come back to a value seen before when an update
/// or delete takes the extreme away.
const QUERY: &str = "SELECT category, count(*) AS n, sum(amount) AS total, min(amount) AS low, \
                     max(amount) AS high FROM items WHERE amount > 20 GROUP BY category \
                     HAVING count(*) > 2";

/// A group's row of [`QUERY`]: (n, total, low, high).
type Totals = (i64, i64, i64, i64);

fn totals(v: &Value) -> Totals {
    let int = |name: &str| v[name].as_i64().unwrap();
    (int("n"), int("total"), int("low"), int("high"))
}

/// The table: id → (category, amount).
type Table = BTreeMap<i64, (String, i64)>;

/// `n` random changes to `table`, as Debezium's JSON events (a delete is
/// followed by its tombstone, as Debezium sends it): mostly inserts at
/// first, then updates (a third move their row to another category) and
/// deletes.
fn changes(table: &mut Table, next_id: &mut i64, rng: &mut Lcg, n: usize) -> Vec<Option<String>> {
    let row = |id: i64, (category, amount): &(String, i64)| json!({"id": id, "category": category, "amount": amount});
    let mut events = Vec::new();
    for _ in 0..n {
        let category = ["a", "b", "c", "d"][rng.next(4) as usize].to_string();
        let amount = rng.next(100) as i64 + 1;
        let pick = rng.next(10);
        if table.is_empty() || pick < 4 {
            let id = *next_id;
            *next_id += 1;
            let after = (category, amount);
            let op = if rng.next(5) == 0 { "r" } else { "c" };
            events.push(Some(
                json!({"before": null, "after": row(id, &after), "op": op}).to_string(),
            ));
            table.insert(id, after);
            continue;
        }
        let keys: Vec<i64> = table.keys().copied().collect();
        let id = keys[rng.next(keys.len() as u64) as usize];
        let before = table[&id].clone();
        if pick < 8 {
            let category = if rng.next(3) == 0 {
                category
            } else {
                before.0.clone()
            };
            let after = (category, amount);
            // Kafka Connect's JSON converter with schemas wraps the event.
            let event = json!({"before": row(id, &before), "after": row(id, &after), "op": "u"});
            let event = if rng.next(2) == 0 {
                json!({"schema": {"type": "struct"}, "payload": event})
            } else {
                event
            };
            events.push(Some(event.to_string()));
            table.insert(id, after);
        } else {
            events.push(Some(
                json!({"before": row(id, &before), "after": null, "op": "d"}).to_string(),
            ));
            events.push(None);
            table.remove(&id);
        }
    }
    events
}

/// Sends `events` (None: a tombstone) keyed by their row's id, as
/// Debezium keys them.
fn send(bootstrap: &str, topic: &str, events: &[Option<String>]) {
    send_keyed(bootstrap, topic, &keyed(events));
}

/// `events` (None: a tombstone, keyed as the event before it) with their
/// row's id as the key.
fn keyed(events: &[Option<String>]) -> Vec<(String, Option<String>)> {
    let mut last_key = String::new();
    events
        .iter()
        .map(|event| {
            if let Some(e) = event {
                let v: Value = serde_json::from_str(e).unwrap();
                let v = v.get("payload").unwrap_or(&v);
                let row = if v["after"].is_null() {
                    &v["before"]
                } else {
                    &v["after"]
                };
                last_key = json!({"id": row["id"]}).to_string();
            }
            (last_key.clone(), event.clone())
        })
        .collect()
}

/// Sends `(key, value)` records (no value: a tombstone), in order.
pub(crate) fn send_keyed(bootstrap: &str, topic: &str, records: &[(String, Option<String>)]) {
    let records: Vec<_> = records
        .iter()
        .map(|(k, v)| (k.clone(), v.clone(), None))
        .collect();
    send_keyed_at(bootstrap, topic, &records);
}

/// Sends `(key, value, timestamp ms)` records (no value: a tombstone; no
/// timestamp: the producer's clock), in order.
pub(crate) fn send_keyed_at(
    bootstrap: &str,
    topic: &str,
    records: &[(String, Option<String>, Option<i64>)],
) {
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    let producer: ThreadedProducer<DefaultProducerContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    for (key, value, timestamp) in records {
        let mut record = BaseRecord::<String, str>::to(topic).key(key);
        if let Some(v) = value {
            record = record.payload(v.as_str());
        }
        if let Some(t) = timestamp {
            record = record.timestamp(*t);
        }
        producer.send(record).map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// A topic as a compacted reader sees it: the last value of each key
/// (both as JSON), tombstones removing it.
pub(crate) async fn compacted(bootstrap: &str, topic: &str) -> BTreeMap<String, Value> {
    let mut last = BTreeMap::new();
    for r in read(bootstrap, topic).await {
        let key = String::from_utf8(r.key.unwrap()).unwrap();
        match r.value.as_deref() {
            Some(v) => {
                last.insert(key, serde_json::from_slice(v).unwrap());
            }
            None => {
                last.remove(&key);
            }
        }
    }
    last
}

/// DataFusion's answer to `sql` over `tables`, each as a table with its
/// columns (`[table, key, text, number]`), a row as JSON.
async fn batch_rows(tables: &[Table], columns: &[[&str; 4]], sql: &str) -> Vec<Value> {
    use sluice::datafusion::prelude::SessionContext;
    let ctx = SessionContext::new();
    for (table, [name, id, text, number]) in tables.iter().zip(columns) {
        let schema = Arc::new(Schema::new(vec![
            Field::new(*id, DataType::Int64, false),
            Field::new(*text, DataType::Utf8, false),
            Field::new(*number, DataType::Int64, false),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from_iter_values(table.keys().copied())),
                Arc::new(StringArray::from_iter_values(
                    table.values().map(|(c, _)| c.as_str()),
                )),
                Arc::new(Int64Array::from_iter_values(
                    table.values().map(|(_, a)| *a),
                )),
            ],
        )
        .unwrap();
        ctx.register_batch(*name, batch).unwrap();
    }
    let mut rows = Vec::new();
    for b in ctx.sql(sql).await.unwrap().collect().await.unwrap() {
        let json = sluice_kafka::Format::Json.encode(&b).unwrap();
        rows.extend(json.rows().map(|row| serde_json::from_slice(row).unwrap()));
    }
    rows
}

/// DataFusion's answer to [`QUERY`] over `table`: category → its row.
async fn batch_answer(table: &Table) -> BTreeMap<String, Totals> {
    batch_rows(
        std::slice::from_ref(table),
        &Changes::Debezium.columns(),
        QUERY,
    )
    .await
    .iter()
    .map(|v| (v["category"].as_str().unwrap().to_string(), totals(v)))
    .collect()
}

/// The totals topic as a compacted reader sees it: category → its row.
async fn latest(bootstrap: &str, topic: &str) -> BTreeMap<String, Totals> {
    compacted(bootstrap, topic)
        .await
        .into_iter()
        .map(|(key, v)| {
            let key: Value = serde_json::from_str(&key).unwrap();
            let category = key["category"].as_str().unwrap().to_string();
            (category, totals(&v))
        })
        .collect()
}

/// Where [`rounds`] gets its changes from.
#[derive(Clone, Copy)]
enum Changes {
    /// A Debezium changelog of `items (id, category, amount)`: inserts,
    /// updates that move rows between categories, deletes.
    Debezium,
    /// An upsert-kafka stream of `users (id, name, v)` keyed by `id`: new
    /// values and deletes of 30 keys (a key often changes, or is deleted
    /// and comes back, within one epoch).
    Upsert,
    /// Two such streams, `users` and `plans (id, name, v)`.
    UpsertPair,
}

impl Changes {
    /// How many input streams.
    fn inputs(self) -> usize {
        match self {
            Changes::UpsertPair => 2,
            _ => 1,
        }
    }

    /// The input streams' declarations, and the sink's connector.
    fn streams(self, inputs: &[String], bootstrap: &str) -> (String, &'static str) {
        let upsert = |name: &str, topic: &str| {
            format!(
                "CREATE TABLE {name} (id BIGINT NOT NULL, name VARCHAR, v BIGINT, \
                 PRIMARY KEY (id) NOT ENFORCED) \
                 WITH ('connector' = 'upsert-kafka', 'topic' = '{topic}', \
                 'properties.bootstrap.servers' = '{bootstrap}');\n"
            )
        };
        match self {
            Changes::Debezium => (
                format!(
                    "CREATE STREAM items (id BIGINT NOT NULL, category VARCHAR, amount BIGINT, \
                     PRIMARY KEY (id) NOT ENFORCED) \
                     WITH (connector = 'kafka', topic = '{}', \
                     'bootstrap.servers' = '{bootstrap}', format = 'debezium-json');\n",
                    inputs[0]
                ),
                "kafka",
            ),
            Changes::Upsert => (upsert("users", &inputs[0]), "upsert-kafka"),
            Changes::UpsertPair => (
                upsert("users", &inputs[0]) + &upsert("plans", &inputs[1]),
                "upsert-kafka",
            ),
        }
    }

    /// The tables' names and columns, for the batch answer.
    fn columns(self) -> Vec<[&'static str; 4]> {
        match self {
            Changes::Debezium => vec![["items", "id", "category", "amount"]],
            Changes::Upsert => vec![["users", "id", "name", "v"]],
            Changes::UpsertPair => vec![["users", "id", "name", "v"], ["plans", "id", "name", "v"]],
        }
    }

    /// One round's records per input, and `tables` changed as they change
    /// them.
    fn round(
        self,
        tables: &mut [Table],
        next_id: &mut i64,
        rng: &mut Lcg,
    ) -> Vec<Vec<(String, Option<String>)>> {
        match self {
            Changes::Debezium => vec![keyed(&changes(&mut tables[0], next_id, rng, 60))],
            Changes::Upsert | Changes::UpsertPair => {
                tables.iter_mut().map(|table| upserts(table, rng)).collect()
            }
        }
    }
}

/// 120 random new values and deletes of 30 keys of an upsert stream, and
/// `table` changed as they change it.
fn upserts(table: &mut Table, rng: &mut Lcg) -> Vec<(String, Option<String>)> {
    upserts_of(table, rng, 120, 30)
}

/// `n` random new values and deletes of `keys` keys of an upsert stream.
fn upserts_of(
    table: &mut Table,
    rng: &mut Lcg,
    n: usize,
    keys: u64,
) -> Vec<(String, Option<String>)> {
    (0..n)
        .map(|_| {
            let id = rng.next(keys) as i64;
            let key = json!({ "id": id }).to_string();
            if rng.next(4) == 0 {
                table.remove(&id);
                return (key, None);
            }
            let (name, v) = (format!("n{}", rng.next(10)), rng.next(100) as i64);
            let row = json!({"id": id, "name": name, "v": v});
            table.insert(id, (name, v));
            (key, Some(row.to_string()))
        })
        .collect()
}

/// Runs `query` over three rounds of random `changes`, each read by a new
/// run of it from its checkpoint into a topic keyed by the query's key, and
/// checks after each that the topic as a compacted reader sees it (each key
/// and value through `output_of`) equals DataFusion's answer over the
/// table the changes leave (each row through `answer_of`).
async fn rounds<K: Ord + std::fmt::Debug, V: PartialEq + std::fmt::Debug>(
    seed: u64,
    changes: Changes,
    query: &str,
    output_of: fn(&Value, &Value) -> (K, V),
    answer_of: fn(&Value) -> (K, V),
) {
    let bootstrap = broker().await;
    let inputs: Vec<String> = (0..changes.inputs())
        .map(|_| fresh_topic("changes"))
        .collect();
    let output = fresh_topic("changes-out");
    for input in &inputs {
        create_topic(&bootstrap, input, 2).await.unwrap();
    }
    create_topic(&bootstrap, &output, 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (stream, sink) = changes.streams(&inputs, &bootstrap);
    let sql = format!(
        "SET 'checkpoint.location' = '{cp}';\n\
         SET 'trigger' = 'available-now';\n\
         {stream}\
         CREATE STREAM out WITH (connector = '{sink}', topic = '{output}', \
           'bootstrap.servers' = '{bootstrap}');\n\
         INSERT INTO out {query};\n",
        cp = dir.path().join("cp").display()
    );
    let mut rng = Lcg(seed);
    let (mut tables, mut next_id) = (vec![Table::new(); inputs.len()], 0);
    for round in 0..3 {
        let records = changes.round(&mut tables, &mut next_id, &mut rng);
        for (records, input) in records.into_iter().zip(&inputs) {
            let (b, t) = (bootstrap.clone(), input.clone());
            tokio::task::spawn_blocking(move || send_keyed(&b, &t, &records))
                .await
                .unwrap();
        }
        let running = start_sql(&Session::new(), &sql).await;
        running.await_termination().await.unwrap();
        let actual: BTreeMap<K, V> = compacted(&bootstrap, &output)
            .await
            .into_iter()
            .map(|(key, v)| output_of(&serde_json::from_str(&key).unwrap(), &v))
            .collect();
        let want: BTreeMap<K, V> = batch_rows(&tables, &changes.columns(), query)
            .await
            .iter()
            .map(answer_of)
            .collect();
        assert_eq!(actual, want, "seed {seed}, after round {round}");
    }
}

#[test]
fn a_group_by_over_debezium_changes_equals_the_batch_answer_over_the_final_table() {
    property(3, |seed| {
        block_on(rounds(
            seed,
            Changes::Debezium,
            QUERY,
            |key, v| (key["category"].as_str().unwrap().to_string(), totals(v)),
            |v| (v["category"].as_str().unwrap().to_string(), totals(v)),
        ))
    });
}

/// Per category, the two rows of highest amount over 20 (ties to the lower
/// id): updates move rows in and out of the filter and between categories,
/// deletes take them away, and the rows after them move up.
const TOP_TWO: &str = "SELECT category, rn, id, amount FROM (SELECT id, category, amount, \
                       ROW_NUMBER() OVER (PARTITION BY category ORDER BY amount DESC, id) AS rn \
                       FROM items WHERE amount > 20) WHERE rn <= 2";

#[test]
fn a_top_n_over_debezium_changes_equals_the_batch_answer_over_the_final_table() {
    type Rank = ((String, i64), (i64, i64));
    fn rank(key: &Value, v: &Value) -> Rank {
        let int = |j: &Value, name: &str| j[name].as_i64().unwrap();
        (
            (
                key["category"].as_str().unwrap().to_string(),
                int(key, "rn"),
            ),
            (int(v, "id"), int(v, "amount")),
        )
    }
    property(3, |seed| {
        block_on(rounds(seed, Changes::Debezium, TOP_TWO, rank, |v| {
            rank(v, v)
        }))
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changelog_streams_are_refused_where_a_change_is_not_a_row() {
    let bootstrap = broker().await;
    let input = fresh_topic("cdc-refused");
    create_topic(&bootstrap, &input, 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let stream = format!(
        "SET 'checkpoint.location' = '{}';\n\
         CREATE STREAM items (id BIGINT NOT NULL, category VARCHAR, amount BIGINT) \
           WITH (connector = 'kafka', topic = '{input}', 'bootstrap.servers' = '{bootstrap}', \
           format = 'debezium-json');\n\
         CREATE STREAM out WITH (connector = 'kafka', topic = 'never', \
           'bootstrap.servers' = '{bootstrap}');\n",
        dir.path().display()
    );
    for (query, problem) in [
        ("SELECT id, amount FROM items", "without aggregating it"),
        (
            "SELECT category, count(*) AS n FROM (SELECT category FROM items) GROUP BY category",
            "leaves out the changes' signs",
        ),
    ] {
        let sql = format!("{stream}INSERT INTO out {query};\n");
        let error = match Session::new().sql(&sql).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{query} was accepted"),
        };
        assert!(error.contains(problem), "{query}: {error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_by_over_debezium_changes_is_exact_through_kill_9() {
    use crate::util::{crash_seed, kill_9_five_times_then_finish};
    let bootstrap = broker().await;
    let (input, output) = (fresh_topic("cdc-kill"), fresh_topic("cdc-kill-totals"));
    create_topic(&bootstrap, &input, 2).await.unwrap();
    create_topic(&bootstrap, &output, 1).await.unwrap();
    let mut rng = Lcg(crash_seed("kill -9", || 0xcdc));
    let (mut table, mut next_id) = (Table::new(), 0);
    let events = changes(&mut table, &mut next_id, &mut rng, 20_000);
    {
        let (b, t) = (bootstrap.clone(), input.clone());
        tokio::task::spawn_blocking(move || send(&b, &t, &events))
            .await
            .unwrap();
    }
    let want = batch_answer(&table).await;
    let dir = tempfile::tempdir().unwrap();
    let sql = dir.path().join("cdc.sql");
    std::fs::write(
        &sql,
        format!(
            "SET 'checkpoint.location' = '{cp}';\n\
             SET 'trigger.interval' = '50 ms';\n\
             CREATE STREAM items (id BIGINT NOT NULL, category VARCHAR, amount BIGINT) \
               WITH (connector = 'kafka', topic = '{input}', 'bootstrap.servers' = '{bootstrap}', \
               format = 'debezium-json', 'max-records-per-epoch' = '100');\n\
             CREATE STREAM totals WITH (connector = 'kafka', topic = '{output}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             INSERT INTO totals {QUERY};\n",
            cp = dir.path().join("cp").display()
        ),
    )
    .unwrap();
    let command = || {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.arg("run").arg(&sql).stdout(std::process::Stdio::null());
        cmd
    };

    // Killed at random moments while it works through the changes; each
    // run resumes from the last committed epoch. Epochs of 100 changes,
    // each at least the 50 ms trigger: the work takes over 10 s, longer
    // than the kills can leave the runs (at most 14 s, starts included),
    // however fast an epoch computes.
    kill_9_five_times_then_finish(command, &mut rng, &want, || latest(&bootstrap, &output)).await;
}

/// A copy of an upsert stream's rows, keyed by id: id → (name, v).
type Copied = (i64, (String, i64));

fn copied(key: &Value, v: &Value) -> Copied {
    (
        key["id"].as_i64().unwrap(),
        (
            v["name"].as_str().unwrap().to_string(),
            v["v"].as_i64().unwrap(),
        ),
    )
}

#[test]
fn upsert_kafka_into_an_upsert_sink_is_the_latest_value_of_each_key() {
    property(3, |seed| {
        block_on(rounds(
            seed,
            Changes::Upsert,
            "SELECT id, name, v FROM users",
            copied,
            |v| copied(v, v),
        ))
    });
}

/// A filter over an upsert stream keeps the output a table: a compacted
/// reader sees each key's latest value where the filter holds on it, and
/// no key whose latest value fails it (deleted, or never written).
#[test]
fn a_filtered_upsert_stream_is_the_latest_value_of_each_key_that_passes() {
    property(3, |seed| {
        block_on(rounds(
            seed,
            Changes::Upsert,
            "SELECT id, name, v FROM users WHERE v >= 40 AND name <> 'n7'",
            copied,
            |v| copied(v, v),
        ))
    });
}

/// A GROUP BY over an upsert stream follows its keys' updates and deletes
/// (each key's previous value kept and taken back).
#[test]
fn an_aggregation_over_an_upsert_stream_equals_the_batch_answer_over_the_latest_values() {
    type PerName = (String, (i64, i64, i64));
    fn per_name(key: &Value, v: &Value) -> PerName {
        let int = |name: &str| v[name].as_i64().unwrap();
        (
            key["name"].as_str().unwrap().to_string(),
            (int("n"), int("total"), int("top")),
        )
    }
    property(3, |seed| {
        block_on(rounds(
            seed,
            Changes::Upsert,
            "SELECT name, count(*) AS n, sum(v) AS total, max(v) AS top FROM users GROUP BY name",
            per_name,
            |v| per_name(v, v),
        ))
    });
}

/// A Top-N over an upsert stream: per name, the two users of highest `v`
/// (ties to the lower id), as keys change and leave.
#[test]
fn a_top_n_over_an_upsert_stream_equals_the_batch_answer_over_the_latest_values() {
    type Ranked = ((String, i64), (i64, i64));
    fn ranked(key: &Value, v: &Value) -> Ranked {
        let int = |j: &Value, name: &str| j[name].as_i64().unwrap();
        (
            (key["name"].as_str().unwrap().to_string(), int(key, "rn")),
            (int(v, "id"), int(v, "v")),
        )
    }
    property(3, |seed| {
        block_on(rounds(
            seed,
            Changes::Upsert,
            "SELECT name, rn, id, v FROM (SELECT id, name, v, ROW_NUMBER() OVER \
             (PARTITION BY name ORDER BY v DESC, id) AS rn FROM users) WHERE rn <= 2",
            ranked,
            |v| ranked(v, v),
        ))
    });
}

/// A Debezium stream declared with its table's key (PRIMARY KEY (id) NOT ENFORCED, its 'key.fields'),
/// filtered: the output is a table keyed by id, each row's latest version
/// where the filter holds on it. An update that moves a row out of the
/// filter deletes it downstream, and a delete does.
#[test]
fn a_filtered_debezium_stream_is_the_latest_row_of_each_key_that_passes() {
    type Item = (i64, (String, i64));
    fn item(key: &Value, v: &Value) -> Item {
        (
            key["id"].as_i64().unwrap(),
            (
                v["category"].as_str().unwrap().to_string(),
                v["amount"].as_i64().unwrap(),
            ),
        )
    }
    property(3, |seed| {
        for query in [
            "SELECT id, category, upper(category) AS shout, amount FROM items WHERE amount > 20",
            // Every column, the Kafka ones too (left out of the answer).
            "SELECT * FROM items WHERE amount > 20",
        ] {
            block_on(rounds(seed, Changes::Debezium, query, item, |v| item(v, v)));
        }
    });
}

/// A join's output row as (its key, the whole row), both as JSON objects
/// without their null fields (an encoder may write them or leave them
/// out).
fn joined(key: &Value, v: &Value) -> (String, Value) {
    let present = |j: &Value| -> Value {
        let fields = j.as_object().cloned().unwrap_or_default();
        Value::Object(fields.into_iter().filter(|(_, f)| !f.is_null()).collect())
    };
    (present(key).to_string(), present(v))
}

/// Each item beside its category's highest amount over 50 (an aggregation
/// of the same changes), padded with nulls while its category has none:
/// a left join of a Debezium changelog with a changing aggregation, keyed
/// by the item's id (the stream's 'key.fields').
#[test]
fn a_left_join_of_debezium_changes_with_their_aggregation_equals_the_batch_answer() {
    const JOINED: &str = "SELECT i.id, i.category, i.amount, c.top FROM items i LEFT JOIN \
                          (SELECT category, max(amount) AS top FROM items WHERE amount > 50 \
                          GROUP BY category) c ON i.category = c.category WHERE i.amount > 20";
    property(3, |seed| {
        block_on(rounds(seed, Changes::Debezium, JOINED, joined, |v| {
            joined(&json!({ "id": v["id"] }), v)
        }))
    });
}

/// `SELECT *` over a join of Debezium changes with their aggregation: the
/// output holds every column of both inputs (the Kafka ones too) but not
/// the changes' signs, keyed by the item's id.
#[test]
fn a_join_of_debezium_changes_selecting_every_column_leaves_the_signs_out() {
    type Row = (i64, (String, i64, i64));
    fn row(key: &Value, v: &Value) -> Row {
        assert!(
            v.get("__sluice_sign").is_none(),
            "a sign in the output: {v}"
        );
        let int = |name: &str| v[name].as_i64().unwrap();
        (
            key["id"].as_i64().unwrap(),
            (
                v["category"].as_str().unwrap().to_string(),
                int("amount"),
                int("top"),
            ),
        )
    }
    const JOINED: &str = "SELECT * FROM items i JOIN (SELECT category AS c, max(amount) AS top \
                          FROM items GROUP BY category) m ON i.category = m.c WHERE i.amount > 20";
    property(2, |seed| {
        block_on(rounds(seed, Changes::Debezium, JOINED, row, |v| {
            row(&json!({ "id": v["id"] }), v)
        }))
    });
}

/// Two upsert streams full outer joined on a column that is neither's key:
/// each pair of a user and a plan of one name, and the users and plans of
/// no common name alone, keyed by both ids as keys change names, leave and
/// come back.
#[test]
fn a_full_outer_join_of_two_upsert_streams_equals_the_batch_answer_over_the_latest_values() {
    const JOINED: &str = "SELECT u.id AS uid, p.id AS pid, u.name AS uname, p.name AS pname, \
                          u.v AS uv, p.v AS pv FROM users u FULL JOIN plans p ON u.name = p.name \
                          AND p.v > 10";
    property(3, |seed| {
        block_on(rounds(seed, Changes::UpsertPair, JOINED, joined, |v| {
            joined(&json!({ "uid": v["uid"], "pid": v["pid"] }), v)
        }))
    });
}

/// An upsert stream filtered and left joined with another on its key,
/// through five kills with SIGKILL: the compacted output equals the batch
/// answer over both streams' latest values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_upsert_stream_joined_with_another_is_exact_through_kill_9() {
    use crate::util::{crash_seed, kill_9_five_times_then_finish};
    const JOINED: &str = "SELECT u.id AS uid, u.name, u.v, p.id AS pid, p.v AS pv FROM users u \
                          LEFT JOIN plans p ON u.id = p.id AND p.v > 10 WHERE u.v > 20";
    let bootstrap = broker().await;
    let inputs = [fresh_topic("upsert-kill"), fresh_topic("upsert-kill")];
    let output = fresh_topic("upsert-kill-joined");
    for t in inputs.iter().chain([&output]) {
        create_topic(&bootstrap, t, 2).await.unwrap();
    }
    let mut rng = Lcg(crash_seed("kill -9", || 0x0b5e));
    let mut tables = vec![Table::new(), Table::new()];
    for (table, input) in tables.iter_mut().zip(&inputs) {
        let records = upserts_of(table, &mut rng, 10_000, 400);
        let (b, t) = (bootstrap.clone(), input.clone());
        tokio::task::spawn_blocking(move || send_keyed(&b, &t, &records))
            .await
            .unwrap();
    }
    let columns = Changes::UpsertPair.columns();
    let want: BTreeMap<String, Value> = batch_rows(&tables, &columns, JOINED)
        .await
        .iter()
        .map(|v| joined(&json!({ "uid": v["uid"] }), v))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let sql = dir.path().join("joined.sql");
    let (streams, _) = Changes::UpsertPair.streams(&inputs, &bootstrap);
    // Epochs of 50 changes per input, each at least the 50 ms trigger:
    // the work outlasts the kills however fast an epoch computes.
    let limited = streams.replace(
        "WITH ('connector' = 'upsert-kafka',",
        "WITH ('connector' = 'upsert-kafka', 'max-records-per-epoch' = '50',",
    );
    assert_ne!(limited, streams, "the streams' epochs are bounded");
    let streams = limited;
    std::fs::write(
        &sql,
        format!(
            "SET 'checkpoint.location' = '{cp}';\n\
             SET 'trigger.interval' = '50 ms';\n\
             {streams}\
             CREATE STREAM joined WITH (connector = 'upsert-kafka', topic = '{output}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             INSERT INTO joined {JOINED};\n",
            cp = dir.path().join("cp").display()
        ),
    )
    .unwrap();
    let command = || {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.arg("run").arg(&sql).stdout(std::process::Stdio::null());
        cmd
    };
    let output_now = || async {
        compacted(&bootstrap, &output)
            .await
            .into_iter()
            .map(|(key, v)| joined(&serde_json::from_str(&key).unwrap(), &v))
            .collect::<BTreeMap<String, Value>>()
    };
    kill_9_five_times_then_finish(command, &mut rng, &want, output_now).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upsert_streams_are_refused_where_they_cannot_run_yet() {
    let bootstrap = broker().await;
    let input = fresh_topic("upserts-refused");
    create_topic(&bootstrap, &input, 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let stream = format!(
        "SET 'checkpoint.location' = '{}';\n\
         CREATE STREAM users (id BIGINT NOT NULL, name VARCHAR, v BIGINT) \
           WITH (connector = 'upsert-kafka', topic = '{input}', \
           'bootstrap.servers' = '{bootstrap}', 'key.fields' = 'id');\n\
         CREATE STREAM out WITH (connector = 'kafka', topic = 'never', \
           'bootstrap.servers' = '{bootstrap}');\n",
        dir.path().display()
    );
    for (query, problem) in [
        (
            "SELECT u.v FROM users u JOIN users w ON u.id = w.v",
            "and it leaves out w.id",
        ),
        (
            "SELECT name, v FROM users",
            "leaves out key columns of an upsert stream (id)",
        ),
    ] {
        let sql = format!("{stream}INSERT INTO out {query};\n");
        let error = match Session::new().sql(&sql).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{query} was accepted"),
        };
        assert!(error.contains(problem), "{query}: {error}");
    }
    let no_key = format!(
        "SET 'checkpoint.location' = '{}';\n\
         CREATE STREAM users (id BIGINT NOT NULL, v BIGINT) WITH (connector = 'upsert-kafka', \
         topic = '{input}', 'bootstrap.servers' = '{bootstrap}');\n\
         CREATE STREAM out WITH (connector = 'kafka', topic = 'never', \
           'bootstrap.servers' = '{bootstrap}');\n\
         INSERT INTO out SELECT id, v FROM users;\n",
        dir.path().display()
    );
    let error = Session::new()
        .sql(&no_key)
        .await
        .err()
        .map(|e| e.to_string());
    let error = error.unwrap_or_default();
    assert!(
        error.contains("needs the columns its message keys hold"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_events_without_op_or_before_follow_format_on_error() {
    let bootstrap = broker().await;
    let (input, output, letters) = (
        fresh_topic("cdc-bad"),
        fresh_topic("cdc-bad-totals"),
        fresh_topic("cdc-bad-letters"),
    );
    for t in [&input, &output, &letters] {
        create_topic(&bootstrap, t, 1).await.unwrap();
    }
    let bad = [
        json!({"before": null, "after": {"id": 2, "category": "a", "amount": 50}}).to_string(),
        json!({"before": null, "after": {"id": 1, "category": "a", "amount": 70}, "op": "u"})
            .to_string(),
    ];
    let events = vec![
        Some(
            json!({"before": null, "after": {"id": 1, "category": "a", "amount": 30}, "op": "c"})
                .to_string(),
        ),
        Some(bad[0].clone()),
        Some(bad[1].clone()),
        Some(
            json!({"before": null, "after": {"id": 3, "category": "a", "amount": 40}, "op": "c"})
                .to_string(),
        ),
        Some(
            json!({"before": null, "after": {"id": 4, "category": "a", "amount": 25}, "op": "c"})
                .to_string(),
        ),
    ];
    {
        let (b, t) = (bootstrap.clone(), input.clone());
        tokio::task::spawn_blocking(move || send(&b, &t, &events))
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let sql = |name: &str, on_error: &str| {
        format!(
            "SET 'checkpoint.location' = '{cp}';\n\
             SET 'trigger' = 'available-now';\n\
             CREATE STREAM items (id BIGINT NOT NULL, category VARCHAR, amount BIGINT) \
               WITH (connector = 'kafka', topic = '{input}', 'bootstrap.servers' = '{bootstrap}', \
               format = 'debezium-json', 'format.on-error' = '{on_error}');\n\
             CREATE STREAM totals WITH (connector = 'kafka', topic = '{output}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             INSERT INTO totals {QUERY};\n",
            cp = dir.path().join(name).display()
        )
    };
    // 'fail': the event without 'op' stops the query, named.
    let query = start_sql(&Session::new(), &sql("fail", "fail")).await;
    let error = query.await_termination().await.unwrap_err().to_string();
    for part in [
        format!("topic '{input}'"),
        "offset 1".to_string(),
        "without 'op'".to_string(),
    ] {
        assert!(error.contains(&part), "'{part}' in: {error}");
    }
    // 'skip': both bad events dropped and counted (and the tombstone-free
    // input has no other skipped record).
    let query = start_sql(&Session::new(), &sql("skip", "skip")).await;
    query.await_termination().await.unwrap();
    assert_eq!(crate::util::skipped(&query.recent_progress()), 2);

    // 'dead-letter': both bad events kept byte for byte with the reason;
    // the others counted (30 + 40 + 25 in 'a', from 25 to 40).
    let with_letters = sql("letters", "dead-letter").replace(
        "'format.on-error' = 'dead-letter'",
        &format!("'format.on-error' = 'dead-letter', 'dead-letter.topic' = '{letters}'"),
    );
    start_sql(&Session::new(), &with_letters)
        .await
        .await_termination()
        .await
        .unwrap();
    let dead = read(&bootstrap, &letters).await;
    let values: Vec<String> = dead
        .iter()
        .map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())
        .collect();
    assert_eq!(values, bad);
    let reason = |i: usize| {
        let (_, v) = dead[i]
            .headers
            .iter()
            .find(|(k, _)| k == "sluice.error")
            .unwrap();
        String::from_utf8_lossy(v).into_owned()
    };
    assert!(reason(0).contains("without 'op'"), "{}", reason(0));
    assert!(
        reason(1).contains("without its 'before' row"),
        "{}",
        reason(1)
    );
    let mut want = BTreeMap::new();
    want.insert("a".to_string(), (3, 95, 25, 40));
    assert_eq!(latest(&bootstrap, &output).await, want);
}

/// A key's changes keep their order from the upsert source to the upsert
/// sink within one epoch, whatever bytes encode the key: `{"id":1}` set,
/// then `{ "id": 1 }` deleted, then `{"id":1}` set again ends set (keys
/// told apart by their bytes once ended it deleted), and set then deleted
/// ends deleted; also when a bad record in the epoch has it decoded one
/// record at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_changes_keep_their_order_within_an_epoch_whatever_bytes_encode_the_key() {
    let bootstrap = broker().await;
    for bad in [false, true] {
        let (input, output) = (fresh_topic("upsert-order"), fresh_topic("upsert-order-out"));
        create_topic(&bootstrap, &input, 1).await.unwrap();
        create_topic(&bootstrap, &output, 1).await.unwrap();
        let row = |id: i64, v: i64| Some(format!(r#"{{"id": {id}, "name": "n", "v": {v}}}"#));
        let mut records = vec![
            (r#"{"id":1}"#.to_string(), row(1, 1)),
            (r#"{ "id": 1 }"#.to_string(), None),
            (r#"{"id":1}"#.to_string(), row(1, 2)),
            (r#"{"id":2}"#.to_string(), row(2, 1)),
            (r#"{"id": 2}"#.to_string(), None),
            (r#"{"id":3}"#.to_string(), None),
            (r#"{"id": 3}"#.to_string(), row(3, 7)),
        ];
        if bad {
            records.insert(3, (r#"{"id":9}"#.to_string(), Some("{oops".to_string())));
        }
        let (b, t) = (bootstrap.clone(), input.clone());
        tokio::task::spawn_blocking(move || send_keyed(&b, &t, &records))
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let sql = format!(
            "SET 'checkpoint.location' = '{cp}';\n\
             SET 'trigger' = 'available-now';\n\
             CREATE TABLE users (id BIGINT NOT NULL, name VARCHAR, v BIGINT, \
               PRIMARY KEY (id) NOT ENFORCED) \
               WITH ('connector' = 'upsert-kafka', 'topic' = '{input}', \
               'properties.bootstrap.servers' = '{bootstrap}', 'format.on-error' = 'skip');\n\
             CREATE STREAM out WITH (connector = 'upsert-kafka', topic = '{output}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             INSERT INTO out SELECT id, name, v FROM users;\n",
            cp = dir.path().join("cp").display()
        );
        let running = start_sql(&Session::new(), &sql).await;
        running.await_termination().await.unwrap();
        assert_eq!(running.recent_progress().len(), 1, "one epoch");
        let actual: BTreeMap<i64, i64> = compacted(&bootstrap, &output)
            .await
            .into_values()
            .map(|v| (v["id"].as_i64().unwrap(), v["v"].as_i64().unwrap()))
            .collect();
        assert_eq!(
            actual,
            BTreeMap::from([(1, 2), (3, 7)]),
            "bad record: {bad}"
        );
    }
}
