"""The committed generated code matches proto/hacfed_v1.proto, and the schema keeps its promises.

Privacy (security.md T11, S11): no per-token or prompt log-prob can cross the wire, so no message may
hold a repeated float/double or a field named like one. Parity: the wire messages mirror the domain
dataclasses field for field, so a new domain field cannot be silently dropped by the serde module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from hacfed.hacpo_config import HacpoConfig
from hacfed.proto import hacfed_v1_pb2 as pb
from hacfed.trajectory import Trajectory
from hacfed.wire import PayloadType

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("hacfed_v1_pb2.py", "hacfed_v1_pb2_grpc.py")
FORBIDDEN_NAME_PARTS = ("token_logprob", "prompt_logprob", "logprobs")


def test_generated_code_is_current(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen_proto.sh"), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for name in GENERATED:
        fresh = (tmp_path / name).read_bytes()
        assert fresh == (ROOT / "proto" / name).read_bytes(), f"proto/{name} is stale: run scripts/gen_proto.sh"


def test_generated_grpc_module_imports_through_the_package() -> None:
    text = (ROOT / "proto" / "hacfed_v1_pb2_grpc.py").read_text()
    assert "from hacfed.proto import hacfed_v1_pb2" in text
    from hacfed.proto import hacfed_v1_pb2_grpc

    assert hacfed_v1_pb2_grpc.ParticipantRelayStub is not None
    method = pb.DESCRIPTOR.services_by_name["ParticipantRelay"].methods_by_name["Exchange"]
    assert method.input_type.full_name == method.output_type.full_name == "hacfed.v1.Envelope"


def _walk(descriptor: Descriptor) -> list[Descriptor]:
    found = [descriptor]
    for nested in descriptor.nested_types:
        found.extend(_walk(nested))
    return found


def _all_messages(file_descriptor) -> list[Descriptor]:
    return [d for top in file_descriptor.message_types_by_name.values() for d in _walk(top)]


def privacy_violations(messages: list[Descriptor]) -> list[str]:
    """Fields that could carry a per-token or prompt log-prob vector."""
    bad = []
    for message in messages:
        for f in message.fields:
            floats = f.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE)
            if f.is_repeated and floats:
                bad.append(f"{f.full_name}: repeated floating-point field")
            if any(part in f.name.lower() for part in FORBIDDEN_NAME_PARTS):
                bad.append(f"{f.full_name}: log-prob vector by name")
    return bad


def test_schema_has_no_per_token_or_prompt_logprob_field() -> None:
    messages = _all_messages(pb.DESCRIPTOR)
    names = {m.full_name for m in messages}
    # the walk is not vacuous: it reaches the trajectory and the map entries
    assert {"hacfed.v1.Trajectory", "hacfed.v1.RoundUpdate.CapabilitiesEntry", "hacfed.v1.Envelope"} <= names
    assert privacy_violations(messages) == []


def test_privacy_check_catches_a_forbidden_field() -> None:
    # A throwaway schema with the two shapes the rule forbids, in a private descriptor pool.
    proto = descriptor_pb2.FileDescriptorProto(name="leaky.proto", package="leaky", syntax="proto3")
    msg = proto.message_type.add(name="Leaky")
    msg.field.add(name="per_token", number=1, type=FieldDescriptor.TYPE_DOUBLE, label=FieldDescriptor.LABEL_REPEATED)
    msg.field.add(
        name="prompt_logprob_sum", number=2, type=FieldDescriptor.TYPE_DOUBLE, label=FieldDescriptor.LABEL_OPTIONAL
    )
    leaky = descriptor_pool.DescriptorPool().Add(proto)
    found = privacy_violations(_all_messages(leaky))
    assert any("per_token" in v for v in found) and any("prompt_logprob_sum" in v for v in found)


def test_trajectory_mirrors_domain_except_local_token_ids() -> None:
    wire = set(pb.Trajectory.DESCRIPTOR.fields_by_name)
    domain = {f.name for f in fields(Trajectory)}
    assert wire == domain - {"response_token_ids"}
    assert "response_token_ids" not in wire


def test_hacpo_config_mirrors_domain() -> None:
    assert set(pb.HacpoConfig.DESCRIPTOR.fields_by_name) == {f.name for f in fields(HacpoConfig)}


def test_payload_types_name_every_frame_body() -> None:
    bodies = pb.WireMessage.DESCRIPTOR.oneofs_by_name["body"].fields
    assert {f.message_type.full_name for f in bodies} == {t.value for t in PayloadType}
