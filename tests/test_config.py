"""App factory and configuration precedence."""
from __future__ import annotations

import stat

import pytest

from webapp import create_app
from webapp.core.settings import ConfigError, build_config


def test_factory_builds_app_with_instance_folder(tmp_path):
    app = create_app({"INSTANCE_DIR": str(tmp_path / "inst")})
    assert app.instance_path == str((tmp_path / "inst").resolve())
    assert app.config["SQLALCHEMY_DATABASE_URI"] == f"sqlite:///{(tmp_path / 'inst').resolve() / 'rlhf.db'}"
    assert (tmp_path / "inst" / "rlhf.db").is_file()  # tables created on first start


def test_precedence_defaults_file_env_explicit(tmp_path, monkeypatch):
    inst = tmp_path / "inst"
    inst.mkdir()
    (inst / "config.py").write_text("RLHF_MAX_NEW_TOKENS = 11\nRLHF_TOP_P = 0.5\nRLHF_DEVICE = 'cpu'\n"
                                    "lowercase_ignored = 1\n")
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(inst))
    cfg = build_config()
    assert cfg["RLHF_MAX_NEW_TOKENS"] == 11  # file beats default
    assert cfg["RLHF_TEMPERATURE"] == 0.8  # default
    assert "lowercase_ignored" not in cfg

    monkeypatch.setenv("RLHF_MAX_NEW_TOKENS", "22")
    monkeypatch.setenv("RLHF_SCHEDULER", "yes")
    cfg = build_config()
    assert cfg["RLHF_MAX_NEW_TOKENS"] == 22  # environment beats file (and is converted)
    assert cfg["RLHF_SCHEDULER"] is True
    assert cfg["RLHF_TOP_P"] == 0.5

    cfg = build_config({"RLHF_MAX_NEW_TOKENS": 33})
    assert cfg["RLHF_MAX_NEW_TOKENS"] == 33  # explicit config beats everything


def test_database_url_from_environment(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'other.db'}"
    monkeypatch.setenv("DATABASE_URL", url)
    app = create_app({"INSTANCE_DIR": str(tmp_path / "inst")})
    assert app.config["SQLALCHEMY_DATABASE_URI"] == url
    assert (tmp_path / "other.db").is_file()
    assert not (tmp_path / "inst" / "rlhf.db").exists()


def test_secret_key_generated_once_and_private(tmp_path):
    a = build_config({"INSTANCE_DIR": str(tmp_path)})
    b = build_config({"INSTANCE_DIR": str(tmp_path)})
    assert a["SECRET_KEY"] == b["SECRET_KEY"] and len(a["SECRET_KEY"]) >= 64
    mode = stat.S_IMODE((tmp_path / "secret_key").stat().st_mode)
    assert mode == 0o600
    other = build_config({"INSTANCE_DIR": str(tmp_path / "elsewhere")})
    assert other["SECRET_KEY"] != a["SECRET_KEY"]


def test_secret_key_from_environment_is_not_written(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_SECRET_KEY", "from-the-environment")
    cfg = build_config({"INSTANCE_DIR": str(tmp_path)})
    assert cfg["SECRET_KEY"] == "from-the-environment"
    assert not (tmp_path / "secret_key").exists()


@pytest.mark.parametrize("name,value,needle", [
    ("RLHF_SCHEDULER", "maybe", "RLHF_SCHEDULER='maybe' is not a boolean"),
    ("RLHF_MAX_NEW_TOKENS", "lots", "RLHF_MAX_NEW_TOKENS='lots' is not a int"),
    ("RLHF_DEVICE", "tpu", "RLHF_DEVICE='tpu' must be auto, cpu or cuda"),
    ("RLHF_RUN_STALL_SECONDS", "0", "RLHF_RUN_STALL_SECONDS=0.0 must be a number of seconds above 0"),
    ("RLHF_RUN_STALL_SECONDS", "soon", "RLHF_RUN_STALL_SECONDS='soon' is not a float"),
    ("RLHF_WATCHDOG_INTERVAL_SECONDS", "-5", "RLHF_WATCHDOG_INTERVAL_SECONDS=-5.0 must be a number of seconds above 0"),
    ("RLHF_RUN_MAX_SECONDS", "-1", "RLHF_RUN_MAX_SECONDS=-1.0 must be >= 0"),
])
def test_invalid_settings_name_the_setting(tmp_path, monkeypatch, name, value, needle):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        build_config({"INSTANCE_DIR": str(tmp_path)})


def test_invalid_setting_on_the_command_line_is_one_line(tmp_path, monkeypatch):
    from click.testing import CliRunner
    from flask.cli import FlaskGroup

    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(tmp_path))
    monkeypatch.setenv("RLHF_DEVICE", "tpu")
    result = CliRunner().invoke(FlaskGroup(create_app=lambda: create_app()), ["init-db"])
    assert result.exit_code == 1
    assert "Error: RLHF_DEVICE='tpu' must be auto, cpu or cuda" in result.output
    assert "Traceback" not in result.output
