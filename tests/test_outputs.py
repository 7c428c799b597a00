"""What a run leaves for a person: posterior.nc read back with ArviZ, the figures, the mixing
warnings, the console's privacy summary, and the clean failures (docs/design.md §5)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import arviz_base
import arviz_stats
import numpy as np
import pytest
import xarray as xr

from fedpenalty.cli import main, stop_message
from fedpenalty.diagnostics import mixing_warnings
from fedpenalty.errors import InvalidRequest
from fedpenalty.inference_data import SpendTrace
from fedpenalty.plots import MAX_PARAMS, privacy_figure, privacy_plot, shown_params
from fedpenalty.simulation import RunResult

INPROCESS = ["--set", "run.transport='inprocess'", "--no-progress"]
SMALL = [
    *INPROCESS,
    "--set",
    "data.n_per_owner=2000",
    "--set",
    "sampler.iterations=300",
    "--set",
    "sampler.warmup=50",
    "--set",
    "sampler.step=0.02",
    "--set",
    "privacy.budget_epsilon=1000",
]


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_posterior_nc_round_trips_through_arviz(capsys, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = run_cli(
        capsys,
        "simulate",
        *SMALL,
        "--set",
        "model.dim=2",
        "--set",
        "data.true_theta=[0.5, -0.5]",
        "--out",
        str(out),
    )
    assert code == 0, err
    tree = arviz_base.convert_to_datatree(str(out / "posterior.nc"))
    assert {"posterior", "sample_stats", "privacy_spend", "reference"} <= set(tree.children)
    with np.load(out / "samples.npz") as samples:
        theta, accepted = samples["theta"], samples["accepted"]
    posterior = tree["posterior"]
    assert posterior["theta"].dims == ("chain", "draw", "param")
    assert list(posterior["param"].values) == ["mu0", "mu1"]  # named by the model
    np.testing.assert_array_equal(posterior["theta"].values, theta)
    stats = tree["sample_stats"]
    np.testing.assert_array_equal(stats["accepted"].values, accepted)
    queried = stats["queried"].values
    # four owners at σ = 1: the penalty's noise variance is s² = 4 wherever owners were asked
    np.testing.assert_allclose(stats["noise_variance"].values[queried], 4.0)
    assert np.isnan(stats["noise_variance"].values[~queried]).all()
    np.testing.assert_allclose(stats["step_size"].values, 0.02)
    diagnostics = json.loads((out / "diagnostics.json").read_text())
    # ArviZ reads the same R-hat from the file as the run computed from the draws
    rhat = arviz_stats.rhat(tree, group="posterior")["theta"].values
    np.testing.assert_allclose(rhat, diagnostics["rhat"], rtol=1e-12)
    assert "mu0" in stdout and "mu1" in stdout  # the console names the parameters too


def test_privacy_spend_group_is_each_owners_ledger_running_total(capsys, tmp_path):
    out = tmp_path / "run"
    assert run_cli(capsys, "simulate", *SMALL, "--out", str(out))[0] == 0
    privacy = json.loads((out / "privacy.json").read_text())
    with xr.open_datatree(out / "posterior.nc") as tree:
        spend = tree["privacy_spend"].to_dataset().load()
    assert list(spend["owner"].values) == [o["owner"] for o in privacy["owners"]]
    iterations = spend["iteration"].values
    assert iterations[0] == 0 and iterations[-1] == 350 and np.all(np.diff(iterations) > 0)
    eps = spend["epsilon"].values
    assert np.all(eps[:, 0] == 0) and np.all(np.diff(eps, axis=1) >= 0)
    # the last point is what each ledger reports at the end (privacy.json)
    np.testing.assert_allclose(eps[:, -1], [o["epsilon"] for o in privacy["owners"]])
    np.testing.assert_array_equal(
        spend["answers"].values[:, -1], [o["answers"] for o in privacy["owners"]]
    )
    assert (out / "privacy.png").stat().st_size > 0
    assert (out / "rank.png").stat().st_size > 0 and (out / "trace.png").stat().st_size > 0


def test_spend_trace_survives_netcdf_and_a_resume_keeps_earlier_points(tmp_path):
    from fedpenalty.common import PrivacyReport, SpendReport

    def reports(answers: int) -> list[PrivacyReport]:
        spend = SpendReport(answers, 0.1 * answers, 0.5 * answers, 9.0 * answers)
        return [PrivacyReport(f"o{k}", 10, 1e-5, 10.0, "replace_one", spend, spend) for k in (0, 1)]

    trace = SpendTrace.empty(reports(0))
    for t in (0, 5, 10, 15):
        trace = trace.added(t, reports(t), gradient=False)
    back = SpendTrace.from_dataset(trace.to_dataset())
    np.testing.assert_array_equal(back.epsilon, trace.epsilon)
    assert back.owners == ("o0", "o1")
    resumed = back.before(10)  # a run resumed after 10 iterations keeps the points before it
    np.testing.assert_array_equal(resumed.iterations, [0, 5])


def test_a_refused_run_leaves_nothing_and_its_advice_makes_the_rerun_fit(capsys, tmp_path):
    out = tmp_path / "run"
    tight = [*INPROCESS, "--set", "data.n_per_owner=2000", "--set", "privacy.budget_epsilon=2"]
    code, _, err = run_cli(capsys, "simulate", *tight, "--out", str(out))
    assert code == 2 and "refused the run at session open" in err
    assert len(err.strip().splitlines()) == 1  # one line, no traceback
    assert not out.exists()  # nothing was sampled: no run directory is left behind
    for key in ("privacy.budget_epsilon ≥", "privacy.sigma ≥", "sampler.step", "fewer answers"):
        assert key in err
    per_chain = int(re.search(r"sampler\.iterations ≤ (\d+)", err).group(1))
    # the advice is exact: one more iteration per chain than it says is refused again ...
    longer = ["--set", "sampler.warmup=0", "--set", f"sampler.iterations={per_chain + 1}"]
    code, _, err2 = run_cli(capsys, "simulate", *tight, *longer, "--out", str(out))
    assert code == 2 and "refused" in err2 and not out.exists()
    # ... and as many as it says run, into the same --out
    fits = ["--set", "sampler.warmup=0", "--set", f"sampler.iterations={per_chain}"]
    code, _, err3 = run_cli(capsys, "simulate", *tight, *fits, "--out", str(out))
    assert code == 0, err3
    assert (out / "samples.npz").exists()


def test_the_sigma_and_step_the_refusal_names_make_the_same_plan_fit(capsys, tmp_path):
    tight = [
        *INPROCESS,
        "--set",
        "data.n_per_owner=2000",
        "--set",
        "privacy.budget_epsilon=0.5",
        "--set",
        "sampler.iterations=500",
        "--set",
        "sampler.warmup=0",
    ]
    code, _, err = run_cli(capsys, "simulate", *tight, "--out", str(tmp_path / "a"))
    assert code == 2 and "plan of 2000 penalty answers" in err
    sigma = float(re.search(r"privacy\.sigma ≥ ([0-9.e+-]+)", err).group(1))
    step = float(re.search(r"privacy\.max_step, if set\) ≤ ([0-9.e+-]+)", err).group(1))
    code, _, err = run_cli(
        capsys, "simulate", *tight, "--set", f"privacy.sigma={sigma}", "--out", str(tmp_path / "b")
    )
    assert code == 0, err
    code, _, err = run_cli(
        capsys, "simulate", *tight, "--set", f"sampler.step={step}", "--out", str(tmp_path / "c")
    )
    assert code == 0, err
    # a little less than the advice does not fit: it is a bound, not a guess
    code, _, err = run_cli(
        capsys,
        "simulate",
        *tight,
        "--set",
        f"privacy.sigma={sigma * 0.97}",
        "--out",
        str(tmp_path / "d"),
    )
    assert code == 2 and "refused" in err


def test_out_naming_a_file_is_one_clear_line(capsys, tmp_path):
    path = tmp_path / "file.txt"
    path.write_text("x")
    code, _, err = run_cli(capsys, "simulate", *SMALL, "--out", str(path))
    assert code == 2 and "is a file, not a directory" in err and "--out" in err
    assert len(err.strip().splitlines()) == 1 and path.read_text() == "x"


def test_unmixed_chains_warn_and_mixed_ones_do_not(capsys, tmp_path):
    short = ["--set", "sampler.iterations=30", "--set", "sampler.warmup=0"]
    code, _, err = run_cli(capsys, "simulate", *SMALL, *short, "--out", str(tmp_path / "a"))
    assert code == 0
    diagnostics = json.loads((tmp_path / "a" / "diagnostics.json").read_text())
    assert diagnostics["warnings"] and "bulk ESS" in diagnostics["warnings"][0]
    assert "warning: mu:" in err and "have not mixed" in err
    # exact MH on the pooled data, long enough: R-hat ≤ 1.01 and ESS ≥ 100 per chain
    exact = [
        "--set",
        "sampler.algorithm='exact_mh'",
        "--set",
        "sampler.iterations=3000",
        "--set",
        "sampler.step=0.03",
        "--set",
        "sampler.init_scale=0.1",
    ]
    code, _, err = run_cli(capsys, "simulate", *SMALL, *exact, "--out", str(tmp_path / "b"))
    assert code == 0
    diagnostics = json.loads((tmp_path / "b" / "diagnostics.json").read_text())
    assert diagnostics["rhat"][0] <= 1.01 and diagnostics["ess_bulk"][0] >= 400
    assert diagnostics["warnings"] == [] and "warning" not in err


def test_mixing_warnings_thresholds():
    names = ["a", "b", "c"]
    warned = mixing_warnings([400.0, 399.0, 1000.0], [1.01, 1.0, 1.02], 4, names)
    assert [w.split(":")[0] for w in warned] == ["b", "c"]
    assert "R-hat 1.02 > 1.01" in warned[1] and "bulk ESS 399 < 400" in warned[0]
    assert mixing_warnings([float("nan")], None, 1, ["x"])  # NaN ESS is not "mixed"


def test_many_owners_get_a_console_summary_and_privacy_json_keeps_every_owner(capsys, tmp_path):
    out = tmp_path / "run"
    many = [
        "--set",
        "data.owners=25",
        "--set",
        "data.n_per_owner=200",
        "--set",
        "privacy.sigma=0.2",
    ]
    code, stdout, err = run_cli(capsys, "simulate", *SMALL, *many, "--out", str(out))
    assert code == 0, err
    assert "25 owners; ε over owners: min" in stdout and "median" in stdout
    assert "owner-24 " not in stdout  # no table row per owner
    assert len(json.loads((out / "privacy.json").read_text())["owners"]) == 25


def test_privacy_plot_of_many_owners_draws_a_band(tmp_path):
    privacy_plot(tmp_path / "p.png", _spend_trace(20.0, k=40))
    assert (tmp_path / "p.png").stat().st_size > 0


def _spend_trace(paper_after_start: float, k: int = 3, p: int = 6) -> SpendTrace:
    """k owners' running spend over p points; the paper's bound is 0 at iteration 0 (nothing
    spent) and ``paper_after_start`` × ε after it (inf: a deployed owner's lattice answers,
    which the classical bound does not cover)."""
    eps = np.linspace(0, 1, p)[None, :] * np.linspace(1, 2, k)[:, None]
    paper = eps * paper_after_start if np.isfinite(paper_after_start) else np.full_like(eps, np.inf)
    paper[:, 0] = 0.0
    return SpendTrace(
        tuple(f"o{i}" for i in range(k)),
        np.full(k, 1e-5),
        np.full(k, 5.0),
        np.arange(p) * 10,
        np.zeros((k, p), dtype=np.int64),
        eps,
        eps,
        paper,
    )


def _drawn_dashed_lines(ax) -> int:
    """Dashed lines of ``ax`` with at least two finite points (what a reader can see)."""
    return sum(
        1
        for line in ax.get_lines()
        if line.get_linestyle() == "--" and np.isfinite(np.asarray(line.get_ydata())).sum() >= 2
    )


@pytest.mark.parametrize("owners", [3, 40])
def test_privacy_plot_legend_names_only_what_it_draws(owners):
    """A deployed run's owners give lattice answers: the paper's bound is 0 at iteration 0 and
    does not apply after. privacy.png drew no bound but its legend named one; now the legend
    names the bound exactly when a bound is drawn (one line per owner, or the band)."""
    for paper, shown in ((np.inf, False), (20.0, True)):
        fig = privacy_figure(_spend_trace(paper, k=owners))
        (ax,) = fig.axes
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any("paper" in label for label in labels) == shown, labels
        if owners <= 3:
            assert (_drawn_dashed_lines(ax) == owners) == shown
        else:
            assert (len(ax.collections) == 2) == shown  # the ε band, and the bound's band
        fig.clf()


def test_large_runs_show_the_worst_mixed_parameters():
    assert shown_params(3, [1.5, 1.0, 1.2]) == [0, 1, 2]
    rhat = [1.0] * 10
    rhat[7], rhat[2], rhat[9], rhat[4], rhat[0] = 1.9, 1.5, 1.3, 1.2, 1.1
    assert shown_params(10, rhat) == sorted([7, 2, 9, 4][:MAX_PARAMS])


def test_a_policy_refusal_does_not_suggest_resume(tmp_path):
    cause = InvalidRequest("step 0.05 exceeds this owner's max_step 0.02", "carol")
    result = RunResult(tmp_path, {}, {"kept_draws": 10}, np.zeros((1, 10, 1)), cause)
    message = stop_message(result, resumable=True)
    assert "--resume" not in message and "sampler.step ≤ its max_step" in message
    assert "start a new run" in message


@pytest.mark.parametrize("algorithm", ["ops", "exact_mh"])
def test_runs_without_owner_ledgers_write_posterior_nc(capsys, tmp_path, algorithm):
    out = tmp_path / "run"
    code, _, err = run_cli(
        capsys, "simulate", *SMALL, "--set", f"sampler.algorithm='{algorithm}'", "--out", str(out)
    )
    assert code == 0, err
    tree = arviz_base.convert_to_datatree(str(out / "posterior.nc"))
    assert "privacy_spend" not in tree.children
    with np.load(out / "samples.npz") as samples:
        np.testing.assert_array_equal(tree["posterior"]["theta"].values, samples["theta"])


def readme_outputs() -> list[re.Pattern[str]]:
    """The files README.md's "Outputs (the run directory)" list names, as patterns of paths
    relative to the run directory (``<h>``: a host or actor number; files listed after
    "in `owners/`" live in that folder)."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text.split("### Outputs (the run directory)")[1].split("\nPast 20 owners")[0]
    patterns = []
    for item in section.split("\n* ")[1:]:
        folder = ""
        for piece in re.split(r"(in `owners/`)", " ".join(item.split())):
            if piece == "in `owners/`":
                folder = "owners/"
                continue
            for name in re.findall(
                r"`([\w<>.-]+\.(?:npz|json|nc|png|toml|sqlite|lock|log|port))`", piece
            ):
                body = re.escape(folder + name).replace(re.escape("<h>"), r"\d+")
                patterns.append(re.compile(body))
    return patterns


def files_not_in_readme(run_dir: Path) -> list[str]:
    """The files under ``run_dir`` that README.md's outputs list does not name."""
    patterns = readme_outputs()
    found = [p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file()]
    return sorted(f for f in found if not any(p.fullmatch(f) for p in patterns))


@pytest.mark.parametrize("transport", ["grpc", "inprocess"])
def test_readme_outputs_list_names_every_file_a_run_writes(capsys, tmp_path, transport):
    """The default scenario with few iterations, as a user first runs it (owner host processes
    over gRPC, the default; and in process): every file it leaves is in the README's list. The
    list missed run.json and the owners' ledgers, specs, logs and ports."""
    out = tmp_path / "run"
    code, _, err = run_cli(
        capsys, "simulate", "--no-progress", "--set", f"run.transport='{transport}'",
        "--set", "sampler.iterations=200", "--set", "sampler.warmup=50", "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    assert len(list(out.rglob("*"))) >= 10  # samples, privacy, diagnostics, nc, 3 plots, …
    assert files_not_in_readme(out) == []
    assert readme_outputs()  # the parser found the list
    (out / "unlisted.txt").write_text("")  # a file the README does not name is caught
    assert files_not_in_readme(out) == ["unlisted.txt"]
