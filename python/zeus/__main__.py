"""`python -m zeus`: what zeus offers on the command line."""

from __future__ import annotations

import argparse

from zeus.util import cli

PROG = "python -m zeus"

COMMANDS = """zeus: measure and cut the energy deep-learning jobs spend on GPUs.

Commands:
  python -m zeus.demo                the main job on whatever GPUs are visible (try it with
                                     ZEUS_GPU_BACKEND=sim for the simulated GPU)
  python -m zeus.show_env            versions, GPU backend and devices, ZEUS_* settings
  python -m zeus.monitor energy|power  measure energy or power until Ctrl-C
  python -m zeus.analyze ...         energy and average power of a zeus-monitor log
  python -m zeus.device journal|restore  GPU settings zeus changed, and undoing them
  python -m zeus.simulate ...        the Zeus paper's trace-driven simulation
  python -m zeus.device.sim nvml-path|presets  the simulated GPU
  zeus-monitor LOGFILE DURATION SLEEP_MS  standalone power logger (--help)
  zeus-bso-server                    batch-size optimizer server ('bso-server' extra)
  zeus-perseus-server                Perseus frequency-plan server ('perseus' extra)

Each takes --help and --version; --debug shows the traceback of an error.
"""


def main(argv: list[str] | None = None) -> int:
    """Print the command list (or, with `--version`, the version); returns the exit status."""
    return cli.run(PROG, _main, argv)


def _main(argv: list[str]) -> int:
    cli.Parser(
        prog=PROG,
        description=COMMANDS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    print(COMMANDS, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
