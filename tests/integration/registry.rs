//! `format = 'avro-confluent'` against a real schema registry
//! (`scripts/registry`) with Confluent's own Python serializers on both
//! ends (`scripts/confluent-client`): records produced under two schema
//! versions read into the declared columns, Sluice's output read back by
//! Confluent's deserializer, and each way a record or the registry can be
//! wrong.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use sluice::broker::{create_topic, fresh_topic};
use sluice::Session;

use crate::kafka::read;
use crate::util::{broker, confluent_client, schema_registry, start_sql, tls_schema_registry};

/// Version 1 of the producers' schema.
const V1: &str = r#"{"type": "record", "name": "Bid", "namespace": "demo", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"}]}"#;

/// Version 2: `price` added with a default (a backward-compatible change).
const V2: &str = r#"{"type": "record", "name": "Bid", "namespace": "demo", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "price", "type": "double", "default": 1.5}]}"#;

/// Version 3, registered after the query started: `note` added too.
const V3: &str = r#"{"type": "record", "name": "Bid", "namespace": "demo", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "price", "type": "double", "default": 1.5},
    {"name": "note", "type": "string", "default": ""}]}"#;

fn schema_file(dir: &Path, name: &str, schema: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, schema).unwrap();
    path.display().to_string()
}

/// Produces `rows` (JSON objects) to `topic` with Confluent's serializer
/// under `schema`, keyed by `id`.
async fn produce(bootstrap: &str, registry: &str, topic: &str, schema: &str, rows: &[Value]) {
    produce_as("avro", bootstrap, registry, topic, schema, rows).await
}

/// [`produce`] in `format` (`avro` or `protobuf`).
async fn produce_as(
    format: &str,
    bootstrap: &str,
    registry: &str,
    topic: &str,
    schema: &str,
    rows: &[Value],
) {
    let lines: String = rows.iter().map(|r| format!("{r}\n")).collect();
    let out = confluent_client(
        [
            "produce",
            "--format",
            format,
            "--bootstrap",
            bootstrap,
            "--registry",
            registry,
            "--topic",
            topic,
            "--schema",
            schema,
            "--key-field",
            "id",
        ]
        .map(String::from)
        .to_vec(),
        lines,
    )
    .await;
    assert_eq!(out, [rows.len().to_string()], "every row was delivered");
}

/// The values of `topic` as Confluent's deserializer reads them (with
/// `keys`, `{"key": ..., "value": ...}`), by `id`.
async fn consume(
    bootstrap: &str,
    registry: &str,
    topic: &str,
    expect: usize,
    keys: bool,
) -> Vec<Value> {
    consume_as("avro", bootstrap, registry, topic, expect, keys).await
}

/// [`consume`] in `format` (`avro` or `protobuf`).
async fn consume_as(
    format: &str,
    bootstrap: &str,
    registry: &str,
    topic: &str,
    expect: usize,
    keys: bool,
) -> Vec<Value> {
    let expect = expect.to_string();
    let mut args = vec![
        "consume",
        "--format",
        format,
        "--bootstrap",
        bootstrap,
        "--registry",
        registry,
        "--topic",
        topic,
        "--expect",
        &expect,
        "--timeout",
        "60",
    ];
    if keys {
        args.push("--key-avro");
    }
    let mut rows: Vec<Value> =
        confluent_client(args.into_iter().map(String::from).collect(), String::new())
            .await
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    rows.sort_by_key(|r| r["id"].as_i64().or(r["key"]["id"].as_i64()));
    rows
}

fn bid(id: i64, price: Option<f64>) -> Value {
    let mut row = json!({"id": id, "name": format!("n{id}")});
    if let Some(p) = price {
        row["price"] = json!(p);
    }
    row
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_confluent_reads_two_schema_versions_and_confluents_deserializer_reads_the_output() {
    let bootstrap = broker().await;
    let registry = schema_registry().await;
    let (input, output, copy) = (
        fresh_topic("cf-in"),
        fresh_topic("cf-out"),
        fresh_topic("cf-copy"),
    );
    create_topic(&bootstrap, &input, 2).await.unwrap();
    create_topic(&bootstrap, &output, 1).await.unwrap();
    create_topic(&bootstrap, &copy, 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2, v3) = (
        schema_file(dir.path(), "v1.avsc", V1),
        schema_file(dir.path(), "v2.avsc", V2),
        schema_file(dir.path(), "v3.avsc", V3),
    );

    // Rows 0..30 under version 1, then the subject becomes BACKWARD
    // compatible and rows 30..60 arrive under version 2.
    let old: Vec<Value> = (0..30).map(|i| bid(i, None)).collect();
    produce(&bootstrap, &registry, &input, &v1, &old).await;
    let subject = format!("{input}-value");
    let args = [
        "compatibility",
        "--registry",
        &registry,
        "--subject",
        &subject,
        "--level",
        "BACKWARD",
    ];
    confluent_client(args.map(String::from).to_vec(), String::new()).await;
    let new: Vec<Value> = (30..60).map(|i| bid(i, Some(i as f64 * 0.25))).collect();
    produce(&bootstrap, &registry, &input, &v2, &new).await;

    // One stream declares its columns (the reader schema is version 2:
    // version 1's rows read `price` as its default); one takes them from
    // the registry.
    let session = Session::new();
    let sql = format!(
        "SET 'checkpoint.location' = '{cp}';\n\
         SET 'trigger.interval' = '200 ms';\n\
         CREATE STREAM bids (id BIGINT NOT NULL, name VARCHAR, price DOUBLE) \
           WITH (connector = 'kafka', topic = '{input}', 'bootstrap.servers' = '{bootstrap}', \
           format = 'avro-confluent', 'avro-confluent.url' = '{registry}');\n\
         CREATE STREAM priced WITH (connector = 'kafka', topic = '{output}', \
           'bootstrap.servers' = '{bootstrap}', format = 'avro-confluent', \
           'avro-confluent.url' = '{registry}');\n\
         INSERT INTO priced SELECT id, name, price, id * 2 AS twice FROM bids;\n",
        cp = dir.path().join("priced").display()
    );
    let query = start_sql(&session, &sql).await;

    // Version 3 is registered while the query runs: its rows have a field
    // the reader schema does not know, and read without it.
    let newer: Vec<Value> = (60..90)
        .map(|i| {
            let mut row = bid(i, Some(i as f64 * 0.25));
            row["note"] = json!("later");
            row
        })
        .collect();
    produce(&bootstrap, &registry, &input, &v3, &newer).await;

    let got = consume(&bootstrap, &registry, &output, 90, false).await;
    query.stop().await.unwrap();
    let want: Vec<Value> = (0..90)
        .map(|i| {
            let price = if i < 30 { 1.5 } else { i as f64 * 0.25 };
            json!({"id": i, "name": format!("n{i}"), "price": price, "twice": i * 2})
        })
        .collect();
    assert_eq!(got, want);

    // The sink registered its schema under <topic>-value, and each output
    // record names it.
    let records = read(&bootstrap, &output).await;
    assert_eq!(records.len(), 90, "each row once");
    let id_bytes = records[0].value.as_deref().unwrap()[..5].to_vec();
    assert_eq!(id_bytes[0], 0, "the Confluent magic byte");
    assert!(records
        .iter()
        .all(|r| r.value.as_deref().unwrap()[..5] == id_bytes[..]));

    // No columns declared: they are the latest version's (version 3).
    let session = Session::new();
    let sql = format!(
        "SET 'checkpoint.location' = '{cp}';\n\
         SET 'trigger' = 'available-now';\n\
         CREATE STREAM everything WITH (connector = 'kafka', topic = '{input}', \
           'bootstrap.servers' = '{bootstrap}', format = 'avro-confluent', \
           'avro-confluent.url' = '{registry}');\n\
         CREATE STREAM copied WITH (connector = 'kafka', topic = '{copy}', \
           'bootstrap.servers' = '{bootstrap}');\n\
         INSERT INTO copied SELECT id, name, price, note FROM everything;\n",
        cp = dir.path().join("copy").display()
    );
    start_sql(&session, &sql)
        .await
        .await_termination()
        .await
        .unwrap();
    let mut copied: Vec<Value> = read(&bootstrap, &copy)
        .await
        .iter()
        .map(|r| serde_json::from_slice(r.value.as_deref().unwrap()).unwrap())
        .collect();
    copied.sort_by_key(|r| r["id"].as_i64());
    let want: Vec<Value> = (0..90)
        .map(|i| {
            let price = if i < 30 { 1.5 } else { i as f64 * 0.25 };
            let note = if i < 60 { "" } else { "later" };
            json!({"id": i, "name": format!("n{i}"), "price": price, "note": note})
        })
        .collect();
    assert_eq!(copied, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_confluent_reads_two_schema_versions_and_confluents_deserializer_reads_the_output()
{
    let bootstrap = broker().await;
    let registry = schema_registry().await;
    let (input, output) = (fresh_topic("pb-in"), fresh_topic("pb-out"));
    create_topic(&bootstrap, &input, 2).await.unwrap();
    create_topic(&bootstrap, &output, 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let v1 = schema_file(
        dir.path(),
        "v1.proto",
        "syntax = \"proto3\";\npackage demo;\nmessage Bid { int64 id = 1; string name = 2; }\n",
    );
    let v2 = schema_file(
        dir.path(),
        "v2.proto",
        "syntax = \"proto3\";\npackage demo;\n\
         message Bid { int64 id = 1; string name = 2; double price = 3; }\n",
    );
    // Confluent's Protobuf serializer, version 1 then version 2 (a field
    // added: Protobuf's compatible change).
    let old: Vec<Value> = (0..20).map(|i| bid(i, None)).collect();
    produce_as("protobuf", &bootstrap, &registry, &input, &v1, &old).await;
    let new: Vec<Value> = (20..40).map(|i| bid(i, Some(i as f64 * 0.25))).collect();
    produce_as("protobuf", &bootstrap, &registry, &input, &v2, &new).await;

    run_to_end(&format!(
        "SET 'checkpoint.location' = '{cp}';\n\
         SET 'trigger' = 'available-now';\n\
         CREATE STREAM bids (id BIGINT NOT NULL, name VARCHAR, price DOUBLE) \
           WITH (connector = 'kafka', topic = '{input}', 'bootstrap.servers' = '{bootstrap}', \
           format = 'protobuf-confluent', 'protobuf-confluent.url' = '{registry}');\n\
         CREATE STREAM priced WITH (connector = 'kafka', topic = '{output}', \
           'bootstrap.servers' = '{bootstrap}', format = 'protobuf-confluent', \
           'protobuf-confluent.url' = '{registry}');\n\
         INSERT INTO priced SELECT id, name, price, id * 2 AS twice FROM bids;\n",
        cp = dir.path().join("cp").display()
    ))
    .await;

    // Confluent's deserializer reads Sluice's output by the schema Sluice
    // registered. Version 1's records have no price: a null, which the
    // optional field leaves unset.
    let got = consume_as("protobuf", &bootstrap, &registry, &output, 40, false).await;
    let want: Vec<Value> = (0..40)
        .map(|i| {
            let mut row = json!({"id": i, "name": format!("n{i}"), "twice": i * 2});
            if i >= 20 {
                row["price"] = json!(i as f64 * 0.25);
            }
            row
        })
        .collect();
    assert_eq!(got, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_over_tls_is_trusted_through_its_ca_and_refused_without() {
    let bootstrap = broker().await;
    let (registry, ca) = tls_schema_registry().await;
    assert!(registry.starts_with("https://"), "{registry}");
    let (input, avro, back) = (
        fresh_topic("tls-in"),
        fresh_topic("tls-avro"),
        fresh_topic("tls-back"),
    );
    for t in [&input, &avro, &back] {
        create_topic(&bootstrap, t, 1).await.unwrap();
    }
    let rows: Vec<Value> = (0..10).map(|i| bid(i, None)).collect();
    {
        let (b, t) = (bootstrap.clone(), input.clone());
        let values: Vec<Vec<u8>> = rows.iter().map(|r| r.to_string().into_bytes()).collect();
        tokio::task::spawn_blocking(move || send_raw(&b, &t, &values))
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let trusted = format!(
        "format = 'avro-confluent', 'avro-confluent.url' = '{registry}', \
         'avro-confluent.ssl.ca.location' = '{ca}'"
    );
    // The sink registers its schema over TLS; a stream reads it back.
    for (name, from, from_format, to, to_format) in [
        (
            "write",
            &input,
            "format = 'json'".to_string(),
            &avro,
            trusted.clone(),
        ),
        (
            "read",
            &avro,
            trusted.clone(),
            &back,
            "format = 'json'".to_string(),
        ),
    ] {
        run_to_end(&format!(
            "SET 'checkpoint.location' = '{cp}';\nSET 'trigger' = 'available-now';\n\
             CREATE STREAM src (id BIGINT NOT NULL, name VARCHAR) WITH (connector = 'kafka', \
               topic = '{from}', 'bootstrap.servers' = '{bootstrap}', {from_format});\n\
             CREATE STREAM dst WITH (connector = 'kafka', topic = '{to}', \
               'bootstrap.servers' = '{bootstrap}', {to_format});\n\
             INSERT INTO dst SELECT id, name FROM src;\n",
            cp = dir.path().join(name).display()
        ))
        .await;
    }
    assert_eq!(json_values(&bootstrap, &back).await, rows);

    // Without the CA the registry's certificate is not trusted: the
    // stream fails, naming the registry and why.
    let sql = format!(
        "SET 'checkpoint.location' = '{cp}';\n\
         CREATE STREAM src (id BIGINT NOT NULL, name VARCHAR) WITH (connector = 'kafka', \
           topic = '{avro}', 'bootstrap.servers' = '{bootstrap}', format = 'avro-confluent', \
           'avro-confluent.url' = '{registry}', 'connect.timeout' = '2 s');\n\
         CREATE STREAM dst WITH (connector = 'kafka', topic = '{back}', \
           'bootstrap.servers' = '{bootstrap}');\n\
         INSERT INTO dst SELECT id, name FROM src;\n",
        cp = dir.path().join("untrusted").display()
    );
    let error = Session::new().sql(&sql).await.err().map(|e| e.to_string());
    let error = error.expect("an untrusted registry is refused");
    assert!(
        error.contains(&format!("schema registry '{registry}'")),
        "{error}"
    );
    assert!(error.to_lowercase().contains("certificate"), "{error}");
}

/// Runs `sql` (one query, available-now) to its end.
async fn run_to_end(sql: &str) {
    start_sql(&Session::new(), sql)
        .await
        .await_termination()
        .await
        .unwrap();
}

/// The JSON values of `topic`, by `id`.
async fn json_values(bootstrap: &str, topic: &str) -> Vec<Value> {
    let mut rows: Vec<Value> = read(bootstrap, topic)
        .await
        .iter()
        .map(|r| serde_json::from_slice(r.value.as_deref().unwrap()).unwrap())
        .collect();
    rows.sort_by_key(|r| {
        r["id"]
            .as_i64()
            .or(r["id"].as_str().and_then(|s| s.parse().ok()))
    });
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_in_avro_confluent_or_raw_and_values_without_the_key_fields() {
    let bootstrap = broker().await;
    let registry = schema_registry().await;
    let (input, keyed, back, raw_back) = (
        fresh_topic("cfk-in"),
        fresh_topic("cfk-keyed"),
        fresh_topic("cfk-back"),
        fresh_topic("cfk-raw"),
    );
    for t in [&input, &keyed, &back, &raw_back] {
        create_topic(&bootstrap, t, 1).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let v2 = schema_file(dir.path(), "v2.avsc", V2);
    let rows: Vec<Value> = (0..20).map(|i| bid(i, Some(i as f64))).collect();
    produce(&bootstrap, &registry, &input, &v2, &rows).await;
    let checkpoint = |name: &str| dir.path().join(name).display().to_string();
    let avro = format!("format = 'avro-confluent', 'avro-confluent.url' = '{registry}'");
    let avro_keys = format!(
        "'key.format' = 'avro-confluent', 'key.avro-confluent.url' = '{registry}', \
         'key.fields' = 'id', 'value.fields-include' = 'EXCEPT_KEY'"
    );

    // Sluice writes `id` as the key, in Avro under <topic>-key, and the
    // value without it; Confluent's deserializer reads both.
    run_to_end(&format!(
        "SET 'checkpoint.location' = '{}';\nSET 'trigger' = 'available-now';\n\
         CREATE STREAM bids (id BIGINT NOT NULL, name VARCHAR, price DOUBLE) \
           WITH (connector = 'kafka', topic = '{input}', 'bootstrap.servers' = '{bootstrap}', {avro});\n\
         CREATE STREAM keyed WITH (connector = 'kafka', topic = '{keyed}', \
           'bootstrap.servers' = '{bootstrap}', {avro}, {avro_keys});\n\
         INSERT INTO keyed SELECT id, name, price FROM bids;\n",
        checkpoint("keyed")
    ))
    .await;
    let got = consume(&bootstrap, &registry, &keyed, 20, true).await;
    let want: Vec<Value> = (0..20)
        .map(|i| json!({"key": {"id": i}, "value": {"name": format!("n{i}"), "price": i as f64}}))
        .collect();
    assert_eq!(got, want);

    // A stream reads the columns back from the key and the value.
    run_to_end(&format!(
        "SET 'checkpoint.location' = '{}';\nSET 'trigger' = 'available-now';\n\
         CREATE STREAM rekeyed (name VARCHAR, id BIGINT NOT NULL, price DOUBLE) \
           WITH (connector = 'kafka', topic = '{keyed}', 'bootstrap.servers' = '{bootstrap}', \
           {avro}, {avro_keys});\n\
         CREATE STREAM back WITH (connector = 'kafka', topic = '{back}', \
           'bootstrap.servers' = '{bootstrap}');\n\
         INSERT INTO back SELECT id, name, price FROM rekeyed;\n",
        checkpoint("back")
    ))
    .await;
    assert_eq!(json_values(&bootstrap, &back).await, rows);

    // Confluent's producer keyed the input by `id` as text: 'raw' reads
    // it as a VARCHAR column.
    run_to_end(&format!(
        "SET 'checkpoint.location' = '{}';\nSET 'trigger' = 'available-now';\n\
         CREATE STREAM texts (id VARCHAR, name VARCHAR) \
           WITH (connector = 'kafka', topic = '{input}', 'bootstrap.servers' = '{bootstrap}', \
           {avro}, 'key.format' = 'raw', 'key.fields' = 'id', \
           'value.fields-include' = 'EXCEPT_KEY');\n\
         CREATE STREAM raw_back WITH (connector = 'kafka', topic = '{raw_back}', \
           'bootstrap.servers' = '{bootstrap}');\n\
         INSERT INTO raw_back SELECT id, name FROM texts;\n",
        checkpoint("raw")
    ))
    .await;
    let want: Vec<Value> = (0..20)
        .map(|i| json!({"id": i.to_string(), "name": format!("n{i}")}))
        .collect();
    assert_eq!(json_values(&bootstrap, &raw_back).await, want);
}

/// Sends `values` as they are, bypassing any serializer.
fn send_raw(bootstrap: &str, topic: &str, values: &[Vec<u8>]) {
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    let producer: ThreadedProducer<DefaultProducerContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for v in values {
        producer
            .send(BaseRecord::<(), [u8]>::to(topic).payload(v.as_slice()))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_confluent_bad_records_a_down_registry_and_an_incompatible_sink_schema() {
    let bootstrap = broker().await;
    let registry = schema_registry().await;
    let (input, output, letters) = (
        fresh_topic("cf-bad"),
        fresh_topic("cf-good"),
        fresh_topic("cf-letters"),
    );
    for t in [&input, &output, &letters] {
        create_topic(&bootstrap, t, 1).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let v1 = schema_file(dir.path(), "v1.avsc", V1);

    // Offset 0: a good record. Then: not Confluent-framed (offset 1), a
    // schema id the registry does not have (2), a body that is not a
    // record of its schema (3: id, then a string length with no string).
    produce(&bootstrap, &registry, &input, &v1, &[bid(0, None)]).await;
    let good = read(&bootstrap, &input).await[0].value.clone().unwrap();
    let id = &good[1..5];
    let mut truncated = vec![0];
    truncated.extend_from_slice(id);
    truncated.extend([0x02, 0x40]);
    let bad = vec![
        br#"{"id": 1, "name": "json"}"#.to_vec(),
        vec![0, 0x7f, 0xff, 0xff, 0xff, 0x02, 0x02, b'x'],
        truncated,
    ];
    {
        let (b, t, v) = (bootstrap.clone(), input.clone(), bad.clone());
        tokio::task::spawn_blocking(move || send_raw(&b, &t, &v))
            .await
            .unwrap();
    }
    produce(&bootstrap, &registry, &input, &v1, &[bid(4, None)]).await;

    let stream = |on_error: &str, extra: &str| {
        format!(
            "CREATE STREAM bids (id BIGINT NOT NULL, name VARCHAR) \
               WITH (connector = 'kafka', topic = '{input}', 'bootstrap.servers' = '{bootstrap}', \
               format = 'avro-confluent', 'avro-confluent.url' = '{registry}', \
               'format.on-error' = '{on_error}'{extra});\n\
             CREATE STREAM good WITH (connector = 'kafka', topic = '{output}', \
               'bootstrap.servers' = '{bootstrap}');\n\
             INSERT INTO good SELECT id, name FROM bids;\n"
        )
    };
    let run = |name: &str, body: String| {
        format!(
            "SET 'checkpoint.location' = '{}';\nSET 'trigger' = 'available-now';\n{body}",
            dir.path().join(name).display()
        )
    };

    // 'fail' stops at the first bad record, naming where it is and why.
    let query = start_sql(&Session::new(), &run("fail", stream("fail", ""))).await;
    let error = query.await_termination().await.unwrap_err().to_string();
    for part in [
        format!("topic '{input}'"),
        "partition 0".to_string(),
        "offset 1".to_string(),
        "magic byte 0x7b".to_string(),
    ] {
        assert!(error.contains(&part), "'{part}' in: {error}");
    }

    // 'skip' drops the three and counts them; the good ones go on. Here
    // the registry's URL holds credentials, as Confluent's clients take
    // them: sent as basic auth (this registry does not ask for any).
    let with_credentials = registry.replacen("://", "://ann:Zq9-s3cret@", 1);
    let skip = stream("skip", "").replace(&registry, &with_credentials);
    let query = start_sql(&Session::new(), &run("skip", skip)).await;
    query.await_termination().await.unwrap();
    assert_eq!(crate::util::skipped(&query.recent_progress()), 3);

    // 'dead-letter' keeps each bad record's bytes, with the reason; the
    // good ones go on.
    let extra = format!(", 'dead-letter.topic' = '{letters}'");
    let query = start_sql(
        &Session::new(),
        &run("letters", stream("dead-letter", &extra)),
    )
    .await;
    query.await_termination().await.unwrap();
    let dead = read(&bootstrap, &letters).await;
    assert_eq!(
        dead.iter()
            .map(|r| r.value.clone().unwrap())
            .collect::<Vec<_>>(),
        bad
    );
    let reasons: Vec<String> = dead
        .iter()
        .map(|r| {
            let (_, v) = r.headers.iter().find(|(k, _)| k == "sluice.error").unwrap();
            String::from_utf8_lossy(v).into_owned()
        })
        .collect();
    assert!(reasons[0].contains("magic byte 0x7b"), "{}", reasons[0]);
    assert!(
        reasons[1].contains("schema id 2147483647 is not in registry"),
        "{}",
        reasons[1]
    );
    assert!(
        reasons[2].contains("not one Avro record of schema id"),
        "{}",
        reasons[2]
    );
    let ids: Vec<i64> = read(&bootstrap, &output)
        .await
        .iter()
        .map(|r| {
            serde_json::from_slice::<Value>(r.value.as_deref().unwrap()).unwrap()["id"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(
        ids,
        [0, 4, 0, 4],
        "the good records, from the 'skip' run and this one"
    );

    // A registry that does not answer is retried for 'connect.timeout',
    // then named, without the credentials its URL holds.
    let down = "http://127.0.0.1:9/apis/ccompat/v7";
    let sql = run(
        "down",
        stream("fail", ", 'connect.timeout' = '2 s'").replace(
            &registry,
            "http://ann:Zq9-s3cret@127.0.0.1:9/apis/ccompat/v7",
        ),
    );
    let started = std::time::Instant::now();
    let error = Session::new().sql(&sql).await.err().map(|e| e.to_string());
    let error = error.expect("the stream cannot be set up without its registry");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(
        error.contains(&format!("schema registry '{down}'")),
        "{error}"
    );
    assert!(error.contains("no answer within"), "{error}");
    assert!(!error.contains("Zq9-s3cret"), "{error}");

    // A sink whose schema the subject's rule refuses fails with the
    // registry's reason.
    let strict = fresh_topic("cf-strict");
    create_topic(&bootstrap, &strict, 1).await.unwrap();
    let subject = format!("{strict}-value");
    let text_ids = schema_file(
        dir.path(),
        "text.avsc",
        r#"{"type": "record", "name": "topLevelRecord", "fields": [{"name": "id", "type": "string"}]}"#,
    );
    for args in [
        vec![
            "register",
            "--registry",
            &registry,
            "--subject",
            &subject,
            "--schema",
            &text_ids,
        ],
        vec![
            "compatibility",
            "--registry",
            &registry,
            "--subject",
            &subject,
            "--level",
            "BACKWARD",
        ],
    ] {
        confluent_client(args.into_iter().map(String::from).collect(), String::new()).await;
    }
    let sql = run(
        "strict",
        format!(
            "CREATE STREAM bids (id BIGINT NOT NULL, name VARCHAR) \
               WITH (connector = 'kafka', topic = '{input}', 'bootstrap.servers' = '{bootstrap}', \
               format = 'avro-confluent', 'avro-confluent.url' = '{registry}', \
               'format.on-error' = 'skip');\n\
             CREATE STREAM strict WITH (connector = 'kafka', topic = '{strict}', \
               'bootstrap.servers' = '{bootstrap}', format = 'avro-confluent', \
               'avro-confluent.url' = '{registry}');\n\
             INSERT INTO strict SELECT id FROM bids;\n"
        ),
    );
    let error = match Session::new().sql(&sql).await {
        Err(e) => e.to_string(),
        Ok(outcomes) => {
            let query = outcomes
                .into_iter()
                .find_map(|o| match o {
                    sluice::StatementOutcome::Started(q) => Some(q),
                    _ => None,
                })
                .unwrap();
            query.await_termination().await.unwrap_err().to_string()
        }
    };
    assert!(
        error.contains(&format!(
            "refused the sink's schema under subject '{subject}'"
        )),
        "{error}"
    );
}

/// A small HTTP server put in front of the real registry: it answers the
/// first `refusals` connections with a proxy's 404 page (HTML, none of
/// the registry's error codes), as a proxy may while the registry
/// restarts, and passes every later one through. Returns the registry's
/// URL through it.
async fn proxy_answering_404_first(registry: &str, refusals: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = registry.strip_prefix("http://").unwrap();
    let (upstream, path) = rest.split_once('/').unwrap();
    let upstream = upstream.to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        for n in 0.. {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if n < refusals {
                    let mut request = vec![0; 16 * 1024];
                    let _ = client.read(&mut request).await;
                    let page = "<html><body><h1>404 Not Found</h1><hr>nginx</body></html>";
                    let answer = format!(
                        "HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n{page}",
                        page.len()
                    );
                    let _ = client.write_all(answer.as_bytes()).await;
                    return;
                }
                if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    format!("http://{addr}/{path}")
}

/// A 404 that is not the registry's own answer (a proxy's page) is no
/// answer: retried, never taken as "no such schema id", which would make
/// every record of that schema malformed (here: skipped) for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxys_404_is_retried_not_taken_for_an_unknown_schema_id() {
    let bootstrap = broker().await;
    let registry = schema_registry().await;
    let (input, output) = (fresh_topic("cf-proxied"), fresh_topic("cf-proxied-out"));
    for t in [&input, &output] {
        create_topic(&bootstrap, t, 1).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let v1 = schema_file(dir.path(), "v1.avsc", V1);
    produce(
        &bootstrap,
        &registry,
        &input,
        &v1,
        &[bid(0, None), bid(1, None)],
    )
    .await;
    let proxied = proxy_answering_404_first(&registry, 2).await;
    let sql = format!(
        "SET 'checkpoint.location' = '{cp}';\n\
         SET 'trigger' = 'available-now';\n\
         CREATE STREAM bids (id BIGINT NOT NULL, name VARCHAR) \
           WITH (connector = 'kafka', topic = '{input}', 'bootstrap.servers' = '{bootstrap}', \
           format = 'avro-confluent', 'avro-confluent.url' = '{proxied}', \
           'format.on-error' = 'skip');\n\
         CREATE STREAM good WITH (connector = 'kafka', topic = '{output}', \
           'bootstrap.servers' = '{bootstrap}');\n\
         INSERT INTO good SELECT id, name FROM bids;\n",
        cp = dir.path().join("cp").display()
    );
    let query = start_sql(&Session::new(), &sql).await;
    query.await_termination().await.unwrap();
    assert_eq!(crate::util::skipped(&query.recent_progress()), 0);
    let ids: Vec<i64> = json_values(&bootstrap, &output)
        .await
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [0, 1]);
}
