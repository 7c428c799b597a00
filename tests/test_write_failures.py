"""Files a run cannot write (issue 21, item 7): an ``--out`` that cannot be created is one line,
said before any owner is asked; a checkpoint or output write that fails once the owners have
answered stops the run in one line that says how to resume, keeps the run directory (and the
owners' ledgers in it), and ``--resume`` then completes with the draws and the charges of an
uninterrupted run (docs/design.md §3 invariants 2, 3, 6)."""

from __future__ import annotations

import errno
import json
import time
from pathlib import Path

import numpy as np
import pytest
from grpc_processes import free_port

from fedpenalty import cli
from fedpenalty.coordinator import checkpoint

SETTINGS = [
    "--set", "run.transport='inprocess'",
    "--set", "data.owners=3",
    "--set", "data.n_per_owner=500",
    "--set", "sampler.chains=2",
    "--set", "sampler.iterations=600",
    "--set", "sampler.warmup=100",
    "--set", "sampler.step=0.02",
    "--set", "privacy.budget_epsilon=1e6",
    "--set", "run.checkpoint_every=100",
    "--no-progress",
]  # fmt: skip

SCENARIO = """
[model]
name = "gaussian_mean"

[sampler]
algorithm = "penalty"
iterations = 100
warmup = 0
step = 0.01
"""

NO_SPACE = OSError(errno.ENOSPC, "No space left on device")


def error_lines(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith("fedpenalty: error:")]


def test_an_out_under_a_file_is_refused_in_one_line_before_any_owner_is_asked(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "run"
    assert cli.main(["simulate", "--out", str(out), "--no-progress"]) == 2
    assert error_lines(capsys) == [
        f"fedpenalty: error: cannot write the run directory {out} (Not a directory): name a "
        "directory you can write with --out (or run.out)"
    ]

    # `run` says so at once: the owner address it was given is never dialled (nothing listens
    # there; asking it first took run.retry_seconds and ended "unreachable")
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO)
    began = time.monotonic()
    owners = f"127.0.0.1:{free_port()}"
    assert cli.main(["run", str(scenario), "--owners", owners, "--out", str(out)]) == 2
    assert time.monotonic() - began < 5.0  # well inside run.retry_seconds (20 s)
    [line] = error_lines(capsys)
    assert f"cannot write the run directory {out} (Not a directory)" in line


def test_a_run_directory_that_cannot_be_written_leaves_nothing_behind(
    tmp_path, capsys, monkeypatch
):
    write_text = Path.write_text

    def full_disk(self, *args, **kwargs):
        if self.name == "config.toml":
            raise NO_SPACE
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    out = tmp_path / "run"
    assert cli.main(["simulate", *SETTINGS, "--out", str(out)]) == 2
    assert error_lines(capsys) == [
        f"fedpenalty: error: cannot write the run directory {out} (No space left on device): "
        "name a directory you can write with --out (or run.out)"
    ]
    assert not out.exists()


def fail_once(monkeypatch, module, name: str, on_call: int) -> None:
    """``module.name`` raises ENOSPC on its ``on_call``-th call, and only then."""
    real, calls = getattr(module, name), [0]

    def failing(*args, **kwargs):
        calls[0] += 1
        if calls[0] == on_call:
            raise NO_SPACE
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, failing)


def reference(tmp_path, capsys) -> Path:
    out = tmp_path / "reference"
    assert cli.main(["simulate", *SETTINGS, "--out", str(out)]) == 0
    capsys.readouterr()
    return out


def assert_same_run(resumed: Path, uninterrupted: Path) -> None:
    """The same draws, and every owner charged what the uninterrupted run charged."""
    for name in ("theta", "accepted"):
        np.testing.assert_array_equal(
            np.load(resumed / "samples.npz")[name], np.load(uninterrupted / "samples.npz")[name]
        )
    charged = [
        [(o["answers"], o["epsilon"]) for o in json.loads((d / "privacy.json").read_text())[key]]
        for d in (resumed, uninterrupted)
        for key in ["owners"]
    ]
    assert charged[0] == charged[1] and len(charged[0]) == 3
    assert json.loads((resumed / "run.json").read_text())["complete"]
    assert not (resumed / "checkpoint.npz").exists()


def test_a_checkpoint_that_cannot_be_written_stops_the_run_resumably(tmp_path, capsys, monkeypatch):
    uninterrupted = reference(tmp_path, capsys)
    out = tmp_path / "run"
    fail_once(monkeypatch, checkpoint, "save", on_call=3)  # written at 100 and 200, not at 300
    assert cli.main(["simulate", *SETTINGS, "--out", str(out)]) == 2
    assert error_lines(capsys) == [
        f"fedpenalty: error: could not write the checkpoint {out / 'checkpoint.npz'} (No space "
        f"left on device) after 300 of 700 iterations; the run stopped and {out} is kept (the "
        "owners' ledgers hold what they answered): free space or make the directory writable, "
        f"then `fedpenalty simulate --resume {out}` continues it from its last checkpoint, "
        "charging nothing twice"
    ]
    assert checkpoint.load(out / "checkpoint.npz").done == 200
    assert (out / "ledger.sqlite").exists() and (out / "run.json").exists()

    monkeypatch.undo()  # the disk has room again
    assert cli.main(["simulate", "--resume", str(out)]) == 0
    assert_same_run(out, uninterrupted)


@pytest.mark.parametrize("file", ["samples.npz", "run.json"])
def test_outputs_that_cannot_be_written_after_the_last_iteration_are_written_by_a_resume(
    tmp_path, capsys, monkeypatch, file
):
    uninterrupted = reference(tmp_path, capsys)
    out = tmp_path / "run"
    if file == "samples.npz":
        fail_once(monkeypatch, np, "savez_compressed", on_call=1)
    else:  # run.json: written at session open, then (failing) to mark the run complete
        replace = Path.replace
        calls = [0]

        def failing(self, target):
            calls[0] += Path(target).name == "run.json"
            if Path(target).name == "run.json" and calls[0] == 2:
                raise NO_SPACE
            return replace(self, target)

        monkeypatch.setattr(Path, "replace", failing)
    assert cli.main(["simulate", *SETTINGS, "--out", str(out)]) == 2
    [line] = error_lines(capsys)
    # a full disk fails a write, which names no file: then the run directory is named
    where = f"the run's files in {out}" if file == "samples.npz" else out / file
    assert line == (
        f"fedpenalty: error: could not write {where} (No space left on device): free space or "
        f"make {out} writable, then `fedpenalty simulate --resume {out}` writes them again, "
        "charging nothing twice"
    )
    assert checkpoint.load(out / "checkpoint.npz").done == 700  # the session is still open
    monkeypatch.undo()
    assert cli.main(["simulate", "--resume", str(out)]) == 0
    assert_same_run(out, uninterrupted)


def test_simulated_owners_whose_files_cannot_be_written_are_one_line(tmp_path, capsys, monkeypatch):
    # local owner-host processes get their records through a file in the run directory
    fail_once(monkeypatch, np, "savez", on_call=1)
    out = tmp_path / "run"
    grpc = [*SETTINGS, "--set", "run.transport='grpc'"]
    assert cli.main(["simulate", *grpc, "--out", str(out)]) == 2
    assert error_lines(capsys) == [
        f"fedpenalty: error: could not start the simulated owners (No space left on device; "
        f"their files go to {out}): free space or make {out} writable"
    ]
    assert not out.exists()  # no owner was asked anything: nothing to keep
