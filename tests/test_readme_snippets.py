"""Every ```python block of README.md runs, as a user would run it, on the simulated GPU.

Each block runs in a fresh interpreter with `ZEUS_GPU_BACKEND=sim` (the simulated A40 on the real
clock, at the default fidelity, as the README tells users to run it), in an empty working
directory. HTML comments directly above a block's fence adjust its run:

- `<!-- needs: torch, transformers -->`: the block imports these packages; it is skipped, saying
  which one is missing, only when one is not installed.
- `<!-- env: NAME=VALUE ... -->`: more environment for the block (the README's text says so too).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
TIMEOUT_S = 240
_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^<!--\s*(needs|env):\s*(.*?)\s*-->$")


@dataclass
class Snippet:
    """One ```python block: where it is, its code and what its markers ask for."""

    heading: str
    line: int
    code: str
    needs: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def extract(text: str) -> list[Snippet]:
    """The ```python blocks of a Markdown text, with their heading and markers."""
    snippets: list[Snippet] = []
    heading = "(before any heading)"
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            if lines[i].startswith("#"):
                heading = lines[i].lstrip("#").strip()
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        if i == len(lines):
            raise ValueError(f"README.md line {start + 1}: a code block is never closed")
        if fence.group(1) == "python":
            snippet = Snippet(heading, start + 1, "\n".join(lines[start + 1 : i]) + "\n")
            _read_markers(lines, start, snippet)
            snippets.append(snippet)
        i += 1
    return snippets


def _read_markers(lines: list[str], fence: int, snippet: Snippet) -> None:
    j = fence - 1
    while j >= 0 and (not lines[j].strip() or _MARKER.match(lines[j].strip())):
        marker = _MARKER.match(lines[j].strip())
        if marker is not None:
            kind, value = marker.groups()
            if kind == "needs":
                snippet.needs += [n.strip() for n in value.split(",") if n.strip()]
            else:
                for item in value.split():
                    name, sep, val = item.partition("=")
                    if not sep:
                        raise ValueError(f"README.md line {j + 1}: env marker {item!r}")
                    snippet.env[name] = val
        j -= 1


SNIPPETS = extract(README.read_text())


def _id(snippet: Snippet) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", snippet.heading).strip("-").lower()


def test_extract_reads_headings_markers_and_only_python_blocks() -> None:
    text = "\n".join(
        [
            "# Top",
            "```bash",
            "# not a heading",
            "```",
            "## Two",
            "<!-- needs: torch, transformers -->",
            "<!-- env: A=1 B=x=y -->",
            "",
            "```python",
            "print(1)",
            "```",
            "<!-- needs: nothing-above-a-bash-block -->",
            "```bash",
            "true",
            "```",
            "```python",
            "print(2)",
            "```",
        ]
    )
    first, second = extract(text)
    assert (first.heading, first.line, first.code) == ("Two", 9, "print(1)\n")
    assert first.needs == ["torch", "transformers"]
    assert first.env == {"A": "1", "B": "x=y"}
    assert (second.heading, second.needs, second.env) == ("Two", [], {})


def test_readme_shows_each_use() -> None:
    code = "".join(s.code for s in SNIPPETS)
    for name in (
        "begin_window",
        "end_window",
        "total_energy_uncertainty",
        "GlobalPowerLimitOptimizer(",
        "on_epoch_begin()",
        "on_step_begin()",
        "on_step_end()",
        "on_epoch_end()",
        "callbacks=[HFGlobalPowerLimitOptimizer(monitor)]",
        "cpu_indices=",
        "PowerMonitor(",
    ):
        assert name in code, f"no README snippet shows {name}"


def test_quick_start_keeps_its_two_commands() -> None:
    text = README.read_text()
    quick = text.split("## Quick start\n", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)```", quick, re.DOTALL)
    assert commands == [
        "pip install . && ZEUS_GPU_BACKEND=sim ZEUS_SIM_GPUS=A40,V100 python -m zeus.demo\n",
        "scripts/test\n",
    ]


@pytest.mark.parametrize("snippet", SNIPPETS, ids=_id)
def test_snippet_uses_the_public_api_only(snippet: Snippet) -> None:
    # zeus.device.sim drives the simulator in tests; a user's program does not call it.
    private = re.findall(r"\bzeus(?:\.\w+)*\.(?:_\w*|device\.sim)\b", snippet.code)
    private += re.findall(r"\bfrom zeus[\w.]* import .*?\b(_\w+|sim)\b", snippet.code)
    assert not private, f"README snippet under {snippet.heading!r} uses {private}"


@pytest.mark.parametrize("snippet", SNIPPETS, ids=_id)
def test_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    missing = [n for n in snippet.needs if importlib.util.find_spec(n) is None]
    if missing:
        pytest.skip(
            f"README snippet under {snippet.heading!r} needs {', '.join(missing)}, which is not "
            "installed (pip install -e '.[test]')"
        )
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ZEUS_", "ZEUSD_", "CUDA_", "HF_"))
    }
    env.update(
        ZEUS_GPU_BACKEND="sim",
        ZEUS_SIM_GPUS="A40",
        # The optimizer journals the power limits it changes: keep that out of the user's state.
        ZEUS_STATE_DIR=str(tmp_path / "state"),
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf-home"),
        **snippet.env,
    )
    script = tmp_path / "example.py"
    script.write_text(snippet.code)
    work = tmp_path / "cwd"
    work.mkdir()
    try:
        proc = subprocess.run(
            [sys.executable, str(script)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"README snippet under {snippet.heading!r} (README.md line {snippet.line}) ran "
            f"over {TIMEOUT_S} s; its output so far:\n{e.stdout!r}\n{e.stderr!r}"
        )
    if proc.returncode != 0:
        pytest.fail(
            f"README snippet under {snippet.heading!r} (README.md line {snippet.line}) failed "
            f"with exit status {proc.returncode}:\n{proc.stderr[-4000:]}",
            pytrace=False,
        )
    assert proc.stdout.strip(), (
        f"README snippet under {snippet.heading!r} printed nothing; stderr:\n{proc.stderr}"
    )


def test_zeus_monitor_docstring_example_runs(sim_gpus: object) -> None:
    import doctest

    from zeus.monitor import ZeusMonitor

    assert "Example:" in (ZeusMonitor.__doc__ or "")
    sim_gpus("A40", clock="real")  # type: ignore[operator]
    finder = doctest.DocTestFinder(recurse=False)
    (test,) = finder.find(ZeusMonitor, "ZeusMonitor", globs={})
    assert test.examples, "ZeusMonitor's Example section has no >>> lines"
    runner = doctest.DocTestRunner(verbose=False, optionflags=doctest.ELLIPSIS)
    with warnings.catch_warnings():
        # The example's window is empty here (the user's code is skipped): it is that short.
        warnings.filterwarnings("ignore", "Measurement window 'epoch' lasted", UserWarning)
        result = runner.run(test)
    run = [e for e in test.examples if not e.options.get(doctest.SKIP)]
    assert result.failed == 0 and result.attempted == len(run) >= 5
