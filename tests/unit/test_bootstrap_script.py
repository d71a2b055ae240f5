"""infra/bootstrap.sh installs Debian packages as root, through sudo for any other user, and
gives Python its venv support before it makes the virtualenv. Its functions run here against
stand-in id, sudo, apt-get and python3 commands that record how they were called."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "infra" / "bootstrap.sh"


@dataclass(frozen=True)
class Machine:
    uid: int
    sudo: bool
    python_venv: bool = True


def _stand_ins(tmp_path: Path, machine: Machine) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    scripts = {
        "id": f"echo {machine.uid}",
        # A sudo that only marks what it runs, so the apt-get stand-in can tell.
        "sudo": 'SUDO_USER=someone exec "$@"',
        "apt-get": f'echo "apt-get $* sudo=${{SUDO_USER:-no}} frontend=${{DEBIAN_FRONTEND:-}}"'
        f" >> {calls}",
        "python3": f"exit {0 if machine.python_venv else 1}",
    }
    if not machine.sudo:
        del scripts["sudo"]
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    (bin_dir / "env").symlink_to("/usr/bin/env")
    return bin_dir


def _run(tmp_path: Path, machine: Machine, call: str) -> tuple[int, list[str], str]:
    bin_dir = _stand_ins(tmp_path, machine)
    result = subprocess.run(
        ["/bin/bash", "-c", f'source "{SCRIPT}"; {call}'],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
        # Only the stand-ins on PATH; the venv is a path of ours should the script run its steps.
        env={"PATH": str(bin_dir), "MEMORYD_VENV": str(tmp_path / "venv"), "HOME": str(tmp_path)},
        cwd=tmp_path,
    )
    calls = tmp_path / "calls"
    lines = calls.read_text(encoding="utf-8").splitlines() if calls.exists() else []
    return result.returncode, lines, result.stderr


@pytest.mark.parametrize(
    ("machine", "expected"),
    [
        (
            Machine(uid=0, sudo=False),
            [
                "apt-get update -qq sudo=no frontend=",
                "apt-get install -y -qq postgresql sudo=no frontend=noninteractive",
            ],
        ),
        (
            Machine(uid=1000, sudo=True),
            [
                "apt-get update -qq sudo=someone frontend=",
                "apt-get install -y -qq postgresql sudo=someone frontend=noninteractive",
            ],
        ),
    ],
)
def test_packages_are_installed_as_root_or_through_sudo(
    tmp_path: Path, machine: Machine, expected: list[str]
) -> None:
    code, calls, stderr = _run(tmp_path, machine, "apt_install postgresql")

    assert code == 0, stderr
    assert calls == expected


def test_without_root_or_sudo_it_says_so_and_installs_nothing(tmp_path: Path) -> None:
    code, calls, stderr = _run(tmp_path, Machine(uid=1000, sudo=False), "apt_install postgresql")

    assert code == 1
    assert calls == []
    assert "needs root and sudo is not installed" in stderr


@pytest.mark.parametrize(
    ("python_venv", "expected"),
    [
        (False, ["apt-get install -y -qq python3 python3-venv sudo=no frontend=noninteractive"]),
        (True, []),
    ],
)
def test_python_gets_venv_support_when_it_lacks_it(
    tmp_path: Path, python_venv: bool, expected: list[str]
) -> None:
    machine = Machine(uid=0, sudo=False, python_venv=python_venv)
    code, calls, stderr = _run(tmp_path, machine, "ensure_python_venv")

    assert code == 0, stderr
    assert [c for c in calls if "update" not in c] == expected


def test_sourcing_the_script_runs_none_of_its_steps(tmp_path: Path) -> None:
    code, calls, stderr = _run(tmp_path, Machine(uid=0, sudo=False, python_venv=False), "true")

    assert (code, calls) == (0, []), stderr
    assert not (tmp_path / "venv").exists()
    assert os.listdir(tmp_path) == ["bin"]
