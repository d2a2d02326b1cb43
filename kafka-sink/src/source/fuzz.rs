//! Fuzz targets for the Kafka record decoders, one per format and key
//! format (json, raw, avro, avro-confluent, protobuf-confluent,
//! debezium-json; JSON, raw and avro-confluent keys): records go through the source's own decode path
//! (`SourceInner::decode_chunks`, as a query reads them: the fast path,
//! then one record at a time when one is bad), mutated at random from
//! valid ones (bytes flipped, cut, repeated, spliced with another record,
//! bytes of the format dropped in) and read back from the regression
//! seeds in `kafka-sink/fuzz-seeds/<target>/` (one value per file: what a
//! run once found, kept so it is tried first every time).
//!
//! What must hold, whatever the bytes:
//! - nothing panics;
//! - under `'format.on-error' = 'skip'` the read succeeds, and every
//!   record is a row or a counted skip;
//! - under `'fail'` the read succeeds or fails naming the record's
//!   partition and offset.
//!
//! CI runs each target for a fixed seed and `SLUICE_FUZZ_CASES` cases
//! (default 300); a longer run, each target for ten minutes:
//! `SLUICE_FUZZ_SECONDS=600 SLUICE_FUZZ_SEED=7 cargo test -p sluice-kafka --lib fuzz -- --nocapture`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use sluice_engine::Options;

use super::columns::{KeyFormat, SourceFormat};
use super::config::source_config;
use super::fetch::Fetched;
use super::SourceInner;
use crate::format::avro::{schema_json, AvroConfluentDecoder};
use crate::format::protobuf::{proto_schema, ProtobufConfluentDecoder};
use crate::Format;

/// A record: its key and value (`None`: absent; no value is a tombstone).
type Record = (Option<Vec<u8>>, Option<Vec<u8>>);

/// One decoder to fuzz: a stream's options and columns, and valid records.
struct Target {
    name: &'static str,
    options: Vec<(&'static str, String)>,
    declared: SchemaRef,
    upsert: bool,
    seeds: Vec<Record>,
    /// Every record that decodes is one row (not so for Debezium's
    /// updates, two rows each).
    one_row_each: bool,
    /// The key is what this target decodes: mutated in most records,
    /// not one in four.
    key_target: bool,
}

/// Bytes a mutation drops in: the formats' own punctuation, escapes,
/// numbers at their limits, and bytes that are not UTF-8.
const PIECES: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"\\u00",
    b"\\",
    b"null",
    b"true",
    b"-",
    b"1e309",
    b"-0",
    b"NaN",
    b"99999999999999999999999999999999999999",
    b"0.000000000000000000000000000001",
    b"\"2026-13-45T25:61:61Z\"",
    b"\"op\": \"u\"",
    b"\"before\": null",
    b"\xff",
    b"\x80",
    b"\x00",
    b"\x00\x00\x00\x00\x01",
    b"\x00\x7f\xff\xff\xff",
    b"\x02",
    b"\xfe\xff\xff\xff\x0f",
];

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// `bytes` changed one to four times.
fn mutate(rng: &mut Rng, bytes: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(7) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 => out.truncate(at),
            2 => {
                let piece = PIECES[rng.below(PIECES.len())];
                out.splice(at..at, piece.iter().copied());
            }
            3 if !out.is_empty() => {
                let from = rng.below(out.len());
                let to = (from + 1 + rng.below(16)).min(out.len());
                let copy = out[from..to].to_vec();
                out.splice(at..at, copy);
            }
            4 => {
                let cut = rng.below(other.len() + 1);
                out.truncate(at);
                out.extend_from_slice(&other[cut..]);
            }
            5 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = rng.next() as u8;
            }
            _ => out = (0..rng.below(24)).map(|_| rng.next() as u8).collect(),
        }
    }
    out
}

/// Three rows of `schema`'s simple columns (BIGINT, VARCHAR, DOUBLE), one
/// with nulls, for the formats whose valid records are binary.
fn simple_rows() -> (SchemaRef, RecordBatch) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("price", DataType::Float64, true),
    ]));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![1, -2, i64::MAX])),
        Arc::new(StringArray::from(vec![Some("a"), None, Some("é\"\\")])),
        Arc::new(Float64Array::from(vec![Some(1.5), None, Some(-0.0)])),
    ];
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns).expect("rows");
    (schema, batch)
}

fn values(format: Format, batch: &RecordBatch) -> Vec<Record> {
    let messages = format.messages(batch, &[]).expect("encoded rows");
    (0..messages.len())
        .map(|i| (None, Some(messages.value(i).to_vec())))
        .collect()
}

fn text(values: &[&str]) -> Vec<Record> {
    values
        .iter()
        .map(|v| (None, Some(v.as_bytes().to_vec())))
        .collect()
}

fn targets() -> Vec<Target> {
    let (simple, rows) = simple_rows();
    let row = Fields::from(vec![
        Field::new("a", DataType::Int64, true),
        Field::new("b", DataType::Utf8, true),
    ]);
    let rich = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
        Field::new("amount", DataType::Decimal128(20, 4), true),
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        Field::new(
            "tags",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            true,
        ),
        Field::new("item", DataType::Struct(row), true),
    ]));
    let kv = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("v", DataType::Int64, true),
    ]));
    vec![
        Target {
            name: "json",
            options: vec![("format", "json".into())],
            declared: rich,
            upsert: false,
            seeds: text(&[
                r#"{"id": 1, "name": "a", "amount": 12.5, "ts": "2026-01-01T00:00:00.000Z", "tags": ["x", "y"], "item": {"a": 1, "b": "z"}}"#,
                r#"{"id": -9223372036854775808, "name": null, "amount": -0.0001, "ts": 1767225600000, "tags": [], "item": null}"#,
                r#"{"id": 3, "unknown": [1, {"deep": true}]}"#,
            ]),
            one_row_each: true,
            key_target: false,
        },
        Target {
            name: "raw",
            options: vec![("format", "raw".into())],
            declared: Arc::new(Schema::new(vec![Field::new("value", DataType::Utf8, true)])),
            upsert: false,
            seeds: text(&["a line", "", "é"]),
            one_row_each: true,
            key_target: false,
        },
        Target {
            name: "avro",
            options: vec![("format", "avro".into())],
            declared: Arc::clone(&simple),
            upsert: false,
            seeds: values(Format::Avro, &rows),
            one_row_each: true,
            key_target: false,
        },
        Target {
            name: "avro-confluent",
            // Read as JSON, then given the registry format's decoder and
            // its schema by id: no registry runs here.
            options: vec![("format", "json".into())],
            declared: Arc::clone(&simple),
            upsert: false,
            seeds: values(Format::AvroConfluent { schema_id: 1 }, &rows),
            one_row_each: true,
            key_target: false,
        },
        Target {
            name: "protobuf-confluent",
            options: vec![("format", "json".into())],
            declared: Arc::clone(&simple),
            upsert: false,
            seeds: values(Format::ProtobufConfluent { schema_id: 1 }, &rows),
            one_row_each: true,
            key_target: false,
        },
        Target {
            name: "debezium-json",
            options: vec![("format", "debezium-json".into())],
            declared: Arc::clone(&simple),
            upsert: false,
            seeds: text(&[
                r#"{"before": null, "after": {"id": 1, "name": "a", "price": 1.5}, "op": "c"}"#,
                r#"{"schema": {}, "payload": {"before": {"id": 1, "name": "a", "price": 1.5}, "after": {"id": 1, "name": "b", "price": null}, "op": "u"}}"#,
                r#"{"before": {"id": 1, "name": "b", "price": null}, "after": null, "op": "d", "ts_ms": 1}"#,
            ]),
            one_row_each: false,
            key_target: false,
        },
        Target {
            name: "upsert-json-key",
            options: vec![("key.fields", "k".into())],
            declared: Arc::clone(&kv),
            upsert: true,
            seeds: vec![
                (
                    Some(br#"{"k": "a"}"#.to_vec()),
                    Some(br#"{"k": "a", "v": 1}"#.to_vec()),
                ),
                (Some(br#"{"k": "b"}"#.to_vec()), None),
                (
                    Some(br#"{ "k" : "a" }"#.to_vec()),
                    Some(br#"{"k": "a", "v": 2}"#.to_vec()),
                ),
            ],
            one_row_each: true,
            key_target: true,
        },
        Target {
            name: "raw-key-except-key",
            options: vec![
                ("key.fields", "k".into()),
                ("key.format", "raw".into()),
                ("value.fields-include", "EXCEPT_KEY".into()),
            ],
            declared: Arc::clone(&kv),
            upsert: false,
            seeds: vec![
                (Some(b"a".to_vec()), Some(br#"{"v": 1}"#.to_vec())),
                (Some(Vec::new()), Some(br#"{"v": null}"#.to_vec())),
                (Some(b"c".to_vec()), Some(br#"{"v": 3}"#.to_vec())),
            ],
            one_row_each: true,
            key_target: true,
        },
        Target {
            name: "avro-confluent-key",
            // Set up as JSON keys, then given the registry format's key
            // decoder and the key's schema by id.
            options: vec![
                ("key.fields", "k".into()),
                ("value.fields-include", "EXCEPT_KEY".into()),
            ],
            declared: Arc::clone(&kv),
            upsert: true,
            seeds: avro_keys(&kv)
                .into_iter()
                .zip([
                    Some(br#"{"v": 1}"#.to_vec()),
                    None,
                    Some(br#"{"v": null}"#.to_vec()),
                ])
                .map(|(key, value)| (Some(key), value))
                .collect(),
            one_row_each: true,
            key_target: true,
        },
    ]
}

/// The key schema of `kv` (its column `k`) and keys in the Confluent
/// Avro wire format, schema id 1.
fn avro_keys(kv: &SchemaRef) -> Vec<Vec<u8>> {
    let key = Arc::new(kv.project(&[0]).expect("the key column"));
    let rows = RecordBatch::try_new(
        Arc::clone(&key),
        vec![Arc::new(StringArray::from(vec!["a", "", "é\u{0}"])) as ArrayRef],
    )
    .expect("keys");
    values(Format::AvroConfluent { schema_id: 1 }, &rows)
        .into_iter()
        .filter_map(|(_, v)| v)
        .collect()
}

/// The source `target` reads with under `on_error`, its registry
/// decoders given their schemas directly (no registry runs here).
fn source(target: &Target, on_error: &str) -> SourceInner {
    let mut pairs: Vec<(&str, String)> = vec![
        ("topic", format!("fuzz-{}", target.name)),
        ("bootstrap.servers", "127.0.0.1:9".into()),
        ("kafka.log_level", "0".into()),
        ("format.on-error", on_error.into()),
    ];
    pairs.extend(target.options.iter().cloned());
    let options = Options::from_pairs(pairs.iter().map(|(k, v)| (*k, v.as_str())));
    let declared = Some(Arc::clone(&target.declared));
    let mut config = source_config(
        "fuzz",
        options,
        declared,
        Duration::from_secs(1),
        target.upsert,
    )
    .unwrap_or_else(|e| panic!("target {}: {e}", target.name));
    let declared = Arc::clone(&target.declared);
    match target.name {
        "avro-confluent" => {
            let schema = schema_json(&declared).expect("an Avro schema");
            let decoder =
                AvroConfluentDecoder::with_schemas(&schema, [(1, schema.clone())], Some(declared))
                    .expect("a decoder");
            config.format = SourceFormat::AvroConfluent;
            config.confluent = Some(Arc::new(decoder));
        }
        "protobuf-confluent" => {
            let proto = proto_schema(&declared).expect("a .proto schema");
            let decoder = ProtobufConfluentDecoder::with_schemas([(1, proto)], declared);
            config.format = SourceFormat::ProtobufConfluent;
            config.protobuf = Some(Arc::new(decoder));
        }
        "avro-confluent-key" => {
            let key = config.key.as_mut().expect("key columns");
            let schema = schema_json(&key.schema).expect("an Avro key schema");
            let decoder = AvroConfluentDecoder::with_schemas(
                &schema,
                [(1, schema.clone())],
                Some(Arc::clone(&key.schema)),
            )
            .expect("a key decoder");
            key.format = KeyFormat::AvroConfluent(Arc::new(decoder));
        }
        _ => {}
    }
    SourceInner::new(config, None).expect("a source")
}

/// Records of one case: valid, mutated, random or tombstones, and for a
/// key target some without a key.
fn case(rng: &mut Rng, target: &Target) -> Vec<Record> {
    let seeds = &target.seeds;
    (0..1 + rng.below(6))
        .map(|_| {
            let (key, value) = seeds[rng.below(seeds.len())].clone();
            let other = seeds[rng.below(seeds.len())].1.clone().unwrap_or_default();
            let value = match rng.below(10) {
                0 => None,
                1 | 2 => value,
                _ => Some(mutate(rng, value.as_deref().unwrap_or_default(), &other)),
            };
            let mutated = if target.key_target { 3 } else { 1 };
            let key = match (key, rng.below(4)) {
                // A record without a key, where the columns need one.
                (Some(_), 0) if target.key_target && rng.below(8) == 0 => None,
                (Some(k), n) if n < mutated => Some(mutate(rng, &k, b"")),
                (key, _) => key,
            };
            (key, value)
        })
        .collect()
}

/// What must hold for `records` (see the module's text).
fn check(target: &Target, skip: &SourceInner, fail: &SourceInner, records: &[Record]) {
    let fetched = Fetched::of(
        records
            .iter()
            .enumerate()
            .map(|(i, (k, v))| (100 + i as i64, k.as_deref(), v.as_deref())),
    );
    let chunks = std::slice::from_ref(&fetched);
    let skipped = || skip.rejected.lock().map(|r| r.skipped).unwrap_or(0);
    let before = skipped();
    let rows = skip
        .decode_chunks(0, chunks)
        .unwrap_or_else(|e| panic!("{}: 'skip' failed: {e}", target.name))
        .num_rows() as u64;
    let gone = skipped() - before;
    if target.one_row_each {
        assert_eq!(
            rows + gone,
            records.len() as u64,
            "{}: {rows} rows and {gone} skipped of {} records",
            target.name,
            records.len()
        );
    }
    if let Err(e) = fail.decode_chunks(0, chunks) {
        let said = e.to_string();
        assert!(
            said.contains("partition 0, offset 1"),
            "{}: 'fail' did not name the record: {said}",
            target.name
        );
    }
}

/// The target's valid records decode, none skipped: a decoder refusing
/// everything would pass the fuzzing without reading a byte of it.
fn seeds_are_rows(target: &Target, skip: &SourceInner) {
    let fetched = Fetched::of(
        target
            .seeds
            .iter()
            .enumerate()
            .map(|(i, (k, v))| (i as i64, k.as_deref(), v.as_deref())),
    );
    let skipped = || skip.rejected.lock().map(|r| r.skipped).unwrap_or(0);
    let before = skipped();
    let rows = skip
        .decode_chunks(0, std::slice::from_ref(&fetched))
        .unwrap_or_else(|e| panic!("{}: the seeds fail: {e}", target.name))
        .num_rows();
    assert_eq!(skipped(), before, "{}: a seed was skipped", target.name);
    assert!(rows >= target.seeds.len(), "{}: {rows} rows", target.name);
}

/// The regression seeds of `target` (one value per file).
fn kept(target: &Target) -> Vec<Record> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz-seeds")
        .join(target.name);
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
        .into_iter()
        .filter_map(|p| std::fs::read(p).ok())
        .map(|v| {
            let key = target.seeds[0].0.clone();
            (key, Some(v))
        })
        .collect()
}

fn hex(records: &[Record]) -> String {
    let h = |b: &Option<Vec<u8>>| match b {
        Some(b) => b.iter().map(|x| format!("{x:02x}")).collect(),
        None => "-".to_string(),
    };
    records
        .iter()
        .map(|(k, v)| format!("key {} value {}", h(k), h(v)))
        .collect::<Vec<_>>()
        .join("; ")
}

#[test]
fn no_record_makes_a_decoder_panic_lose_a_record_or_go_unnamed() {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let cases = env("SLUICE_FUZZ_CASES").unwrap_or(300);
    let seconds = env("SLUICE_FUZZ_SECONDS");
    let seed = env("SLUICE_FUZZ_SEED").unwrap_or(0x5eed);
    let only = std::env::var("SLUICE_FUZZ_TARGET").ok();
    for target in targets() {
        if only.as_deref().is_some_and(|o| o != target.name) {
            continue;
        }
        let (skip, fail) = (source(&target, "skip"), source(&target, "fail"));
        seeds_are_rows(&target, &skip);
        for record in kept(&target).into_iter().chain(target.seeds.clone()) {
            check(&target, &skip, &fail, &[record]);
        }
        let mut rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
        let started = Instant::now();
        let mut n = 0u64;
        loop {
            let done = match seconds {
                Some(s) => started.elapsed() >= Duration::from_secs(s),
                None => n >= cases,
            };
            if done {
                break;
            }
            let records = case(&mut rng, &target);
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                check(&target, &skip, &fail, &records)
            }));
            if let Err(panic) = outcome {
                eprintln!(
                    "fuzz target {} (seed {seed}, case {n}) failed on: {}",
                    target.name,
                    hex(&records)
                );
                std::panic::resume_unwind(panic);
            }
            n += 1;
        }
        if seconds.is_some() {
            eprintln!(
                "fuzz target {}: {n} cases in {:?}, seed {seed}",
                target.name,
                started.elapsed()
            );
        }
    }
}
