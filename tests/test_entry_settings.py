"""Settings and outputs per registry entry (docs/design.md §6): the flat [sampler] and [run]
sections are assembled from the generic keys and each entry's settings model; a kernel's
declared info fields reach the driver's progress, checkpoints and sample_stats; the driver
reads a state's position, nothing else."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from pydantic import Field

from fedpenalty.config import GenericRun, GenericSampler, RunSection, SamplerSection, assembled
from fedpenalty.coordinator import checkpoint
from fedpenalty.coordinator.algorithms import ALGORITHMS
from fedpenalty.coordinator.base import (
    NOISE_VARIANCE,
    QUERIED,
    ChainAlgorithm,
    InfoField,
    SamplingAlgorithm,
)
from fedpenalty.coordinator.driver import SamplingStopped, sample
from fedpenalty.coordinator.transports import TRANSPORTS
from fedpenalty.errors import Interrupted
from fedpenalty.schema import PositiveFloat, Section


def test_the_flat_sections_are_the_generic_keys_and_every_entrys_own():
    own = {k for a in ALGORITHMS.values() for k in a.options.model_fields}
    assert set(SamplerSection.model_fields) == set(GenericSampler.model_fields) | own
    assert next(iter(SamplerSection.model_fields)) == "algorithm"
    transports = {k for t in TRANSPORTS.values() for k in t.options.model_fields}
    assert set(RunSection.model_fields) == set(GenericRun.model_fields) | transports
    assert {"ray_address", "retry_seconds", "owner_hosts"} <= transports
    assert {"clip", "friction", "block", "adapt_step", "ops_mh_steps"} <= own
    for name, entry in ALGORITHMS.items():
        if isinstance(entry, ChainAlgorithm):
            assert entry.settings == (*entry.generic, *entry.options.model_fields), name


class _Knob(Section):
    knob: PositiveFloat = Field(default=1.0, description="toy: a knob")


class _OtherKnob(Section):
    knob: PositiveFloat = Field(default=2.0, description="toy: another meaning")


class _Step(Section):
    step: PositiveFloat = Field(default=1.0, description="toy: a second step")


@dataclass(frozen=True)
class _Entry:
    options: type[Section]


def test_a_key_with_two_meanings_fails_at_assembly():
    shared = assembled("S", GenericSampler, [_Entry(_Knob), _Entry(_Knob)])
    assert shared.model_fields["knob"].default == 1.0
    with pytest.raises(TypeError, match="'knob' is declared by _Knob and by _OtherKnob"):
        assembled("S", GenericSampler, [_Entry(_Knob), _Entry(_OtherKnob)])
    with pytest.raises(TypeError, match="'step' is declared by GenericSampler and by _Step"):
        assembled("S", GenericSampler, [_Entry(_Step)])


@dataclass(frozen=True)
class _Walk:
    """A toy state whose draw is not called theta."""

    where: np.ndarray
    iteration: int = 0

    @property
    def position(self) -> np.ndarray:
        return self.where


SQUARE = InfoField("square", np.float64, "toy: the position squared", fill=np.nan)
HIDDEN = InfoField("hidden", np.float64, "toy: counted, not kept", kept=False)


def _walk(stop_at: int | None = None) -> SamplingAlgorithm:
    """A random walk reporting ``square`` per draw and deriving ``twice`` after the run."""

    def init(rng: np.random.Generator, theta0: np.ndarray) -> _Walk:
        return _Walk(np.array(theta0, dtype=float))

    def step(rng: np.random.Generator, state: _Walk):
        if state.iteration == stop_at:
            raise KeyboardInterrupt
        new = _Walk(state.where + rng.normal(size=state.where.shape), state.iteration + 1)
        chains = len(new.where)
        info = {
            QUERIED.name: np.ones(chains, dtype=bool),
            NOISE_VARIANCE.name: np.full(chains, 0.5),
            SQUARE.name: new.where[:, 0] ** 2,
            HIDDEN.name: np.zeros(chains),
        }
        return new, info

    def derived(state: _Walk, warmup: int, shape: tuple[int, int]):
        return {"twice": np.full(shape, 2.0 * state.iteration)}

    return SamplingAlgorithm(init, step, (QUERIED, NOISE_VARIANCE, SQUARE, HIDDEN), None, derived)


def test_declared_info_fields_reach_the_outputs_and_survive_a_resume(tmp_path, monkeypatch):
    registered = checkpoint.state_classes()  # _Walk loads as a registered kernel's state would
    monkeypatch.setattr(checkpoint, "state_classes", lambda: {**registered, "_Walk": _Walk})
    theta0 = np.zeros((2, 1))
    run = dict(iterations=6, warmup=2, progress=False)
    whole = sample(_walk(), np.random.default_rng(1), theta0, **run)
    assert list(whole.stats) == ["queried", "noise_variance", "square", "twice"]
    np.testing.assert_array_equal(whole.stats["square"], whole.theta[:, :, 0] ** 2)
    np.testing.assert_array_equal(whole.stats["twice"], np.full((2, 6), 16.0))
    assert whole.accepted is None and whole.noise_var == 0.5

    path = tmp_path / "checkpoint.npz"
    with pytest.raises(SamplingStopped) as stop:
        sample(
            _walk(stop_at=5),
            np.random.default_rng(1),
            theta0,
            **run,
            checkpoint=lambda p: checkpoint.save(path, p),
            checkpoint_every=1,
        )
    assert isinstance(stop.value.cause, Interrupted)
    saved = checkpoint.load(path)
    assert list(saved.stats) == ["square"] and saved.derive is None
    resumed = sample(_walk(), np.random.default_rng(7), theta0, **run, resume=saved)
    for name, values in whole.stats.items():
        np.testing.assert_array_equal(resumed.stats[name], values)
    np.testing.assert_array_equal(resumed.theta, whole.theta)


def test_a_kernel_must_report_which_chains_asked():
    walk = _walk()
    silent = walk._replace(info=tuple(f for f in walk.info if f is not QUERIED))
    with pytest.raises(ValueError, match=r"base\.QUERIED"):
        sample(silent, np.random.default_rng(0), np.zeros((1, 1)), iterations=1, warmup=0)
