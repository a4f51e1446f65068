"""The readout-temperature fit (analysis/battery/calibration.py) against closed forms and brute force."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import special, stats

from analysis.battery.calibration import readout_temperature, temperature_from_frames, temperature_loglik


def test_two_options_closed_form() -> None:
    # one trial, logit gap d = 2, 70 of 100 draws on the first option:
    # sigmoid(d / T) = 0.7  =>  T = d / logit(0.7) = 2 / 0.8473 = 2.3604
    fit = readout_temperature([[0.0, -2.0]], [[70, 30]])
    assert fit.temperature == pytest.approx(2 / math.log(0.7 / 0.3), rel=1e-6)
    assert fit.lo < fit.temperature < fit.hi and fit.n_samples == 100 and fit.n_trials == 1


def test_brute_force_grid_and_profile_interval() -> None:
    logprobs = [[-0.2, -1.9, -3.5], [-1.0, -0.7, -2.2], [-0.1, -2.6, -4.0]]
    counts = [[60, 25, 15], [30, 50, 20], [80, 15, 5]]
    fit = readout_temperature(logprobs, counts)
    ls = [np.array(x) for x in logprobs]
    ns = [np.array(x, dtype=float) for x in counts]
    grid = np.exp(np.linspace(math.log(0.05), math.log(20), 20001))
    ll = np.zeros_like(grid)
    for lv, nv in zip(ls, ns, strict=True):  # the log-likelihood on the whole grid at once, independently coded
        z = lv[None, :] / grid[:, None]
        ll += (nv[None, :] * (z - special.logsumexp(z, axis=1, keepdims=True))).sum(axis=1)
    assert fit.temperature == pytest.approx(grid[ll.argmax()], rel=1e-3)
    # the interval ends are where the log-likelihood has dropped by chi2(1, 0.95) / 2
    drop = stats.chi2.ppf(0.95, 1) / 2
    for end in (fit.lo, fit.hi):
        assert temperature_loglik(end, ls, ns) == pytest.approx(fit.loglik - drop, abs=1e-6)
    inside = grid[ll >= fit.loglik - drop]
    assert fit.lo == pytest.approx(inside.min(), rel=1e-3) and fit.hi == pytest.approx(inside.max(), rel=1e-3)


def test_recovers_the_sampling_temperature_in_simulation() -> None:
    # Deterministic: every logit and count comes from default_rng(0), so the false-failure rate is 0. (At a
    # fresh seed the 95% interval would miss tau about one run in 20, three temperatures at a time.)
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 1.5, size=(40, 4))
    logprobs = logits - special.logsumexp(logits, axis=1, keepdims=True)
    for tau in (0.5, 1.0, 2.0):
        p = special.softmax(logprobs / tau, axis=1)
        counts = np.array([rng.multinomial(200, row) for row in p])
        fit = readout_temperature(logprobs.tolist(), counts.tolist())
        assert fit.lo <= tau <= fit.hi
        assert fit.temperature == pytest.approx(tau, rel=0.1)


def test_uninformative_trials_are_skipped_and_errors_name_the_problem() -> None:
    fit = readout_temperature([[0.0, -1.0], [-0.5, -0.5], [0.0, -1.0]], [[7, 3], [5, 5], [0, 0]])
    assert fit.n_trials == 1 and fit.n_samples == 10
    with pytest.raises(ValueError, match="nothing to fit"):
        readout_temperature([[-0.5, -0.5]], [[3, 7]])
    with pytest.raises(ValueError, match="one count per option"):
        readout_temperature([[0.0, -1.0]], [[1, 2, 3]])
    with pytest.raises(ValueError, match="2 trials but counts has 1"):
        readout_temperature([[0.0, -1.0], [0.0, -1.0]], [[1, 2]])
    # all draws on one option: the fit runs to the cold end, the upper bound stays finite
    fit = readout_temperature([[0.0, -1.0]], [[50, 0]])
    assert fit.temperature < 0.01 and fit.lo == 0.0 and math.isfinite(fit.hi)


def test_from_frames_joins_by_trial_and_option() -> None:
    ro = pd.DataFrame(
        {"trial_id": ["a", "a", "b", "b"], "option": ["Yes", "No", "No", "Yes"], "logprob": [0.0, -2.0, -1.0, -3.0]}
    )
    so = pd.DataFrame({"trial_id": ["a", "a", "b", "b"], "option": ["No", "Yes", "Yes", "No"], "count": [3, 7, 1, 9]})
    fit = temperature_from_frames(ro, so)
    direct = readout_temperature([[-2.0, 0.0], [-1.0, -3.0]], [[3, 7], [9, 1]])
    assert fit.temperature == pytest.approx(direct.temperature, rel=1e-9)
    with pytest.raises(ValueError, match="lacks columns"):
        temperature_from_frames(ro.drop(columns="logprob"), so)
