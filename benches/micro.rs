//! criterion micro-benchmarks of the hot paths, each on its own, with no
//! broker and no epoch loop around it:
//!
//! - `json_decode`: Kafka message values (Nexmark bids as `sluice nexmark
//!   load` writes them) to an Arrow batch, the Kafka source's fast path
//!   ([`sluice_kafka::decode_json`]);
//! - `avro_confluent_decode`: the same bids in the Confluent wire format
//!   (`format = 'avro-confluent'`), writer schema resolved to the reader
//!   schema ([`sluice_kafka::AvroConfluentDecoder`]), beside JSON's;
//! - `protobuf_confluent_decode`: the same bids as Confluent-framed
//!   Protobuf (`format = 'protobuf-confluent'`,
//!   [`sluice_kafka::ProtobufConfluentDecoder`]);
//! - `produce_encode`: an Arrow batch of bids to Kafka messages, unkeyed and
//!   keyed by auction, as the Kafka sinks encode them before handing them to
//!   librdkafka ([`sluice_kafka::Format::messages`]), in JSON, in
//!   `avro-confluent` and in `protobuf-confluent`;
//! - `state_merge`: the keyed state store of a 1 M-key aggregation, per
//!   epoch of 64 K changed keys: looking up their stored rows, replacing
//!   them, and writing the epoch's delta for the checkpoint
//!   ([`sluice::KeyedState`]).
//!
//! ```text
//! cargo bench --bench micro                 # all
//! cargo bench --bench micro -- state_merge  # one group
//! ```
//!
//! Throughput is reported per row (elements/s); criterion keeps its
//! reports in `target/criterion`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use sluice::arrow::array::{
    ArrayRef, Int64Array, RecordBatch, StringArray, TimestampNanosecondArray,
};
use sluice::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use sluice::KeyedState;
use sluice_kafka::{decode_json, AvroConfluentDecoder, Format, ProtobufConfluentDecoder};
use sluice_nexmark::generator::{Generator, Timeline};

/// Rows per batch: the size of a batch a Kafka partition decodes at once.
const ROWS: usize = 64 * 1024;
/// Keys held by the state store.
const KEYS: i64 = 1_000_000;

/// The bid stream's columns, as `benches/nexmark/kafka-sources.sql`
/// declares them.
fn bid_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("auction", DataType::Int64, true),
        Field::new("bidder", DataType::Int64, true),
        Field::new("price", DataType::Int64, true),
        Field::new(
            "date_time",
            DataType::Timestamp(TimeUnit::Nanosecond, None),
            true,
        ),
        Field::new("extra", DataType::Utf8, true),
    ]))
}

/// `ROWS` Nexmark bids (events of seed 0 from event 0, bids only).
fn bids() -> RecordBatch {
    let g = Generator {
        seed: 0,
        flink: false,
        timeline: Timeline {
            anchor_event: 0,
            anchor_ms: 1_700_000_000_000,
            rate: 1_000_000,
        },
    };
    let bids: Vec<_> = (0..ROWS as i64).map(|e| g.bid(e)).collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(bids.iter().map(|b| b.auction))),
        Arc::new(Int64Array::from_iter_values(bids.iter().map(|b| b.bidder))),
        Arc::new(Int64Array::from_iter_values(bids.iter().map(|b| b.price))),
        Arc::new(TimestampNanosecondArray::from_iter_values(
            bids.iter().map(|b| b.date_time * 1_000_000),
        )),
        Arc::new(StringArray::from_iter_values(
            bids.iter().map(|b| b.extra.as_str()),
        )),
    ];
    RecordBatch::try_new(bid_schema(), columns).expect("the bid columns match the schema")
}

/// Benchmark group `name`: `decode` turning the 64 K bids, encoded in
/// `format`, back into rows.
fn decode_group(
    c: &mut Criterion,
    name: &str,
    format: Format,
    decode: impl Fn(&[Vec<u8>]) -> sluice::Result<RecordBatch>,
) {
    let encoded = format.encode(&bids()).expect("bids encode");
    let values: Vec<Vec<u8>> = encoded.rows().map(<[u8]>::to_vec).collect();
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(ROWS as u64));
    group.bench_function("nexmark_bids_64k", |b| {
        b.iter(|| {
            let decoded = decode(&values).expect("decode");
            assert_eq!(decoded.num_rows(), ROWS);
            decoded
        })
    });
    group.finish();
}

fn json_decode(c: &mut Criterion) {
    let schema = bid_schema();
    decode_group(c, "json_decode", Format::Json, |values| {
        decode_json(&schema, values.iter().map(Vec::as_slice))
    });
}

fn avro_confluent_decode(c: &mut Criterion) {
    let schema = sluice_kafka::avro_schema(&bid_schema()).expect("an Avro schema");
    let decoder =
        AvroConfluentDecoder::with_schemas(&schema, [(1, schema.clone())], Some(bid_schema()))
            .expect("a decoder");
    let format = Format::AvroConfluent { schema_id: 1 };
    decode_group(c, "avro_confluent_decode", format, |values| {
        decoder.decode(values.iter().map(Vec::as_slice))
    });
}

fn protobuf_confluent_decode(c: &mut Criterion) {
    let proto = sluice_kafka::proto_schema(&bid_schema()).expect("a .proto schema");
    let decoder = ProtobufConfluentDecoder::with_schemas([(1, proto)], bid_schema());
    let format = Format::ProtobufConfluent { schema_id: 1 };
    decode_group(c, "protobuf_confluent_decode", format, |values| {
        decoder.decode(values.iter().map(Vec::as_slice))
    });
}

fn produce_encode(c: &mut Criterion) {
    let batch = bids();
    let mut group = c.benchmark_group("produce_encode");
    group.throughput(Throughput::Elements(ROWS as u64));
    group.bench_function("nexmark_bids_64k_unkeyed", |b| {
        b.iter(|| {
            Format::Json
                .messages(black_box(&batch), &[])
                .expect("encode")
        })
    });
    group.bench_function("nexmark_bids_64k_keyed_by_auction", |b| {
        b.iter(|| {
            Format::Json
                .messages(black_box(&batch), &[0])
                .expect("encode")
        })
    });
    group.bench_function("nexmark_bids_64k_avro_confluent_unkeyed", |b| {
        b.iter(|| {
            Format::AvroConfluent { schema_id: 1 }
                .messages(black_box(&batch), &[])
                .expect("encode")
        })
    });
    group.bench_function("nexmark_bids_64k_protobuf_confluent_unkeyed", |b| {
        b.iter(|| {
            Format::ProtobufConfluent { schema_id: 1 }
                .messages(black_box(&batch), &[])
                .expect("encode")
        })
    });
    group.finish();
}

/// An aggregation's state: key, then the `count` and `sum` accumulators.
fn state_rows(keys: impl Iterator<Item = i64>, generation: i64) -> RecordBatch {
    let keys: Vec<i64> = keys.collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("auction", DataType::Int64, false),
        Field::new("count", DataType::Int64, false),
        Field::new("sum", DataType::Int64, false),
    ]));
    let counts = Int64Array::from_iter_values(keys.iter().map(|_| generation));
    let sums = Int64Array::from_iter_values(keys.iter().map(|k| k * generation));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(keys)),
            Arc::new(counts),
            Arc::new(sums),
        ],
    )
    .expect("the state columns match the schema")
}

/// `ROWS` distinct keys of the state, spread over it.
fn changed_keys(epoch: i64) -> impl Iterator<Item = i64> {
    let stride = KEYS / ROWS as i64;
    (0..ROWS as i64).map(move |i| (i * stride + epoch) % KEYS)
}

fn state_merge(c: &mut Criterion) {
    let full = state_rows(0..KEYS, 1);
    let mut state = KeyedState::new(full.schema(), 1).expect("state");
    state.upsert(&[full]).expect("fill the state");
    state.delta().expect("forget the fill");
    let mut group = c.benchmark_group("state_merge");
    group.throughput(Throughput::Elements(ROWS as u64));
    group.bench_function("lookup_64k_of_1m_keys", |b| {
        let probe = state_rows(changed_keys(0), 0);
        b.iter(|| {
            let stored = state.lookup(std::slice::from_ref(&probe)).expect("lookup");
            assert_eq!(stored.num_rows(), ROWS);
            stored
        })
    });
    let mut epoch = 0;
    group.bench_function("upsert_64k_into_1m_keys", |b| {
        b.iter_batched(
            || {
                epoch += 1;
                state_rows(changed_keys(epoch), epoch)
            },
            |new| state.upsert(&[new]).expect("upsert"),
            BatchSize::LargeInput,
        )
    });
    group.bench_function("delta_of_64k_changed_keys", |b| {
        b.iter_custom(|iterations| {
            let mut spent = Duration::ZERO;
            for _ in 0..iterations {
                epoch += 1;
                state
                    .upsert(&[state_rows(changed_keys(epoch), epoch)])
                    .expect("upsert");
                let started = Instant::now();
                black_box(state.delta().expect("delta"));
                spent += started.elapsed();
            }
            spent
        })
    });
    assert_eq!(state.num_rows(), KEYS as u64);
    group.finish();
}

criterion_group! {
    name = micro;
    // Short runs: the machines are shared; medians over 20 samples.
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    targets = json_decode, avro_confluent_decode, protobuf_confluent_decode, produce_encode,
        state_merge
}
criterion_main!(micro);
