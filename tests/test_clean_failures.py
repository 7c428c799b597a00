"""User-facing failures outside `fedpenalty` itself are one clear line, never a traceback:
regenerating the gRPC code without the test extra, and a throughput measurement whose owner
hosts do not start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_proto_generate_without_grpc_tools_says_what_to_install(tmp_path):
    # a sitecustomize that hides grpc_tools, as in an install without the test extra
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['grpc_tools'] = None\n")
    env_path = f"{hide}:{ROOT}"
    done = subprocess.run(
        [sys.executable, "-m", "fedpenalty.proto.generate", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "fedpenalty.proto.generate: error: regenerating the gRPC code needs grpcio-tools, part "
        "of the test extra: pip install -e '.[test]'"
    ]
    assert not (tmp_path / "out").exists()


def test_throughput_reports_a_host_that_does_not_start_and_keeps_the_other_rows(tmp_path):
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scenarios" / "throughput.py"),
            "--owners", "2",
            "--models", "gaussian_mean",
            "--transports", "grpc-one-per-host,inprocess",
            "--seconds", "0.2",
            "--startup-seconds", "1e-9",
            "--json", str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    # no host starts in a nanosecond: that row is reported in one line and left out
    assert "grpc-one-per-host: left out: owner host 0 did not start in time" in done.stderr
    assert "--startup-seconds" in done.stderr
    assert [r["transport"] for r in json.loads(out.read_text())] == ["inprocess"]
