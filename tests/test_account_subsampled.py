"""``fedpenalty account --sampling-rate``: ε of Poisson-subsampled Gaussian answers by the PLD
and RDP accountants, calibration of the noise multiplier and of the steps, and clear errors.

Reference values (Poisson sampling, add/remove, δ = 1e-5) are the issue's: q = 0.01, σ = 4,
T = 10,000 → RDP 1.03549, PLD 0.947; q = 150/60000, σ = 1.3, T = 6,000 → RDP 0.7242234026,
PLD 0.640. PLD is given to three digits by its source (the discretisation moves the fourth).
"""

from __future__ import annotations

import json

import pytest

from fedpenalty.cli import main
from fedpenalty.privacy import subsampled


def account(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["account", *args])
    out, err = capsys.readouterr()
    return code, out, err


def account_json(capsys, *args: str) -> dict:
    code, out, err = account(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize(
    "q,sigma,steps,accountant,expected,rel",
    [
        ("0.01", "4", "10000", "rdp", 1.03549, 1e-5),
        ("0.01", "4", "10000", "pld", 0.947, 5e-4),
        (str(150 / 60000), "1.3", "6000", "rdp", 0.7242234026, 1e-9),
        (str(150 / 60000), "1.3", "6000", "pld", 0.640, 5e-4),
    ],
)
def test_reference_values(capsys, q, sigma, steps, accountant, expected, rel):
    result = account_json(
        capsys,
        "--sampling-rate",
        q,
        "--noise-multiplier",
        sigma,
        "--steps",
        steps,
        "--delta",
        "1e-5",
        "--accountant",
        accountant,
        "--neighbour",
        "add_remove",
    )
    assert result["epsilon"] == pytest.approx(expected, rel=rel)
    assert result["accountant"] == accountant and result["neighbour"] == "add_remove"


def test_defaults_are_pld_and_replace_one_and_the_text_states_them(capsys):
    result = account_json(
        capsys, "--sampling-rate", "0.01", "--noise-multiplier", "4", "--steps", "1000"
    )
    assert result["accountant"] == "pld" and result["neighbour"] == "replace_one"
    assert result["epsilon"] == subsampled.epsilon(
        subsampled.SubsampledGaussian(0.01, 4.0, 1000),
        1e-5,
        neighbour="replace_one",
        accountant="pld",
    )
    code, out, _ = account(
        capsys, "--sampling-rate", "0.01", "--noise-multiplier", "4", "--steps", "1000"
    )
    assert code == 0 and "PLD accountant" in out and "replace_one: one record replaced" in out
    assert "2·clip" in out


def test_replace_one_costs_more_than_add_remove(capsys):
    args = ["--sampling-rate", "0.01", "--noise-multiplier", "2", "--steps", "500"]
    replace = account_json(capsys, *args)["epsilon"]
    add_remove = account_json(capsys, *args, "--neighbour", "add_remove")["epsilon"]
    assert replace > add_remove > 0


@pytest.mark.parametrize("accountant,neighbour", [("pld", "add_remove"), ("rdp", "replace_one")])
def test_calibrated_noise_multiplier_round_trips(capsys, accountant, neighbour):
    common = [
        "--sampling-rate",
        "0.02",
        "--steps",
        "2000",
        "--accountant",
        accountant,
        "--neighbour",
        neighbour,
    ]
    sigma = account_json(capsys, *common, "--epsilon", "1.5")["noise_multiplier"]
    eps = account_json(capsys, *common, "--noise-multiplier", repr(sigma))["epsilon"]
    assert eps <= 1.5 and eps == pytest.approx(1.5, rel=1e-3)
    below = account_json(capsys, *common, "--noise-multiplier", repr(sigma * 0.99))["epsilon"]
    assert below > 1.5  # the calibrated σ is (close to) the smallest that meets the target


def test_largest_steps_round_trip(capsys):
    common = ["--sampling-rate", "0.01", "--noise-multiplier", "1.5", "--neighbour", "add_remove"]
    steps = account_json(capsys, *common, "--epsilon", "1")["steps"]
    assert steps > 1
    assert account_json(capsys, *common, "--steps", str(steps))["epsilon"] <= 1.0
    assert account_json(capsys, *common, "--steps", str(steps + 1))["epsilon"] > 1.0


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--sampling-rate", "0.01", "--noise-multiplier", "4"],
            "give --noise-multiplier and --steps",
        ),
        (
            [
                "--sampling-rate",
                "0.01",
                "--epsilon",
                "1",
                "--noise-multiplier",
                "4",
                "--steps",
                "10",
            ],
            "at most two",
        ),
        (
            ["--sampling-rate", "1.5", "--noise-multiplier", "4", "--steps", "10"],
            "--sampling-rate must be in (0, 1]",
        ),
        (
            ["--sampling-rate", "0.01", "--noise-multiplier", "-1", "--steps", "10"],
            "--noise-multiplier must be",
        ),
        (["--sampling-rate", "0.01", "--noise-multiplier", "4", "--steps", "0"], "--steps must be"),
        (
            ["--sampling-rate", "0.01", "--noise-multiplier", "4", "--steps", "10", "--sigma", "1"],
            "--sigma",
        ),
        (["--noise-multiplier", "4", "--steps", "10"], "give --sampling-rate too"),
        (["--sigma", "1", "--neighbour", "add_remove"], "give --sampling-rate too"),
    ],
)
def test_errors_name_the_problem(capsys, args, message):
    code, out, err = account(capsys, *args)
    assert code == 2 and message in err and out == ""
