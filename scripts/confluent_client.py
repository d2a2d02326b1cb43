"""Confluent's Python client on the other end of Sluice's topics.

Run through scripts/confluent-client, which provides confluent-kafka.

  produce        serialize JSON rows (one per line on stdin) with a schema
                 and produce them, Confluent-framed; registers the schema
                 under <topic>-value (TopicNameStrategy) like any producer
  consume        read a topic read_committed, deserialize each value by its
                 schema id, print one JSON object per line (sorted keys);
                 with --key-avro, {"key": ..., "value": ...} with the key
                 deserialized the same way
  register       register a schema under a subject; prints its id
  compatibility  set a subject's compatibility level (BACKWARD, NONE, ...)
"""

import argparse
import json
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext


def registry(args):
    return SchemaRegistryClient({"url": args.registry})


def produce(args):
    with open(args.schema) as f:
        schema = f.read()
    serializer = AvroSerializer(registry(args), schema)
    producer = Producer({"bootstrap.servers": args.bootstrap, "enable.idempotence": True})
    context = SerializationContext(args.topic, MessageField.VALUE)
    sent = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        row = json.loads(line)
        key = str(row[args.key_field]).encode() if args.key_field else None
        producer.produce(args.topic, key=key, value=serializer(row, context))
        producer.poll(0)
        sent += 1
    if producer.flush(30) != 0:
        sys.exit("confluent-client: records were not delivered within 30 s")
    print(sent)


def consume(args):
    deserializer = AvroDeserializer(registry(args))
    key_context = SerializationContext(args.topic, MessageField.KEY)
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": f"confluent-client-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([args.topic])
    context = SerializationContext(args.topic, MessageField.VALUE)
    got = 0
    deadline = time.monotonic() + args.timeout
    while got < args.expect and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error():
            raise KafkaException(message.error())
        row = deserializer(message.value(), context)
        if args.key_avro:
            row = {"key": deserializer(message.key(), key_context), "value": row}
        print(json.dumps(row, sort_keys=True), flush=True)
        got += 1
    consumer.close()
    if got < args.expect:
        sys.exit(f"confluent-client: {got} of {args.expect} records within {args.timeout} s")


def register(args):
    with open(args.schema) as f:
        schema = Schema(f.read(), "AVRO")
    print(registry(args).register_schema(args.subject, schema))


def compatibility(args):
    registry(args).set_compatibility(args.subject, args.level)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, run in [("produce", produce), ("consume", consume)]:
        p = commands.add_parser(name)
        p.set_defaults(run=run)
        p.add_argument("--bootstrap", required=True)
        p.add_argument("--registry", required=True)
        p.add_argument("--topic", required=True)
        if name == "produce":
            p.add_argument("--schema", required=True, help="Avro schema file")
            p.add_argument("--key-field", help="a field whose value, as text, is the key")
        else:
            p.add_argument("--expect", type=int, required=True)
            p.add_argument("--key-avro", action="store_true", help="keys are Confluent Avro too")
            p.add_argument("--timeout", type=float, default=60)
    p = commands.add_parser("register")
    p.set_defaults(run=register)
    p.add_argument("--registry", required=True)
    p.add_argument("--subject", required=True)
    p.add_argument("--schema", required=True)
    p = commands.add_parser("compatibility")
    p.set_defaults(run=compatibility)
    p.add_argument("--registry", required=True)
    p.add_argument("--subject", required=True)
    p.add_argument("--level", required=True)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
