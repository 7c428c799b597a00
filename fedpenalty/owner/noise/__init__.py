"""Exact, counter-based noise for owners' answers: pure numpy + ``cryptography``.

Why. Floating-point Gaussian samples lie on a data-independent grid of representable values,
so a float answer λ + ξ can reveal λ exactly (Mironov 2012, "On significance of the least
significant bits for differential privacy"). Owners therefore release lattice points only:
the exact value is rounded to the lattice γℤ and noise is drawn *exactly* from the discrete
Gaussian on γℤ (Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for Differential
Privacy", Algorithms 1–3), from cryptographically secure bits. Every released answer is then
an exact multiple of γ whose distribution is the one the accountant assumes.

Counter-based. All randomness is a pure function of (owner's noise key, purpose, session,
query kind, chain, iteration, component or record index, word index) — never of how many
answers came before — so a resumed run draws identical noise and one sample's value does not
depend on the batch it was drawn in.

Modules (docs/design.md §2.7, §4): ``sources`` (noise keys and the word sources ChaCha20 and
Philox), ``exact`` (the exact discrete-Gaussian and Bernoulli-exp samplers and keyed Poisson
subsampling), ``lattice`` (rounding to γℤ, its sensitivity, noisy lattice answers) and
``seeded`` (SIMULATION ONLY: counter-based float normals and samples for simulated owners).
"""
