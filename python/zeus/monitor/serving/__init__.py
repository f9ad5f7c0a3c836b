"""Energy per request and per token in LLM serving under continuous batching.

A serving engine (or one of the adapters here) tells an `EnergyLedger` when each engine step
ends and what each request in it did; the ledger cuts a `ZeusMonitor` window at every step (a
cut costs microseconds through the sampler) and splits the step's energy among its requests by
a declared method (`"time"`, `"tokens"` or `"work"`, a cost model fitted online). Each
finished request gets a `RequestEnergy` record: energy with an error bound, its prefill and
decode split, joules per output token, the GPUs it ran on. Energy spent with no request in a
step is an explicit residual; the records plus the residual equal the measured energy.

- `zeus.monitor.serving.transformers`: Hugging Face transformers' continuous batching.
- `zeus.monitor.serving.vllm`: a vLLM stat logger (`zeus_stat_logger`).
- `zeus.monitor.serving.metrics`: `ServingMetrics`, Prometheus metrics of the records (a
  ledger callback); `python -m zeus.analyze serving LOG` plots J/token against batch size.

See `docs/serving-energy.md` for what each method assumes and what the bound means.
"""

from zeus.monitor.serving.ledger import (
    Aggregate,
    EnergyLedger,
    LedgerTotals,
    RequestEnergy,
    WorkWeights,
)

__all__ = ["Aggregate", "EnergyLedger", "LedgerTotals", "RequestEnergy", "WorkWeights"]
