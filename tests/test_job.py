"""`zeus.job.Job`: identity, log-dir name, trace filtering, command generation, LR scaling."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from zeus.job import Job


def job(**kw: object) -> Job:
    base: dict = dict(
        dataset="cifar100",
        network="shufflenetv2",
        optimizer="Adadelta",
        target_metric=0.6,
        max_epochs=100,
        default_bs=1024,
        default_lr=0.1,
    )
    base.update(kw)
    return Job(**base)


def test_str_and_logdir() -> None:
    j = job()
    assert str(j) == "Job(cifar100,shufflenetv2,Adadelta,0.6,bs1024~100)"
    assert str(job(default_bs=None)) == "Job(cifar100,shufflenetv2,Adadelta,0.6~100)"
    assert j.to_logdir() == "cifar100+shufflenetv2+bs1024+Adadelta+lr0.1+tm0.6+me100"


def test_command_is_not_part_of_identity_and_job_is_frozen() -> None:
    a = job(command=["python", "a.py"])
    b = job(command=["python", "b.py"])
    assert a == b and hash(a) == hash(b)
    assert job(target_metric=0.7) != a
    with pytest.raises(AttributeError):
        a.max_epochs = 3  # type: ignore[misc]


def test_gen_command_substitutes_whole_tokens() -> None:
    j = job(
        command=[
            "python",
            "train.py",
            "--bs",
            "{bs}",
            "--batch_size",
            "{batch_size}",
            "--lr",
            "{lr}",
            "{learning_rate}",
            "--seed",
            "{seed}",
            "--epochs",
            "{epochs}",
            "{epoch}",
            "--slice",
            "{slice_number}",
            "--target",
            "{target_metric}",
            "--x={bs}",
        ]
    )
    cmd = j.gen_command(256, 0.05, 7, 3)
    assert cmd == [
        "python",
        "train.py",
        "--bs",
        "256",
        "--batch_size",
        "256",
        "--lr",
        "0.05",
        "0.05",
        "--seed",
        "7",
        "--epochs",
        "100",
        "100",
        "--slice",
        "3",
        "--target",
        "0.6",
        "--x={bs}",
    ]
    with pytest.raises(ValueError, match="no command"):
        job().gen_command(1, 1.0, 1, 1)


@pytest.mark.parametrize("opt", ["Adam", "adadelta", "ADAMW"])
def test_scale_lr_sqrt_rule(opt: str) -> None:
    j = job(optimizer=opt, default_bs=64, default_lr=0.01)
    assert j.scale_lr(256) == pytest.approx(0.02)
    assert j.scale_lr(64) == pytest.approx(0.01)


def test_scale_lr_linear_rule_and_unknown() -> None:
    j = job(optimizer="SGD", default_bs=64, default_lr=0.1)
    assert j.scale_lr(128) == pytest.approx(0.2)
    with pytest.raises(NotImplementedError, match="RMSprop"):
        job(optimizer="RMSprop").scale_lr(32)
    with pytest.raises(ValueError, match="default_bs and default_lr"):
        job(default_lr=None).scale_lr(32)
    with pytest.raises(ValueError, match="-4"):
        j.scale_lr(-4)


@given(st.integers(1, 1 << 16), st.integers(1, 1 << 16), st.floats(1e-6, 10.0))
def test_scale_lr_rules_hold_for_all_sizes(b0: int, b: int, lr: float) -> None:
    assert job(optimizer="adam", default_bs=b0, default_lr=lr).scale_lr(b) == pytest.approx(
        lr * math.sqrt(b / b0)
    )
    assert job(optimizer="sgd", default_bs=b0, default_lr=lr).scale_lr(b) == pytest.approx(
        lr * b / b0
    )


def test_filter_df_with_pandas() -> None:
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame(
        {
            "dataset": ["cifar100", "cifar100", "cifar100", "imagenet"],
            "network": ["shufflenetv2"] * 4,
            "optimizer": ["Adadelta", "Adadelta", "Adam", "Adadelta"],
            "target_metric": [0.6, 0.7, 0.6, 0.6],
            "batch_size": [1, 2, 3, 4],
        }
    )
    assert list(job().filter_df(df).batch_size) == [1]
    with pytest.raises(ValueError, match="target_metric"):
        job().filter_df(df.drop(columns=["target_metric"]))
