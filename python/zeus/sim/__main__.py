"""`python -m zeus.sim nvml-path | presets`."""

from __future__ import annotations

import argparse
import sys

import zeus.sim


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m zeus.sim`."""
    parser = argparse.ArgumentParser(prog="python -m zeus.sim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("nvml-path", help="print the absolute path of the simulated libnvidia-ml.so.1")
    sub.add_parser("presets", help="list the GPU models the simulator knows")
    args = parser.parse_args(argv)
    if args.command == "nvml-path":
        try:
            print(zeus.sim.nvml_library_path())
        except FileNotFoundError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    else:
        print("\n".join(zeus.sim.known_presets()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
