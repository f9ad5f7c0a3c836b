"""`python -m zeus.device.sim nvml-path | amdsmi-path | presets`."""

from __future__ import annotations

import sys

import zeus.device.sim
from zeus.util import cli


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m zeus.device.sim`."""
    return cli.run("python -m zeus.device.sim", _main, argv)


def _main(argv: list[str]) -> int:
    parser = cli.Parser(prog="python -m zeus.device.sim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("nvml-path", help="print the absolute path of the simulated libnvidia-ml.so.1")
    sub.add_parser("amdsmi-path", help="print the absolute path of the simulated libamd_smi.so")
    sub.add_parser("presets", help="list the GPU models the simulator knows")
    args = parser.parse_args(argv)
    if args.command in ("nvml-path", "amdsmi-path"):
        find = {
            "nvml-path": zeus.device.sim.nvml_library_path,
            "amdsmi-path": zeus.device.sim.amdsmi_library_path,
        }[args.command]
        try:
            print(find())
        except FileNotFoundError as e:
            raise cli.CliError(str(e), "reinstall zeus from source: pip install .") from None
    else:
        print("\n".join(zeus.device.sim.known_presets()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
