"""HFGlobalPowerLimitOptimizer inside a real transformers.Trainer (CPU, tiny local model) with the
simulated GPU on the virtual clock."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable

import pytest
import zeus.device.sim
from plo_helpers import WindowMonitor
from zeus.optimizer import GlobalPowerLimitOptimizer, HFGlobalPowerLimitOptimizer
from zeus.optimizer.power_limit import Done, ZeusCost

torch = pytest.importorskip("torch", reason="torch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")


def test_signature_is_the_optimizers() -> None:
    assert inspect.signature(HFGlobalPowerLimitOptimizer) == inspect.signature(
        GlobalPowerLimitOptimizer
    )
    assert issubclass(HFGlobalPowerLimitOptimizer, transformers.TrainerCallback)


class TinyDataset(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, 50, (n, 8), generator=g)
        self.labels = (self.ids.sum(dim=1) % 2).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {
            "input_ids": self.ids[i],
            "attention_mask": torch.ones(8, dtype=torch.long),
            "labels": self.labels[i],
        }


def train_tiny(tmp_path: Path, gpus: Any, pl_step: int) -> GlobalPowerLimitOptimizer:
    """Two epochs of 12 steps of a tiny BERT on CPU, each step a little work on simulated GPU 0
    of `gpus`, with an `HFGlobalPowerLimitOptimizer` that profiles each limit for two steps
    after one of warm-up, `pl_step` W apart, by energy alone; its optimizer."""
    plo_cb = HFGlobalPowerLimitOptimizer(
        WindowMonitor(gpus, [0]),
        optimum_selector=ZeusCost(eta_knob=1.0),
        wait_steps=0,
        warmup_steps=1,
        profile_steps=2,
        pl_step=pl_step,
        profile_path=tmp_path / "profile.json",
    )
    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=2,
    )
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        num_train_epochs=2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=transformers.BertForSequenceClassification(config),
        args=args,
        train_dataset=TinyDataset(24),  # 12 steps per epoch
        callbacks=[AdvanceSimulator(), plo_cb],
    )
    trainer.train()
    return plo_cb.optimizer


class AdvanceSimulator(transformers.TrainerCallback):
    """Each training step does a little work on the simulated GPU (so time and energy pass)."""

    def on_step_end(self, args, state, control, **kwargs):
        zeus.device.sim.run(0.01)


def test_trainer_profiles_and_settles(
    tmp_path: Path, sim_gpus: Callable[..., object], set_calls: list[tuple[int, int]]
) -> None:
    gpus = sim_gpus("A40")
    plo = train_tiny(tmp_path, gpus, pl_step=100)
    assert isinstance(plo.state, Done)
    assert [m.power_limit for m in plo.measurements] == [300, 200, 100]
    # Energy-optimal on the simulated A40's default curve, which the selector chose.
    best = min(plo.measurements, key=lambda m: m.energy).power_limit
    assert plo.state.optimal_power_limit == best * 1000
    assert gpus.get_power_management_limit(0) == best * 1000
    assert [mw for _, mw in set_calls][:3] == [300_000, 200_000, 100_000]
    assert (tmp_path / "profile.json").is_file()
