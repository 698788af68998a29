"""scripts/system-deps.sh (`make test`'s Debian packages): nothing runs when every tool is there; otherwise it says
what it installs and why before apt-get runs, and without root or sudo it stops with the command to run as root.

Run against a PATH of stand-ins: the tools, `id`, and `sudo` / `apt-get` / `systemctl` that only log their call."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "system-deps.sh"
BASH = shutil.which("bash")
TOOLS = ("promtool", "prometheus-pushgateway", "docker-compose", "caddy", "redis-server")
FONTS = {"fonts-dejavu-core": "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf",
         "fonts-liberation": "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf"}


def _stub(path: Path, body: str) -> None:
    path.write_text(f"#!{BASH}\n{body}\n")
    path.chmod(0o755)


def run(tmp_path: Path, present=TOOLS, uid=1000, sudo=True, apt=True, fonts=tuple(FONTS), **env):
    """The script with `present` on its PATH and the files of the `fonts` packages under a root of its own."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    files = tmp_path / "root"
    for pkg in fonts:
        (files / FONTS[pkg].lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (files / FONTS[pkg].lstrip("/")).write_bytes(b"")
    log = tmp_path / "calls.log"
    log.write_text("")
    for tool in present:
        _stub(bin_dir / tool, "exit 0")
    _stub(bin_dir / "id", f'[ "$1" = -u ] && echo {uid}')
    os.symlink(shutil.which("env"), bin_dir / "env")
    logged = [name for name, wanted in (("sudo", sudo), ("apt-get", apt), ("systemctl", True)) if wanted]
    for name in logged:
        # sudo runs the rest of its command line, as the real one does
        _stub(bin_dir / name, f'echo "{name} $*" >> {log}' + ('\nexec "$@"' if name == "sudo" else ""))
    proc = subprocess.run([BASH, str(SCRIPT)], capture_output=True, text=True, timeout=30,
                          env={"PATH": str(bin_dir), "SYSTEM_DEPS_FILES_ROOT": str(files), **env})
    return proc, log.read_text().splitlines()


def test_all_tools_there_runs_nothing(tmp_path):
    proc, calls = run(tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr, calls) == (0, "", "", [])


def test_all_tools_there_needs_no_sudo(tmp_path):
    proc, calls = run(tmp_path, sudo=False, apt=False)
    assert (proc.returncode, calls) == (0, [])


def test_missing_tool_says_what_and_why_then_installs_with_sudo(tmp_path):
    proc, calls = run(tmp_path, present=("promtool", "prometheus-pushgateway", "caddy", "redis-server"))
    assert proc.returncode == 0, proc.stderr
    assert "docker-compose: `docker-compose config` validates docker-compose.yml" in proc.stdout
    assert "Installing them: sudo apt-get install -y -qq --no-install-recommends docker-compose" in proc.stdout
    assert calls[0] == "sudo apt-get update -qq"
    assert calls[2] == "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose"
    assert calls[3] == "apt-get install -y -qq --no-install-recommends docker-compose"


def test_a_missing_font_is_found_by_its_file_and_installed(tmp_path):
    proc, calls = run(tmp_path, fonts=("fonts-dejavu-core",))
    assert proc.returncode == 0, proc.stderr
    assert "fonts-liberation: the other fonts of the signs `crossprobe fit-text-gate` draws" in proc.stdout
    assert f"({FONTS['fonts-liberation']} not found)" in proc.stdout
    assert "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends fonts-liberation" in calls


def test_root_installs_without_sudo(tmp_path):
    proc, calls = run(tmp_path, present=("docker-compose", "caddy", "redis-server"), uid=0, sudo=False)
    assert proc.returncode == 0, proc.stderr
    assert "prometheus: the dashboards'" in proc.stdout and "prometheus-pushgateway: the batch jobs'" in proc.stdout
    assert "apt-get install -y -qq --no-install-recommends prometheus prometheus-pushgateway" in calls
    assert not any(c.startswith("sudo") for c in calls)


def test_no_root_no_sudo_stops_with_the_command(tmp_path):
    proc, calls = run(tmp_path, present=("promtool", "docker-compose", "caddy", "redis-server"), sudo=False)
    assert proc.returncode == 1
    assert "prometheus-pushgateway: the batch jobs'" in proc.stdout
    assert "Not root and no sudo here" in proc.stderr
    assert "apt-get update && apt-get install -y -qq --no-install-recommends prometheus-pushgateway" in proc.stderr
    assert calls == []


def test_no_apt_get_names_the_programs(tmp_path):
    proc, calls = run(tmp_path, present=("promtool", "prometheus-pushgateway", "caddy", "redis-server"), apt=False)
    assert proc.returncode == 1 and "docker-compose" in proc.stdout and "No apt-get here" in proc.stderr
    assert calls == []


@pytest.mark.parametrize("with_browser, asked", [("1", True), ("0", False)])
def test_browser_only_for_e2e(tmp_path, with_browser, asked):
    proc, calls = run(tmp_path, uid=0, WITH_BROWSER=with_browser)
    assert proc.returncode == 0
    assert ("chromium: the web page's browser test" in proc.stdout) is asked
    assert any("chromium" in c for c in calls) is asked
