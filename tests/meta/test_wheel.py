"""The package installs: a wheel built from the checkout carries the pages (templates/, static/),
the schema migrations and the launch configs, and an app installed from it -- into a fresh virtual
environment, run from a folder outside the checkout -- serves the chat page and its assets.

The fresh environment reuses the dependencies of the one running the tests (a .pth file names its
site-packages, added after the install so pip never sees this checkout's own install there): the
test builds and installs only this project, offline.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

# What the build reads (setuptools writes build/ and *.egg-info next to it: a copy keeps the checkout clean).
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "webapp", "rlhf", "templates", "static")
# Run by the installed environment's interpreter: imports the installed packages first, then the
# test helpers (the checkout goes last on sys.path, after webapp and rlhf are imported from the wheel).
SERVE = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import rlhf, webapp
    from rlhf.training.distributed import default_config
    from webapp.core.settings.sources import instance_dir
    sys.path.append(sys.argv[1])
    from tests.support.app import make_app, register_model

    app = make_app(Path("app-instance").resolve())
    register_model(app, Path(sys.argv[2]))
    client = app.test_client()
    pages = {}
    for path in ("/", "/static/css/app.css", "/static/js/chat/main.js", "/admin/login"):
        resp = client.get(path)
        pages[path] = [resp.status_code, resp.get_data(as_text=True)]
    print(json.dumps({"webapp": webapp.__file__, "rlhf": rlhf.__file__, "instance": str(instance_dir()),
                      "launch_config": default_config(cpu=True).is_file(), "pages": pages}))
""")


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kwargs)
    assert result.returncode == 0, f"{cmd[:4]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "instance")
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=skip)
        else:
            shutil.copy2(path, source / name)
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "--no-index",
         "--quiet", "-w", str(out)])
    (built,) = out.glob("rlhf_chat-*.whl")
    return built


def test_the_wheel_carries_the_pages_migrations_and_launch_configs(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in ("templates", "static"):
        files = {f"webapp/{p.relative_to(ROOT).as_posix()}" for p in (ROOT / folder).rglob("*") if p.is_file()}
        assert len(files) > 5 and files <= names, sorted(files - names)
    assert {"webapp/migrations/alembic.ini", "webapp/migrations/env.py", "rlhf/launch/multi_cpu.yaml"} <= names
    assert any(n.startswith("webapp/migrations/versions/0001") for n in names)
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == {"webapp", "rlhf"}  # the pages inside the package, not beside it


def test_an_installed_app_serves_its_pages(wheel, tmp_path, micro_model_dir):
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=False, symlinks=os.name != "nt")
    python = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "--quiet",
         str(wheel)])
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    dependencies = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    (site / "test-dependencies.pth").write_text("\n".join(sorted(dependencies)) + "\n")

    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    out = json.loads(run([str(python), "-c", SERVE, str(ROOT), str(micro_model_dir)], cwd=workdir,
                         env=env).stdout.strip().splitlines()[-1])

    for package in ("webapp", "rlhf"):
        assert Path(out[package]).is_relative_to(site), out[package]  # the wheel's copy, not the checkout's
    assert Path(out["instance"]) == workdir.resolve() / "instance"  # not inside site-packages
    assert out["launch_config"]
    pages = out["pages"]
    assert {path: status for path, (status, _) in pages.items()} == {path: 200 for path in pages}
    chat = pages["/"][1]
    assert 'id="composer-input"' in chat and "js/chat/main.js" in chat
    assert pages["/static/css/app.css"][1] == (ROOT / "static" / "css" / "app.css").read_text()
    assert pages["/static/js/chat/main.js"][1] == (ROOT / "static" / "js" / "chat" / "main.js").read_text()
    assert 'name="password"' in pages["/admin/login"][1]
