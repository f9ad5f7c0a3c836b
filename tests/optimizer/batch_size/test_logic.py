"""Property tests of the decisions the server makes through the core's batch-size policy.

`zeus._core.recurring.PruningGtsPolicy` is stateless (a job's record in, the next trial out): the
server builds it from a job's row (`logic.policy_of`) and calls it under the job's lock. Here
it is driven the same way: explorer, bandit update, Thompson sampling, stop rule.
"""

from __future__ import annotations

import json
import math
from typing import Generator

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from zeus._core.recurring import NumpyRng, PruningGtsPolicy
from zeus.optimizer.batch_size.server.logic import (
    ArmState,
    NoConvergedBatchSizeError,
    decide_report,
    dump_rng,
    load_rng,
    new_rng_state,
)

# (dispatched, converged, cost) of one exploration trial, as the server reads it.
Exploration = tuple[bool, bool, float]


def fit_arm(bs: int, prior_mean: float, prior_prec: float, rewards: list[float]) -> ArmState:
    """The arm the server fits on `rewards` (every reward: no window)."""
    policy = PruningGtsPolicy([bs], bs, prior_mean=prior_mean, prior_precision=prior_prec)
    return policy.fit(bs, rewards)


def thompson_predict(arms: list[ArmState], k: int, rng: NumpyRng) -> int:
    """The batch size a job in the bandit stage runs next."""
    bss = [a.batch_size for a in arms]
    policy = PruningGtsPolicy(bss, bss[0], bandit_explorations=k)
    decision = policy.decide(arms, {}, {}, 0, rng)
    assert decision.kind == "bandit" and decision.new_arms is None
    return decision.batch_size


# -- explorer --------------------------------------------------------------------------------


def generator_explorer(
    bss: list[int], default: int, rounds: int
) -> Generator[int, tuple[bool, float], list[int]]:
    """An independent formulation (the legacy, stateful generator protocol) as the oracle."""
    for _ in range(rounds):
        i = bss.index(default)
        good, best = [], (math.inf, default)
        for direction in (list(reversed(bss[: i + 1])), bss[i + 1 :]):
            for bs in direction:
                converged, cost = yield bs
                if not converged:
                    break
                good.append(bs)
                if cost < best[0]:
                    best = (cost, bs)
        if not good:
            raise NoConvergedBatchSizeError
        bss, default = sorted(good), best[1]
    return bss


@st.composite
def explorer_case(draw: st.DrawFn) -> tuple[list[int], int, int, dict]:
    bss = sorted(draw(st.sets(st.integers(1, 4096), min_size=1, max_size=8)))
    default = draw(st.sampled_from(bss))
    rounds = draw(st.integers(0, 3))
    outcomes = {
        (bs, r): (draw(st.booleans()), float(draw(st.integers(1, 5))))
        for bs in bss
        for r in range(rounds)
    }
    return bss, default, rounds, outcomes


@settings(max_examples=300, deadline=None)
@given(explorer_case())
def test_explorer_matches_generator_formulation(case: tuple) -> None:
    bss, default, rounds, outcomes = case
    # Oracle run.
    oracle_seq: list[int] = []
    gen = generator_explorer(list(bss), default, rounds)
    oracle_error = False
    try:
        bs = next(gen)
        while True:
            oracle_seq.append(bs)
            r = sum(1 for b in oracle_seq if b == bs) - 1
            bs = gen.send(outcomes[(bs, r)])
    except StopIteration as stop:
        oracle_final = stop.value
    except NoConvergedBatchSizeError:
        oracle_error = True

    # Stateless replay, one exploration at a time, as the server does it.
    policy = PruningGtsPolicy(bss, default, pruning_rounds=rounds)
    rng = NumpyRng(0)
    explorations: dict[int, list[Exploration]] = {}
    rewards: dict[int, list[float]] = {}
    seq: list[int] = []
    for _ in range(len(bss) * max(rounds, 1) + 1):
        try:
            decision = policy.decide(None, explorations, rewards, 0, rng)
        except NoConvergedBatchSizeError:
            assert oracle_error
            assert seq == oracle_seq
            return
        if decision.kind == "bandit":
            break
        assert decision.kind == "exploration" and decision.new_arms is None
        bs = decision.batch_size
        r = len(explorations.get(bs, []))
        # While in flight, concurrent callers run the best batch size so far.
        explorations.setdefault(bs, []).append((True, False, 0.0))
        waiting = policy.decide(None, explorations, rewards, 0, rng)
        assert (waiting.kind, waiting.batch_size) == ("concurrent", 0)
        converged, cost = outcomes[(bs, r)]
        explorations[bs][-1] = (False, converged, cost)
        rewards.setdefault(bs, []).append(-cost)
        seq.append(bs)
    else:
        pytest.fail("explorer did not terminate")
    assert not oracle_error
    assert seq == oracle_seq
    # Pruning's end makes the survivors the bandit's arms, each fitted on its rewards.
    assert decision.new_arms is not None
    assert [a.batch_size for a in decision.new_arms] == oracle_final
    for arm in decision.new_arms:
        assert arm == fit_arm(arm.batch_size, 0.0, 0.0, rewards.get(arm.batch_size, []))
        # Survivors converged in every round they were explored in.
        assert len(explorations.get(arm.batch_size, [])) == rounds
        assert all(converged for _, converged, _ in explorations.get(arm.batch_size, []))


def test_explorer_examples() -> None:
    bss = [8, 16, 32, 64, 128, 256]
    # Everyone converges; cost is lowest at 32: round 2 restarts from 32.
    cost = {8: 5.0, 16: 3.0, 32: 1.0, 64: 2.0, 128: 4.0, 256: 6.0}
    policy = PruningGtsPolicy(bss, 64, pruning_rounds=2)
    exps: dict[int, list[Exploration]] = {}
    seq = []
    while True:
        kind, value = policy.next_exploration(exps)
        if kind == "done":
            break
        assert kind == "explore"
        seq.append(value)
        exps.setdefault(value, []).append((False, True, cost[value]))
    assert seq == [64, 32, 16, 8, 128, 256, 32, 16, 8, 64, 128, 256]
    assert value == bss
    # Zero rounds: every batch size is an arm.
    assert PruningGtsPolicy(bss, 64, pruning_rounds=0).next_exploration({}) == ("done", bss)


# -- bandit update ---------------------------------------------------------------------------

finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@given(st.lists(finite, min_size=2, max_size=30))
def test_fit_arm_flat_prior_is_sample_statistics(rewards: list[float]) -> None:
    var = float(np.var(rewards))
    assume(var > 1e-6)
    arm = fit_arm(32, 0.0, 0.0, rewards)
    assert arm.num_observations == len(rewards)
    assert arm.param_mean == pytest.approx(float(np.mean(rewards)), rel=1e-9, abs=1e-6)
    assert arm.reward_precision == pytest.approx(1.0 / var)
    assert arm.param_precision == pytest.approx(len(rewards) / var)


@given(
    st.lists(finite, min_size=2, max_size=30),
    finite,
    st.floats(0.0, 1e3, allow_nan=False),
)
def test_fit_arm_posterior_between_prior_and_data(
    rewards: list[float], prior_mean: float, prior_prec: float
) -> None:
    assume(np.var(rewards) > 1e-6)
    arm = fit_arm(32, prior_mean, prior_prec, rewards)
    assert arm.param_precision >= prior_prec
    lo, hi = sorted((prior_mean, float(np.mean(rewards))))
    tol = 1e-6 * (1 + abs(lo) + abs(hi))
    assert lo - tol <= arm.param_mean <= hi + tol
    # Order of observations does not matter.
    again = fit_arm(32, prior_mean, prior_prec, list(reversed(rewards)))
    assert again.param_mean == pytest.approx(arm.param_mean, rel=1e-9, abs=1e-6)
    assert again.param_precision == pytest.approx(arm.param_precision)


@given(finite, st.integers(1, 10), finite, st.floats(0.0, 10.0))
def test_fit_arm_equal_rewards_collapse(r: float, n: int, prior_mean: float, p0: float) -> None:
    arm = fit_arm(8, prior_mean, p0, [r] * n)
    assert math.isinf(arm.param_precision) and math.isinf(arm.reward_precision)
    assert arm.param_mean == pytest.approx(r)


def test_fit_arm_without_rewards_keeps_prior() -> None:
    assert fit_arm(8, -3.0, 0.5, []) == ArmState(8, -3.0, 0.5, 0.0, 0)


@st.composite
def arm_sets(draw: st.DrawFn) -> list[ArmState]:
    bss = sorted(draw(st.sets(st.integers(1, 1024), min_size=1, max_size=6)))
    return [
        ArmState(
            bs,
            draw(finite),
            draw(st.one_of(st.just(math.inf), st.floats(1e-6, 1e6))),
            1.0,
            draw(st.integers(0, 4)),
        )
        for bs in bss
    ]


@settings(max_examples=200, deadline=None)
@given(arm_sets(), st.integers(0, 3), st.integers(0, 2**32))
def test_thompson_predict_rules(arms: list[ArmState], k: int, seed: int) -> None:
    rng = load_rng(new_rng_state(seed))
    twin = load_rng(dump_rng(rng))  # Persisted state continues identically.
    bs = thompson_predict(arms, k, rng)
    assert bs == thompson_predict(arms, k, twin)
    assert dump_rng(rng) == dump_rng(twin)
    chosen = next(a for a in arms if a.batch_size == bs)
    under_explored = [a for a in arms if a.num_observations < k or a.num_observations == 0]
    # The state is numpy's: numpy continues it draw for draw.
    assert json.loads(dump_rng(rng))["bit_generator"] == "PCG64"
    if under_explored:
        assert chosen in under_explored
    elif all(math.isinf(a.param_precision) for a in arms):
        best = max(a.param_mean for a in arms)
        assert chosen == next(a for a in arms if a.param_mean == best)


def test_thompson_predict_prefers_clearly_better_arm() -> None:
    rng = load_rng(new_rng_state(0))
    arms = [ArmState(32, -100.0, 1.0, 1.0, 5), ArmState(64, -90.0, 1.0, 1.0, 5)]
    picks = [thompson_predict(arms, 2, rng) for _ in range(200)]
    assert picks.count(64) > 190


# -- stop rule -------------------------------------------------------------------------------


@given(
    cost=st.floats(0, 1e6),
    metric=st.floats(-10, 10),
    epoch=st.integers(0, 20),
    target=st.floats(-10, 10),
    hib=st.booleans(),
    max_epochs=st.integers(1, 20),
    beta=st.one_of(st.none(), st.floats(0.1, 5)),
    min_cost=st.one_of(st.none(), st.floats(1, 1e6)),
)
def test_decide_report_rule(
    cost: float,
    metric: float,
    epoch: int,
    target: float,
    hib: bool,
    max_epochs: int,
    beta: float | None,
    min_cost: float | None,
) -> None:
    d = decide_report(
        batch_size=64,
        cost=cost,
        metric=metric,
        current_epoch=epoch,
        target_metric=target,
        higher_is_better=hib,
        max_epochs=max_epochs,
        beta_knob=beta,
        min_cost=min_cost,
    )
    within = beta is None or min_cost is None or cost <= beta * min_cost
    reached = metric >= target if hib else metric <= target
    assert d.stop == (not within or reached or epoch >= max_epochs)
    assert d.converged == (d.stop and within and reached)
    if not d.stop:
        assert d.message == "Stop condition not met, keep training"
    elif not within:
        assert "exceeded the cost upper bound" in d.message
    elif reached:
        assert d.message == "Train succeeded"
    else:
        assert d.message == f"Train failed to converge within max_epoch({max_epochs})"


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**63), arm_sets())
def test_generator_state_is_numpys_before_and_after_a_decision(
    seed: int, arms: list[ArmState]
) -> None:
    """Stored states stay numpy's JSON, and a decision consumes the stream as numpy would."""
    assert new_rng_state(seed) == json.dumps(np.random.default_rng(seed).bit_generator.state)
    sampled = [ArmState(a.batch_size, a.param_mean, a.param_precision, 1.0, 5) for a in arms]
    rng = load_rng(new_rng_state(seed))
    thompson_predict(sampled, 2, rng)
    twin = np.random.default_rng(seed)
    twin.choice(np.array([a.batch_size for a in sampled]), len(sampled), replace=False)
    for a in sampled:
        scale = 0.0 if math.isinf(a.param_precision) else math.sqrt(1 / a.param_precision)
        twin.normal(a.param_mean, scale)
    assert json.loads(dump_rng(rng)) == twin.bit_generator.state


@settings(max_examples=100, deadline=None)
@given(st.lists(finite, min_size=1, max_size=12), st.integers(-2, 6))
def test_an_arm_is_fitted_on_its_last_window_size_rewards(rewards: list[float], w: int) -> None:
    """`window_size` > 0 keeps the most recent rewards; 0 or less keeps them all."""
    policy = PruningGtsPolicy([8], 8, window_size=w)
    kept = rewards[-w:] if w > 0 else rewards
    assert policy.fit(8, rewards) == fit_arm(8, 0.0, 0.0, kept)
    assert policy.fit(8, rewards).num_observations == len(kept)


def test_a_stored_state_is_read_as_json_loads_reads_it_and_bad_fields_are_named() -> None:
    good = new_rng_state(7)
    # Whitespace, key order, escapes and extra keys are free, as for numpy's own setter.
    fields = json.loads(good)
    flag = "true" if fields["has_uint32"] else "false"
    lcg = fields["state"]
    odd = (
        f'\n{{ "uinteger" :{fields["uinteger"]},"extra":[1.5e3,null],"has_uint32":{flag},'
        f'"state":{{"inc":{lcg["inc"]},"state":{lcg["state"]}}},'
        '"bit_generator":"PCG\\u0036\\u0034"}\t'
    )
    assert dump_rng(load_rng(odd)) == good
    # 128-bit integers survive whole.
    top = json.dumps({**fields, "state": {"state": 2**128 - 1, "inc": 3}})
    assert json.loads(dump_rng(load_rng(top)))["state"]["state"] == 2**128 - 1

    def error_of(text: str) -> str:
        with pytest.raises(ValueError) as e:
            load_rng(text)
        return str(e.value)

    def edited(path: tuple[str, ...], value: object) -> str:
        state = json.loads(good)
        node = state
        for key in path[:-1]:
            node = node[key]
        if value is KeyError:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        return json.dumps(state)

    assert "not valid JSON" in error_of(good + " x")
    assert "`bit_generator`" in error_of(edited(("bit_generator",), "MT19937"))
    assert "lacks the field `state.inc`" in error_of(edited(("state", "inc"), KeyError))
    assert "`state.state`" in error_of(edited(("state", "state"), -3))
    assert "`state.state`" in error_of(edited(("state", "state"), 2**128))
    assert "`state.state`" in error_of(edited(("state", "state"), 1.5))
    assert "`has_uint32`" in error_of(edited(("has_uint32",), 2))
    assert "`uinteger`" in error_of(edited(("uinteger",), 2**32))
    assert "`uinteger`" in error_of(edited(("uinteger",), None))
