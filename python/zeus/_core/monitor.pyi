# Hand-kept stubs of `zeus._core.monitor`: measurement (src/python/monitor/).
# Keep in sync with the #[pymethods] / #[pyfunction] signatures.

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal, Self, TypeAlias, final

from typing_extensions import disjoint_base
from zeus._core.device import CPUs, GPUs

__all__ = [
    "PowerLog",
    "infer_counter_update_period",
    "stop_sampler",
    "Measurement",
    "Provenance",
    "PowerMonitor",
    "ZeusMonitor",
    "TemperatureMonitor",
    "EnergyLedger",
]

_StrPath: TypeAlias = str | os.PathLike[str]

@final
class Provenance:
    method: Final[Literal["cached_counter", "direct_counter", "power_integration", "degraded"]]
    update_period: Final[float | None]
    counter_lag: Final[float | None]
    note: Final[str | None]
    def __new__(
        cls,
        method: str,
        update_period: float | None = None,
        counter_lag: float | None = None,
        note: str | None = None,
    ) -> Provenance: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __reduce__(
        self,
    ) -> tuple[type[Provenance], tuple[str, float | None, float | None, str | None]]: ...

@final
class Measurement:
    time: float
    cpu_energy: dict[int, float] | None
    dram_energy: dict[int, float] | None
    cpu_energy_uncertainty: dict[int, float] | None
    dram_energy_uncertainty: dict[int, float] | None
    def __new__(
        cls,
        time: float,
        energy: Mapping[int, float] | None = None,
        cpu_energy: Mapping[int, float] | None = None,
        dram_energy: Mapping[int, float] | None = None,
        gpu_energy_uncertainty: Mapping[int, float] | None = None,
        cpu_energy_uncertainty: Mapping[int, float] | None = None,
        dram_energy_uncertainty: Mapping[int, float] | None = None,
        gpu_energy_provenance: Mapping[int, Provenance] | None = None,
        *,
        gpu_energy: Mapping[int, float] | None = None,
    ) -> Measurement: ...
    @property
    def energy(self) -> dict[int, float]: ...
    @energy.setter
    def energy(self, energy: dict[int, float]) -> None: ...
    @property
    def gpu_energy(self) -> dict[int, float]: ...
    @property
    def gpu_energy_uncertainty(self) -> dict[int, float]: ...
    @property
    def gpu_energy_provenance(self) -> dict[int, Provenance]: ...
    @property
    def total_energy(self) -> float: ...
    @property
    def total_energy_uncertainty(self) -> float: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __reduce__(
        self,
    ) -> tuple[
        type[Measurement],
        tuple[
            float,
            dict[int, float],
            dict[int, float] | None,
            dict[int, float] | None,
            dict[int, float],
            dict[int, float] | None,
            dict[int, float] | None,
            dict[int, Provenance],
        ],
    ]: ...

@final
class PowerLog:
    def __new__(cls, format: str, gpu_indices: list[int], energy: bool = False) -> Self: ...
    @property
    def header(self) -> str | None: ...
    def row(self, unix_time: float, power_mw: list[int], energy_mj: list[int] = ...) -> str: ...

@disjoint_base
class PowerMonitor:
    def __new__(
        cls,
        gpu_indices: list[int] | None = None,
        update_period: float | None = None,
        max_samples: int | None = None,
        background: bool | None = None,
        power_domains: list[str] | None = None,
        *,
        gpu_update_period: float | None = None,
        max_samples_per_gpu: int | None = None,
        gpu_power_domains: list[str] | None = None,
    ) -> Self: ...
    @property
    def gpu_indices(self) -> list[int]: ...
    @property
    def update_period(self) -> float: ...
    @property
    def running(self) -> bool: ...
    @property
    def num_samples(self) -> int: ...
    @property
    def max_samples(self) -> int: ...
    @property
    def bytes_per_sample(self) -> float: ...
    @property
    def allocated_bytes(self) -> int: ...
    def sample_now(self) -> bool: ...
    def stop(self) -> None: ...
    def __enter__(self) -> Self: ...
    # Always False: exceptions are never swallowed.
    def __exit__(self, *_args: object) -> Literal[False]: ...
    @property
    def power_domains(self) -> list[str]: ...
    def get_energy(
        self, start_time: float, end_time: float, power_domain: str | None = None
    ) -> dict[int, float] | None: ...
    def get_energy_uncertainty(
        self, start_time: float, end_time: float, power_domain: str | None = None
    ) -> dict[int, float] | None: ...
    @property
    def error(self) -> str | None: ...
    def get_power(
        self, time: float | None = None, power_domain: str | None = None
    ) -> dict[int, float] | None: ...
    def get_power_timeline(
        self,
        gpu_power_domain: str | None = None,
        gpu_index: int | None = None,
        start_time: float | None = None,
        end_time: float | None = None,
        *,
        power_domain: str | None = None,
    ) -> dict[int, list[tuple[float, float]]]: ...
    def get_all_power_timelines(
        self,
        gpu_index: int | None = None,
        start_time: float | None = None,
        end_time: float | None = None,
    ) -> dict[str, dict[int, list[tuple[float, float]]]]: ...
    def timeline(
        self, power_domain: str | None = None
    ) -> tuple[list[float], dict[int, list[float]]]: ...

@final
class TemperatureMonitor:
    def __new__(
        cls,
        gpu_indices: list[int] | None = None,
        update_period: float = 1.0,
        max_samples_per_gpu: int | None = None,
    ) -> Self: ...
    @property
    def gpu_indices(self) -> list[int]: ...
    @property
    def update_period(self) -> float: ...
    def get_temperature_timeline(
        self,
        gpu_index: int | None = None,
        start_time: float | None = None,
        end_time: float | None = None,
    ) -> dict[int, list[tuple[float, float]]]: ...
    def get_temperature(self, time: float | None = None) -> dict[int, float] | None: ...
    def stop(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> Literal[False]: ...

@disjoint_base
class ZeusMonitor:
    # Accepts and ignores any arguments; the set-up is `_init`.
    def __new__(cls, *_args: Any, **_kwargs: Any) -> Self: ...
    def _init(
        self,
        gpus: GPUs | None,
        gpu_indices: list[int] | None,
        approx_instant_energy: bool,
        log_file: _StrPath | None,
        resolve_sync: Callable[[], Callable[[int], object] | None] | None,
        check_power: PowerMonitor | None,
        reads: str = "auto",
        cpus: CPUs | None = None,
        cpu_indices: list[int] | None = None,
    ) -> PowerMonitor | None: ...
    def begin_window(
        self,
        key: str,
        sync_cuda: bool | None = None,
        *,
        sync_execution: bool | None = None,
        restart: bool = False,
    ) -> None: ...
    def _set_short_window_warnings(self, on: bool) -> None: ...
    def end_window(
        self,
        key: str,
        sync_cuda: bool | None = None,
        cancel: bool = False,
        exact: bool = False,
        *,
        sync_execution: bool | None = None,
    ) -> Measurement: ...
    def cut_window(self, key: str, sync_cuda: bool = False) -> Measurement: ...
    @property
    def reads(self) -> str: ...
    @property
    def _reads_cached(self) -> list[bool]: ...
    def _window_starts(
        self,
    ) -> dict[
        str,
        tuple[float, dict[int, float], dict[int, float] | None, dict[int, float] | None],
    ]: ...
    @property
    def cpu_indices(self) -> list[int] | None: ...
    @property
    def _has_counter(self) -> list[bool]: ...
    @property
    def approx_instant_energy(self) -> bool: ...

def infer_counter_update_period(gpu_indices: list[int]) -> float: ...
def stop_sampler() -> None: ...

@final
class EnergyLedger:
    def __new__(
        cls,
        monitor: ZeusMonitor,
        method: str = "work",
        span_s: float = 1.0,
        min_spans: int = 8,
        max_wait_s: float = 30.0,
        defer: bool = True,
    ) -> EnergyLedger: ...
    @property
    def method(self) -> str: ...
    @property
    def gpu_indices(self) -> list[int]: ...
    @property
    def deferred_cuts(self) -> bool: ...
    @property
    def marks_waiting(self) -> int: ...
    def group(self, name: str) -> int: ...
    def arrive(self, request_id: str, group: int = 0, at: float | None = None) -> None: ...
    def begin_step(self) -> None: ...
    def end_step(
        self,
        request_ids: Sequence[str],
        prefill_tokens: Sequence[float],
        decode_tokens: Sequence[float],
        kv_tokens: Sequence[float],
    ) -> int: ...
    def finish(
        self, request_id: str, output_tokens: float | None = None, at: float | None = None
    ) -> int: ...
    def take_records(self) -> list[dict[str, Any]]: ...
    def flush(self, include_open: bool = False) -> None: ...
    def totals(self) -> dict[str, Any]: ...
    def weights(self) -> dict[str, Any] | None: ...
    def groups(self) -> list[tuple[str, dict[str, Any]]]: ...
    def open_requests(self) -> int: ...
    def close(self) -> None: ...
