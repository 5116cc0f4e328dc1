"""``maxkernel fleet up|status|down`` on loopback: every process listed and alive (the standby daemon and the
spare tester among them), then all gone."""

from __future__ import annotations

import pytest
import re
import urllib.request
from pathlib import Path

from typer.testing import CliRunner

from maxkernel.cli import app
from orchestrators import fleet


@pytest.mark.slow
def test_fleet_up_status_down(tmp_path: Path) -> None:
    runner = CliRunner()
    root = tmp_path / "fleet"
    try:
        up = runner.invoke(app, ["fleet", "up", "--dir", str(root), "--daemons", "1", "--testers", "1"])
        assert up.exit_code == 0, up.output
        state = fleet.read(root)
        assert state is not None and state.store_url in up.output
        assert [p.name for p in state.procs] == ["postgres", "chroma", "host", "daemons", "testers"]
        assert state.host.startswith("127.0.0.1:")
        assert state.chroma_url.startswith("http://127.0.0.1:")

        again = runner.invoke(app, ["fleet", "up", "--dir", str(root)])
        assert again.exit_code == 2 and "already running" in again.output

        fleet.wait_ready(state, testers=1, spares=1)  # the daemon serving and its standby warm, the same for testers
        rows = fleet.status(root)
        assert [r["name"] for r in rows] == ["postgres", "chroma", "host", "daemons", "daemon-0", "daemon-standby",
                                             "testers"] and all(r["alive"] for r in rows)
        doing = {r["name"]: r["doing"] for r in rows}
        assert doing["daemons"] == doing["testers"] == "1 serving, 1 on standby, 0 spares promoted"
        assert doing["daemon-standby"].startswith("standby") and doing["daemon-0"].startswith("idle")
        shown = runner.invoke(app, ["fleet", "status", "--dir", str(root)])
        assert shown.exit_code == 0 and "daemon-standby" in shown.output and "testers" in shown.output
        for name in ("daemons", "testers"):
            assert len(fleet.serving_workers(next(p for p in state.procs if p.name == name))) == 1
        # the serving daemon's dashboard lists the fleet's processes, the daemons under their supervisor included
        port = next(r["port"] for r in rows if r["name"] == "daemon-0")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ui/fleet", timeout=60) as reply:
            page = reply.read().decode()
        listed = re.findall(r'<tr class="proc"><td class="font-monospace">([\w-]+)</td><td>(\d+)</td>', page)
        assert [name for name, _ in listed] == [r["name"] for r in rows]
        assert {int(pid) for _, pid in listed} == {r["pid"] for r in rows}
        assert '<a class="nav-link active" href="/ui/fleet">fleet</a>' in page

        down = runner.invoke(app, ["fleet", "down", "--dir", str(root)])
        assert down.exit_code == 0 and "stopped 5 processes" in down.output
        assert not any(fleet.alive(p.pid) for p in state.procs)
        gone = runner.invoke(app, ["fleet", "status", "--dir", str(root)])
        assert gone.exit_code == 2 and "no fleet is running" in gone.output
    finally:
        left = fleet.read(root)
        if left is not None:
            fleet.stop_procs(left.procs)


def test_an_unknown_fleet_action_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["fleet", "sideways", "--dir", str(tmp_path)])
    assert result.exit_code == 2 and "unknown fleet action 'sideways'" in result.output
