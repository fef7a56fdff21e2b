"""ftd's job API from Python without generated code: the message classes are built at run time from
proto/ (a descriptor set written by protoc, which the C++ build needs anyway), and JobService's
methods are called through grpc's generic stubs. For tests and benchmarks that need many concurrent
calls, where starting an ftctl process per call would be the bottleneck.

    from ftdapi import JobService, msg, enum
    svc = JobService(grpc.insecure_channel(addr))
    resp = svc.SubmitJob(msg("SubmitJobRequest")(spec=spec(TINY), request_id="r1"), timeout=10)
"""
import shutil
import subprocess
import tempfile
from pathlib import Path

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "proto"


def _pool():
    protoc = shutil.which("protoc")
    if protoc is None:
        raise RuntimeError("protoc not found: install protobuf-compiler (scripts/setup.sh does)")
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "ftd.pb"
        subprocess.run([protoc, f"--proto_path={PROTO}", "--include_imports", f"--descriptor_set_out={out}",
                        str(PROTO / "ftd" / "v1" / "jobs.proto"), str(PROTO / "ftd" / "v1" / "admin.proto")], check=True)
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    return pool


POOL = _pool()


def msg(name):
    """The message class ftd.v1.<name>."""
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"ftd.v1.{name}"))


def enum(name, value):
    """The number of ftd.v1.<name>.<value>, e.g. enum("JobState", "QUEUED")."""
    return POOL.FindEnumTypeByName(f"ftd.v1.{name}").values_by_name[value].number


def enum_name(name, number):
    return POOL.FindEnumTypeByName(f"ftd.v1.{name}").values_by_number[number].name


def spec(d):
    """A TrainSpec from its JSON form (docs/job-spec.md)."""
    return json_format.ParseDict(d, msg("TrainSpec")())


class JobService:
    """Stub of ftd.v1.JobService: one attribute per method (unary or server streaming)."""

    def __init__(self, channel):
        for m in POOL.FindServiceByName("ftd.v1.JobService").methods:
            req = message_factory.GetMessageClass(m.input_type)
            resp = message_factory.GetMessageClass(m.output_type)
            path = f"/ftd.v1.JobService/{m.name}"
            make = channel.unary_stream if m.server_streaming else channel.unary_unary
            setattr(self, m.name, make(path, request_serializer=req.SerializeToString,
                                       response_deserializer=resp.FromString))
