"""The client callback against a real server process, on the simulated GPU."""

from __future__ import annotations

import sys
import types
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
import zeus.optimizer.batch_size.client as client_mod
from bso_helpers import Database, ServerProcess
from zeus.exception import ZeusBaseError
from zeus.optimizer.batch_size import BatchSizeOptimizer, JobSpec
from zeus.optimizer.batch_size.exceptions import (
    ZeusBSOBadOperationError,
    ZeusBSOConfigError,
    ZeusBSOOperationOrderError,
    ZeusBSORuntimError,
    ZeusBSOTrainFailError,
)


@dataclass
class FakeMeasurement:
    time: float
    total_energy: float


class FakeMonitor:
    """Just the ZeusMonitor contract the client uses; each window lasts `epoch` (time, J)."""

    def __init__(self, gpu_indices: list[int], epoch: tuple[float, float] = (10.0, 1000.0)):
        self.gpu_indices = gpu_indices
        self.epoch = epoch
        self.open: set[str] = set()
        self.closed = 0

    def begin_window(self, key: str, sync_cuda: bool = True) -> None:
        assert key not in self.open
        self.open.add(key)

    def end_window(self, key: str, sync_cuda: bool = True) -> FakeMeasurement:
        self.open.remove(key)
        self.closed += 1
        return FakeMeasurement(*self.epoch)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Database]]:
    db = Database("sqlite", tmp_path_factory.mktemp("client"))
    srv = ServerProcess(db.url).start()
    yield srv, db
    srv.stop()


@pytest.fixture
def url(server: tuple[ServerProcess, Database]) -> str:
    return server[0].base_url


@pytest.fixture
def db(server: tuple[ServerProcess, Database]) -> Database:
    return server[1]


@pytest.fixture
def gpus(sim_gpus: Callable[..., Any]) -> Any:
    return sim_gpus("V100,V100,V100,V100")


@pytest.fixture
def no_atexit(monkeypatch: pytest.MonkeyPatch) -> list[Callable[[], None]]:
    hooks: list[Callable[[], None]] = []
    monkeypatch.setattr(client_mod.atexit, "register", hooks.append)
    monkeypatch.setattr(client_mod.atexit, "unregister", hooks.remove)
    return hooks


def spec(**overrides: Any) -> JobSpec:
    base: dict[str, Any] = dict(
        job_id_prefix="client",
        default_batch_size=1024,
        batch_sizes=[32, 64, 256, 512, 1024, 4096, 2048],
        eta_knob=0.5,
        beta_knob=2.0,
        target_metric=0.5,
        max_epochs=100,
        mab_seed=123456,
        window_size=5,
    )
    base.update(overrides)
    return JobSpec(**base)


def train(bso: BatchSizeOptimizer, metrics: list[float]) -> int:
    """Run epochs until the server stops training; returns epochs run."""
    bso.get_batch_size()
    bso.on_train_begin()
    for i, m in enumerate(metrics, 1):
        bso.on_evaluate(m)
        if bso.training_finished:
            return i
    return len(metrics)


def test_errors_are_zeus_errors() -> None:
    for cls in (
        ZeusBSOBadOperationError,
        ZeusBSOConfigError,
        ZeusBSOOperationOrderError,
        ZeusBSORuntimError,
        ZeusBSOTrainFailError,
    ):
        assert issubclass(cls, ZeusBaseError)


def test_registration_reports_gpu_config(
    url: str, gpus: Any, db: Database, no_atexit: list
) -> None:
    monitor = FakeMonitor([0, 1, 2, 3])
    bso = BatchSizeOptimizer(monitor, url, spec())
    assert bso.job.job_id is not None and bso.job.job_id.startswith("client-")
    # Simulated V100: 250 W maximum power limit, four of them.
    assert bso.job.max_power == 250 * 4
    assert bso.job.number_of_gpus == 4
    assert bso.job.gpu_model == gpus.get_name(0)
    rows = db.query(
        "SELECT max_power, number_of_gpus, gpu_model FROM bso_job WHERE job_id = :j",
        j=bso.job.job_id,
    )
    assert rows == [(1000.0, 4, gpus.get_name(0))]


def test_recurrences_follow_pruning_and_early_stop(
    url: str, gpus: Any, db: Database, no_atexit: list
) -> None:
    job = spec(job_id=f"client-{uuid.uuid4().hex[:8]}")
    # 1024 converges in 3 epochs of 10 s / 1000 J: cost 3 * (500 + 0.5 * 1000 * 10) = 16500.
    monitor = FakeMonitor([0, 1, 2, 3])
    bso = BatchSizeOptimizer(monitor, url, job)
    assert bso.get_batch_size() == 1024
    assert train(bso, [0.1, 0.2, 0.6]) == 3
    assert monitor.closed == 3 and not monitor.open
    assert not no_atexit  # Finished: the exit hook is gone.

    # 512 is slow: after 7 epochs its cost exceeds 2 * 16500, so it is stopped as failed.
    bso = BatchSizeOptimizer(FakeMonitor([0, 1, 2, 3]), url, job)
    assert bso.get_batch_size() == 512
    with pytest.raises(ZeusBSOTrainFailError, match="cost upper bound"):
        train(bso, [0.1] * 20)
    assert bso.cur_epoch == 7

    # Failing downwards turns the exploration upwards.
    bso = BatchSizeOptimizer(FakeMonitor([0, 1, 2, 3]), url, job)
    assert bso.get_batch_size() == 2048
    rows = db.query(
        "SELECT batch_size, status, converged, report_count FROM bso_trial "
        "WHERE job_id = :j ORDER BY trial_number",
        j=job.job_id,
    )
    assert [r[:2] for r in rows] == [(1024, "Succeeded"), (512, "Succeeded"), (2048, "Dispatched")]
    assert [bool(r[2]) for r in rows[:2]] == [True, False]
    assert [r[3] for r in rows[:2]] == [3, 7]


def test_max_epochs_failure_without_beta(url: str, gpus: Any, no_atexit: list) -> None:
    bso = BatchSizeOptimizer(FakeMonitor([0]), url, spec(beta_knob=None, max_epochs=4))
    with pytest.raises(ZeusBSOTrainFailError, match=r"failed to converge within max_epoch\(4\)"):
        train(bso, [0.1] * 10)
    # Further evaluations after the end do nothing.
    bso.on_evaluate(0.9)
    assert bso.cur_epoch == 4


def test_exit_before_the_end_fails_the_trial(
    url: str, gpus: Any, db: Database, no_atexit: list
) -> None:
    bso = BatchSizeOptimizer(FakeMonitor([0]), url, spec())
    bso.get_batch_size()
    bso.on_train_begin()
    bso.on_evaluate(0.1)
    assert len(no_atexit) == 1
    no_atexit[0]()  # What atexit would run.
    rows = db.query("SELECT status FROM bso_trial WHERE job_id = :j", j=bso.job.job_id)
    assert rows == [("Failed",)]
    # The next recurrence explores the default again.
    again = BatchSizeOptimizer(FakeMonitor([0]), url, bso.job)
    assert again.get_batch_size() == 1024


def test_operation_order(url: str, gpus: Any, no_atexit: list) -> None:
    bso = BatchSizeOptimizer(FakeMonitor([0]), url, spec())
    with pytest.raises(ZeusBSOOperationOrderError):
        bso.on_evaluate(0.5)
    bso.get_batch_size()
    with pytest.raises(ZeusBSOOperationOrderError):
        bso.on_evaluate(0.5)


def _refuse(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"rank != 0 must not talk to the server: {request.url}")


def test_other_ranks_never_ask_the_server(
    gpus: Any, monkeypatch: pytest.MonkeyPatch, no_atexit: list
) -> None:
    transport = httpx.MockTransport(_refuse)
    bso = BatchSizeOptimizer(FakeMonitor([1]), "http://x", spec(), rank=1, transport=transport)
    with pytest.raises(ZeusBSOBadOperationError, match="ZEUS_BSO_BATCH_SIZE"):
        bso.get_batch_size()
    monkeypatch.setenv("ZEUS_BSO_BATCH_SIZE", "100")
    with pytest.raises(ZeusBSOConfigError, match="100"):
        bso.get_batch_size()
    monkeypatch.setenv("ZEUS_BSO_BATCH_SIZE", "512")
    assert bso.get_batch_size() == 512
    bso.on_train_begin()
    bso.on_evaluate(0.1)  # No process group: nothing to do on other ranks.


class FakeDist(types.ModuleType):
    """`torch.distributed` for two ranks run one after the other in this process."""

    def __init__(self) -> None:
        super().__init__("torch.distributed")
        self.mailbox: list[Any] = []

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def get_world_size(self) -> int:
        return 2

    def broadcast_object_list(self, objs: list[Any], src: int = 0) -> None:
        if objs[0] is not None:
            self.mailbox.append(objs[0])
        else:
            objs[0] = self.mailbox.pop(0)


def test_ranks_share_decisions_through_torch_distributed(
    url: str, gpus: Any, monkeypatch: pytest.MonkeyPatch, no_atexit: list
) -> None:
    dist = FakeDist()
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    job = spec(job_id=f"client-dist-{uuid.uuid4().hex[:8]}", beta_knob=None, max_epochs=2)
    rank0 = BatchSizeOptimizer(FakeMonitor([0]), url, job, rank=0)
    rank1 = BatchSizeOptimizer(
        FakeMonitor([1]), url, job, rank=1, transport=httpx.MockTransport(_refuse)
    )
    assert rank0.get_batch_size() == 1024
    assert rank1.get_batch_size() == 1024
    assert rank1.trial_number == rank0.trial_number
    for bso in (rank0, rank1):
        bso.on_train_begin()
    rank0.on_evaluate(0.1)
    rank1.on_evaluate(0.1)
    assert not rank1.training_finished
    with pytest.raises(ZeusBSOTrainFailError):
        rank0.on_evaluate(0.1)
    with pytest.raises(ZeusBSOTrainFailError, match="max_epoch"):
        rank1.on_evaluate(0.1)
    assert rank1.training_finished and not dist.mailbox


def test_connection_errors_are_retried(gpus: Any, no_atexit: list) -> None:
    calls = []

    def flaky(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) <= 2:
            raise httpx.ConnectError("refused", request=request)
        body = spec(job_id="client-flaky").model_dump() | {
            "max_power": 250,
            "number_of_gpus": 1,
            "gpu_model": "V100",
        }
        return httpx.Response(201, json=body)

    bso = BatchSizeOptimizer(
        FakeMonitor([0]), "http://x", spec(), backoff=0.001, transport=httpx.MockTransport(flaky)
    )
    assert len(calls) == 3
    assert bso.job.job_id == "client-flaky"

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(ZeusBSORuntimError, match="after 3 attempts"):
        BatchSizeOptimizer(
            FakeMonitor([0]),
            "http://x",
            spec(),
            backoff=0.001,
            max_retries=2,
            transport=httpx.MockTransport(down),
        )


class LoseAnswers(httpx.BaseTransport):
    """The real transport, but the first answer to each request of `paths` never arrives.

    The server has received and processed the request; the client sees a read timeout.
    """

    def __init__(self, *paths: tuple[str, str]) -> None:
        self.inner = httpx.HTTPTransport()
        self.paths = set(paths)
        self.sent: list[tuple[str, str]] = []
        self.lost = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        key = (request.method, request.url.path)
        response = self.inner.handle_request(request)
        self.sent.append(key)
        # Every other request of these paths is the retry of the one before it.
        if key in self.paths and self.sent.count(key) % 2 == 1:
            response.read()
            response.close()
            self.lost += 1
            raise httpx.ReadTimeout("the answer was lost", request=request)
        return response


def test_lost_answers_are_retried_and_counted_once(
    url: str, gpus: Any, db: Database, no_atexit: list
) -> None:
    transport = LoseAnswers(("POST", "/jobs"), ("POST", "/report"), ("PATCH", "/trials"))
    job = spec(job_id=f"client-lost-{uuid.uuid4().hex[:8]}", beta_knob=None, max_epochs=3)
    bso = BatchSizeOptimizer(FakeMonitor([0]), url, job, backoff=0.001, transport=transport)
    assert bso.get_batch_size() == 1024
    with pytest.raises(ZeusBSOTrainFailError, match="max_epoch"):
        train(bso, [0.1] * 5)
    assert transport.lost == 4  # The registration and each of the three reports.
    rows = db.query(
        "SELECT status, converged, report_count, current_epoch FROM bso_trial WHERE job_id = :j",
        j=job.job_id,
    )
    assert [(s, bool(c), n, e) for s, c, n, e in rows] == [("Succeeded", False, 3, 3)]
    # A trial ended by the exit hook, whose answer was lost too, ends once.
    bso = BatchSizeOptimizer(FakeMonitor([0]), url, job, backoff=0.001, transport=transport)
    bso.get_batch_size()
    no_atexit[-1]()
    assert transport.lost == 6
    rows = db.query(
        "SELECT status FROM bso_trial WHERE job_id = :j ORDER BY trial_number", j=job.job_id
    )
    assert rows == [("Succeeded",), ("Failed",)]


def test_a_lost_prediction_is_retried_and_starts_one_trial(
    url: str, gpus: Any, db: Database, no_atexit: list
) -> None:
    """The retry names the same request, so the server answers with the trial it started."""
    transport = LoseAnswers(("GET", "/jobs/batch_size"))
    job = spec(job_id=f"client-pred-{uuid.uuid4().hex[:8]}")
    bso = BatchSizeOptimizer(FakeMonitor([0]), url, job, backoff=0.001, transport=transport)
    assert bso.get_batch_size() == 1024
    assert transport.lost == 1
    assert transport.sent.count(("GET", "/jobs/batch_size")) == 2
    rows = db.query(
        "SELECT trial_number, status, request_id FROM bso_trial WHERE job_id = :j",
        j=bso.job.job_id,
    )
    assert len(rows) == 1 and rows[0][:2] == (bso.trial_number, "Dispatched"), rows
    assert len(rows[0][2]) == 32, "a uuid4 hex names the request"
    # The next run of the job asks anew: a new request, a new trial (its answer lost too).
    again = BatchSizeOptimizer(FakeMonitor([0]), url, job, backoff=0.001, transport=transport)
    again.get_batch_size()
    assert transport.lost == 2
    assert again.trial_number != bso.trial_number
    rows = db.query("SELECT count(*) FROM bso_trial WHERE job_id = :j", j=job.job_id)
    assert rows == [(2,)]


def test_unreachable_server(gpus: Any, no_atexit: list) -> None:
    from bso_helpers import free_port

    with pytest.raises(ZeusBSORuntimError, match="Cannot reach"):
        BatchSizeOptimizer(
            FakeMonitor([0]), f"http://127.0.0.1:{free_port()}", spec(), backoff=0.001
        )


def test_server_errors_raise(url: str, gpus: Any, no_atexit: list) -> None:
    job = spec(job_id="client-conflict")
    BatchSizeOptimizer(FakeMonitor([0]), url, job)
    with pytest.raises(ZeusBSORuntimError, match="status code 409"):
        BatchSizeOptimizer(FakeMonitor([0]), url, spec(job_id="client-conflict", eta_knob=0.9))


def test_bad_arguments(url: str, gpus: Any) -> None:
    with pytest.raises(ValueError, match="rank"):
        BatchSizeOptimizer(FakeMonitor([0]), url, spec(), rank=-1)
    with pytest.raises(ZeusBSOConfigError, match="gpu_indices"):
        BatchSizeOptimizer(FakeMonitor([]), url, spec())


def test_bearer_token(
    tmp_path: Path, gpus: Any, monkeypatch: pytest.MonkeyPatch, no_atexit: list
) -> None:
    db = Database("sqlite", tmp_path)
    srv = ServerProcess(db.url, env={"ZEUS_BSO_TOKEN": "s3cret"}).start()
    try:
        with pytest.raises(ZeusBSORuntimError, match="401"):
            BatchSizeOptimizer(FakeMonitor([0]), srv.base_url, spec())
        monkeypatch.setenv("ZEUS_BSO_TOKEN", "s3cret")
        bso = BatchSizeOptimizer(FakeMonitor([0]), srv.base_url, spec())
        assert bso.get_batch_size() == 1024
    finally:
        srv.stop()


def test_with_real_zeus_monitor_on_simulated_v100(
    url: str, sim_gpus: Callable[..., Any], db: Database, no_atexit: list
) -> None:
    import zeus.device.sim
    from zeus.monitor import ZeusMonitor

    sim_gpus("V100", clock="virtual")
    monitor = ZeusMonitor(gpu_indices=[0])
    bso = BatchSizeOptimizer(monitor, url, spec(beta_knob=None, max_epochs=5))
    bso.get_batch_size()
    start_energy = zeus.device.sim.true_energy(0)
    seconds = 0.0
    bso.on_train_begin()
    for metric in (0.1, 0.2, 0.7):
        seconds += zeus.device.sim.run(1.0, [0])  # One epoch of simulated work (virtual clock).
        bso.on_evaluate(metric)
    joules = zeus.device.sim.true_energy(0) - start_energy
    assert bso.training_finished
    ((t, e, converged, reports),) = db.query(
        "SELECT time, energy, converged, report_count FROM bso_trial WHERE job_id = :j",
        j=bso.job.job_id,
    )
    assert seconds > 0 and joules > 0
    assert t == pytest.approx(seconds, rel=1e-3)
    assert e == pytest.approx(joules, rel=1e-2)
    assert bool(converged) and reports == 3
