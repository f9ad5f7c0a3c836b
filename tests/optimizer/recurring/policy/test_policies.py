"""The paper's policies: Gaussian TS, pruning exploration, the BSOs and the JIT PLO."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zeus.job import Job
from zeus.policy import (
    BatchSizeOptimizer,
    GaussianTS,
    GTSBatchSizeOptimizer,
    JITPowerLimitOptimizer,
    PowerLimitOptimizer,
    PruningExploreManager,
    PruningGTSBatchSizeOptimizer,
)

JOB = Job("d", "n", "adam", 0.5, 10, default_bs=32)


def reference_predict(seed: int, arms: list[int], means: dict, precs: dict, calls: int) -> list:
    """The reference's draw order, written out with numpy: permutation, then normals."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(calls):
        rng.choice(np.array(arms), len(arms), replace=False)
        samples = [rng.normal(means[a], np.sqrt(1 / precs[a])) for a in arms]
        out.append(arms[int(np.argmax(samples))])
    return out


@given(
    st.lists(st.integers(1, 4096), min_size=1, max_size=8, unique=True),
    st.integers(0, 2**32),
    st.data(),
)
@settings(max_examples=60, deadline=None)
def test_gaussian_ts_consumes_randomness_like_the_reference(arms, seed, data) -> None:
    ts = GaussianTS(arms, reward_precision=1.0, num_exploration=1, seed=seed, verbose=False)
    means, precs = {}, {}
    for a in arms:
        rewards = data.draw(st.lists(st.floats(-1e4, 0), min_size=1, max_size=4))
        ts.fit_arm(a, np.array(rewards), reset=True)
        means[a], precs[a] = ts.arm_param_mean[a], ts.arm_param_prec[a]
    assert [ts.predict() for _ in range(5)] == reference_predict(seed, arms, means, precs, 5)


@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=20), st.floats(0.01, 10.0))
def test_conjugate_update_is_order_free(rewards, rp) -> None:
    a = GaussianTS([1], rp, verbose=False)
    b = GaussianTS([1], rp, verbose=False)
    a.fit_arm(1, np.array(rewards), reset=True)
    for r in rewards:
        b.fit_arm(1, np.array([r]), reset=False)
    assert a.arm_param_mean[1] == pytest.approx(b.arm_param_mean[1], rel=1e-6, abs=1e-6)
    assert a.arm_param_prec[1] == pytest.approx(b.arm_param_prec[1])
    assert a.arm_num_observations[1] == len(rewards)
    # With a flat prior the posterior mean is the sample mean.
    assert a.arm_param_mean[1] == pytest.approx(np.mean(rewards), rel=1e-6, abs=1e-6)


@given(st.integers(1, 8), st.integers(1, 3), st.integers(0, 10**6))
def test_exploration_pulls_each_arm_num_exploration_times(n, k, seed) -> None:
    arms = list(range(1, n + 1))
    ts = GaussianTS(arms, 1.0, num_exploration=k, seed=seed, verbose=False)
    pulls = []
    for _ in range(n * k):
        a = ts.predict()
        pulls.append(a)
        ts.fit_arm(a, np.array([0.0]), reset=False)
    assert sorted(pulls) == sorted(arms * k)


def test_ts_prefers_the_clearly_better_arm() -> None:
    ts = GaussianTS([8, 16], float("inf"), verbose=False)
    ts.fit_arm(8, np.array([-10.0, -10.0]), reset=True)
    ts.fit_arm(16, np.array([-5.0]), reset=True)
    assert all(ts.predict() == 16 for _ in range(10))


def test_ts_rejects_bad_arms() -> None:
    with pytest.raises(ValueError):
        GaussianTS([], 1.0)
    with pytest.raises(ValueError):
        GaussianTS([1, 1], 1.0)
    with pytest.raises(ValueError, match="3 arms"):
        GaussianTS([1, 2, 3], [1.0, 2.0])
    with pytest.raises(ValueError, match="Unknown arm 7"):
        GaussianTS([1], 1.0).fit_arm(7, np.array([1.0]), reset=False)


def explore(manager: PruningExploreManager, results: dict) -> tuple[list[int], list[int]]:
    seen = []
    while True:
        try:
            bs = manager.next_batch_size()
        except StopIteration as stop:
            return seen, stop.value
        seen.append(bs)
        manager.report_batch_size_result(bs, *results[bs])


def test_pruning_order_matches_reference() -> None:
    results = {8: (0, False), 16: (1.0, True), 32: (2.0, True), 64: (3.0, True), 128: (0, False)}
    seen, survivors = explore(PruningExploreManager([8, 16, 32, 64, 128], 32), results)
    assert seen == [32, 16, 8, 64, 128, 16, 32, 64]
    assert survivors == [16, 32, 64]


def test_pruning_checks_the_reported_batch_size() -> None:
    m = PruningExploreManager([8, 16], 16)
    assert m.next_batch_size() == 16
    with pytest.raises(RuntimeError, match="expecting"):
        m.report_batch_size_result(8, 1.0, True)
    with pytest.raises(ValueError, match="Default batch size 4"):
        PruningExploreManager([8, 16], 4)


@given(
    st.lists(st.tuples(st.floats(0, 100), st.booleans()), min_size=6, max_size=6),
    st.integers(0, 5),
)
def test_pruning_survivors_reached_and_each_seen_twice(results, d) -> None:
    bss = [4, 8, 16, 32, 64, 128]
    seen, survivors = explore(PruningExploreManager(bss, bss[d]), dict(zip(bss, results)))
    assert len(seen) <= 2 * len(bss)
    for bs in survivors:
        assert dict(zip(bss, results))[bs][1]
        assert seen.count(bs) == 2


def test_pruning_gts_moves_to_bandit_and_finds_cheapest() -> None:
    bso = PruningGTSBatchSizeOptimizer(seed=1, verbose=False)
    bso.register_job(JOB, [8, 16, 32, 64])
    cost = {8: 30.0, 16: 10.0, 32: 20.0, 64: 40.0}
    rng = np.random.default_rng(0)
    picks = []
    for _ in range(60):
        bs = bso.predict(JOB)
        picks.append(bs)
        bso.observe(JOB, bs, cost[bs] + rng.normal(0, 1), True)
    assert JOB in bso.mabs
    assert picks[-20:].count(16) >= 15


def test_pruning_gts_requires_default_and_registration() -> None:
    bso = PruningGTSBatchSizeOptimizer(verbose=False)
    with pytest.raises(ValueError, match="Default BS"):
        bso.register_job(Job("d", "n", "adam", 0.5, 10), [8])
    with pytest.raises(ValueError, match="empty"):
        bso.register_job(JOB, [])
    with pytest.raises(ValueError, match="not registered"):
        bso.predict(JOB)


def test_gts_bso_learns_precision_and_rejects_unknown_bs() -> None:
    bso = GTSBatchSizeOptimizer(learn_reward_precision=True, seed=3, verbose=False)
    bso.register_job(JOB, [8, 16])
    bso.observe(JOB, 8, 5.0)
    bso.observe(JOB, 8, 5.0)
    assert bso.mabs[JOB].arm_reward_prec[8] == np.inf
    assert bso.mabs[JOB].arm_param_mean[8] == -5.0
    bso.observe(JOB, 8, 7.0)
    assert bso.mabs[JOB].arm_reward_prec[8] == pytest.approx(1 / np.var([-5, -5, -7]))
    with pytest.raises(ValueError, match="Unknown batch size '32'"):
        bso.observe(JOB, 32, 1.0)


def test_jit_plo_keeps_cheapest_first_on_ties() -> None:
    plo = JITPowerLimitOptimizer(verbose=False)
    assert plo.predict(JOB, 8) is None
    for pl, c in [(250, 5.0), (225, 4.0), (200, 4.0), (175, 4.5)]:
        plo.observe(JOB, 8, pl, c)
    assert plo.predict(JOB, 8) == 225
    assert plo.predict(JOB, 16) is None


def test_interfaces_are_abstract() -> None:
    with pytest.raises(TypeError):
        BatchSizeOptimizer()  # type: ignore[abstract]
    with pytest.raises(TypeError):
        PowerLimitOptimizer()  # type: ignore[abstract]
