"""The committed generated code is what ``python -m fedpenalty.proto.generate`` makes from
``protos/`` today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fedpenalty.proto
from fedpenalty.proto.generate import generated_files

PACKAGE = Path(fedpenalty.proto.__file__).parent


def test_generated_code_matches_the_protos(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "fedpenalty.proto.generate", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    fresh = sorted(p.name for p in tmp_path.iterdir())
    assert fresh == ["owner_pb2.py", "owner_pb2.pyi", "owner_pb2_grpc.py"]
    for name in fresh:
        assert (tmp_path / name).read_text() == (PACKAGE / name).read_text(), (
            f"fedpenalty/proto/{name} is stale: run python -m fedpenalty.proto.generate and commit "
            f"the result"
        )


def test_a_changed_proto_is_noticed(tmp_path):
    """The check above can fail: a one-field change to the protocol changes the generated code."""
    protos = Path(fedpenalty.proto.__file__).parents[2] / "protos"
    changed = tmp_path / "fedpenalty" / "v1"
    changed.mkdir(parents=True)
    text = (protos / "fedpenalty" / "v1" / "owner.proto").read_text()
    (changed / "owner.proto").write_text(
        text.replace(
            "message CloseSessionReply {}", "message CloseSessionReply { int64 closed = 1; }"
        )
    )
    assert generated_files(tmp_path)["owner_pb2.py"] != (PACKAGE / "owner_pb2.py").read_text()
