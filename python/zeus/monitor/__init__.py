"""Measure the time and GPU energy of code windows, and GPU power over time.

- `ZeusMonitor`: named measurement windows (`begin_window` / `end_window`) returning a
  `Measurement` of elapsed time and energy per GPU, each with a bound (about 95% of windows
  lie within it) and a `Provenance` (how it was made).
- `PowerMonitor`: a background sampler of GPU power with `get_energy` / `get_power`.
- `TemperatureMonitor`: GPU temperature over time, read by the shared sampler thread.
- `python -m zeus.monitor energy|power`: the same from the command line.
- `zeus.monitor.carbon.CarbonEmissionMonitor` and `zeus.monitor.price.EnergyCostMonitor`:
  windows' carbon emission and electricity cost, each hour's energy at that hour's grid
  intensity (ElectricityMaps) or tariff rate (OpenEI).
- `zeus.monitor.power_streaming.PowerStreamingClient`: live power of whole nodes from their
  zeusd daemons (imported from its module; `python -m zeus.monitor stream`).
"""

from zeus.monitor.energy import Measurement, Provenance, ZeusMonitor
from zeus.monitor.power import PowerMonitor
from zeus.monitor.temperature import TemperatureMonitor

__all__ = ["Measurement", "PowerMonitor", "Provenance", "TemperatureMonitor", "ZeusMonitor"]
