"""fedpenalty: differentially private Bayesian inference across data owners who do not pool data."""

__version__ = "0.1.0"
