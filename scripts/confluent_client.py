"""Confluent's Python client on the other end of Sluice's topics.

Run through scripts/confluent-client, which provides confluent-kafka.

  produce        serialize JSON rows (one per line on stdin) with a schema
                 (Avro, or with --format protobuf a .proto file whose first
                 message is the value) and produce them, Confluent-framed;
                 registers the schema under <topic>-value (TopicNameStrategy)
                 like any producer
  consume        read a topic read_committed, deserialize each value by its
                 schema id, print one JSON object per line (sorted keys);
                 with --key-avro, {"key": ..., "value": ...} with the key
                 deserialized the same way; with --format protobuf, by the
                 message classes of the subject's latest .proto schema
  register       register a schema under a subject; prints its id
  compatibility  set a subject's compatibility level (BACKWARD, NONE, ...)
"""

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
import uuid

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext


def registry(args):
    # Without a timeout the client waits for ever on a request the registry
    # lost (a test hung 7 minutes so); with one, it retries it.
    return SchemaRegistryClient({"url": args.registry, "timeout": 30})


def message_class(proto_text):
    """The first message class of a .proto file, compiled with protoc (or of
    a base64 FileDescriptorProto, the form Confluent's Python serializer
    registers)."""
    import base64
    import binascii

    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from grpc_tools import protoc

    try:
        fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(proto_text, validate=True))
    except (binascii.Error, ValueError, Exception):
        fdp = None
    if fdp is not None and fdp.message_type:
        pool = descriptor_pool.DescriptorPool()
        pool.Add(fdp)
        prefix = f"{fdp.package}." if fdp.package else ""
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(prefix + fdp.message_type[0].name))

    out = tempfile.mkdtemp(prefix="confluent-client-")
    name = f"m{uuid.uuid4().hex}"
    with open(os.path.join(out, f"{name}.proto"), "w") as f:
        f.write(proto_text)
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    code = protoc.main(["protoc", f"-I{out}", f"-I{include}", f"--python_out={out}", f"{name}.proto"])
    if code != 0:
        sys.exit(f"confluent-client: protoc failed on:\n{proto_text}")
    sys.path.insert(0, out)
    module = importlib.import_module(f"{name}_pb2")
    first = module.DESCRIPTOR.message_types_by_name
    return getattr(module, next(iter(first)))


def protobuf_row(message):
    """A message's set fields as a dict (field names, numbers as numbers)."""
    row = {}
    for field in message.DESCRIPTOR.fields:
        if field.has_presence and not message.HasField(field.name):
            continue
        row[field.name] = getattr(message, field.name)
    return row


def produce(args):
    with open(args.schema) as f:
        schema = f.read()
    if args.format == "protobuf":
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
        from google.protobuf import json_format

        cls = message_class(schema)
        protobuf = ProtobufSerializer(cls, registry(args), {"use.deprecated.format": False})

        def serializer(row, context):
            return protobuf(json_format.ParseDict(row, cls()), context)
    else:
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
    if args.format == "protobuf":
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

        latest = registry(args).get_latest_version(f"{args.topic}-value")
        cls = message_class(latest.schema.schema_str)
        protobuf = ProtobufDeserializer(cls, {"use.deprecated.format": False})

        def deserializer(value, context):
            return protobuf_row(protobuf(value, context))
    else:
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
        p.add_argument("--format", choices=["avro", "protobuf"], default="avro")
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
