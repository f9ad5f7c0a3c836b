"""The Kubernetes DaemonSet in examples/kubernetes: well-formed, and each container has the
security context its job needs (no kubectl or cluster here: a structural check)."""

from __future__ import annotations

from pathlib import Path

import yaml

MANIFEST = Path(__file__).resolve().parents[2] / "examples" / "kubernetes" / "zeus-node.yaml"


def test_the_daemonset_is_well_formed_and_least_privileged() -> None:
    docs = list(yaml.safe_load_all(MANIFEST.read_text()))
    assert len(docs) == 1
    ds = docs[0]
    assert (ds["apiVersion"], ds["kind"]) == ("apps/v1", "DaemonSet")
    spec = ds["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    pod = spec["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    assert set(containers) == {"exporter", "zeusd"}
    exporter, zeusd = containers["exporter"], containers["zeusd"]
    # The exporter reads only: no root, no capabilities.
    sc = exporter["securityContext"]
    assert sc["runAsNonRoot"] and sc["capabilities"]["drop"] == ["ALL"]
    assert "add" not in sc["capabilities"]
    assert exporter["command"][:2] == ["zeus-monitor", "serve"]
    assert exporter["readinessProbe"]["httpGet"]["path"] == "/healthz"
    # zeusd: root with SYS_ADMIN only, its socket on the host for the node's jobs, 0660.
    sc = zeusd["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert sc["allowPrivilegeEscalation"] is False
    cmd = zeusd["command"]
    assert cmd[cmd.index("--socket-permissions") + 1] == "660"
    socket_dir = str(Path(cmd[cmd.index("--socket-path") + 1]).parent)
    mounts = {m["name"]: m["mountPath"] for m in zeusd["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    run = next(n for n, p in mounts.items() if p == socket_dir)
    assert volumes[run]["hostPath"]["path"] == socket_dir
    state = cmd[cmd.index("--state-dir") + 1]
    assert state in mounts.values()
    # zeusd restores killed clients by pid: it sees the host's processes.
    assert pod["hostPID"] is True
    assert pod["terminationGracePeriodSeconds"] >= 10
