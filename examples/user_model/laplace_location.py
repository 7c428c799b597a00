"""A Laplace location model, written as a fedpenalty user would: records are numbers x,
x ~ Laplace(θ, scale), θ in [-theta_bound, theta_bound] with a normal prior.

No Lipschitz bound is declared: the owners clip each record's log-likelihood ratio at
sampler.ratio_clip instead (see scenario.toml).
"""

from typing import ClassVar

import numpy as np

from fedpenalty.models.api import Configured, Model, Param, as_theta, validate_raw


class LaplaceLocation(Configured, Model):
    PARAMS: ClassVar[dict[str, Param]] = {
        "scale": Param(1.0, "positive", "scale b of the Laplace noise"),
        "data_bound": Param(10.0, "positive", "records are clipped to [-data_bound, data_bound]"),
        "theta_bound": Param(5.0, "positive", "θ lies in [-theta_bound, theta_bound]"),
        "prior_sd": Param(10.0, "positive", "sd of the N(0, prior_sd²) prior on θ"),
    }

    def _setup(self):
        p = self.params()
        self.dim, self.theta_bound = 1, p["theta_bound"]
        self.scale, self.data_bound, self.prior_sd = p["scale"], p["data_bound"], p["prior_sd"]

    @property
    def column_names(self):
        return ["x"]

    def prepare_records(self, raw):
        x = validate_raw(raw, self.column_names, self.name)
        return np.clip(x, -self.data_bound, self.data_bound)

    def simulate_records(self, rng, theta, n):
        x = rng.laplace(float(np.ravel(theta)[0]), self.scale, size=(n, 1))
        return np.clip(x, -self.data_bound, self.data_bound)

    def log_lik(self, records, theta):
        t = as_theta(theta, 1)  # (C, 1)
        return -np.abs(records[:, 0][None, :] - t) / self.scale - np.log(2 * self.scale)

    def grad_log_lik(self, records, theta):
        t = as_theta(theta, 1)
        return (np.sign(records[:, 0][None, :] - t) / self.scale)[:, :, None]

    def log_prior(self, theta):
        return -0.5 * (as_theta(theta, 1)[:, 0] / self.prior_sd) ** 2

    def grad_log_prior(self, theta):
        return -as_theta(theta, 1) / self.prior_sd**2
