"""App factory and configuration precedence; the instance folder's privacy and secret key."""
from __future__ import annotations

import json
import logging
import os
import stat

import pytest

from tests.support.leaked_key import leaked_secret_key
from webapp import create_app
from webapp.core.settings import ROOT, ConfigError, build_config, effective, markdown_tables, resolve


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


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o000, 0o022])
def test_a_new_instance_is_readable_by_its_owner_only_whatever_the_umask(tmp_path, mask):
    """The instance folder holds every conversation, all feedback and every hash: 0700, and its
    database (with SQLite's side files) and secret key 0600, even under umask 000 or 022."""
    from sqlalchemy import text

    from webapp.core.extensions import db

    old = os.umask(mask)
    try:
        app = create_app({"INSTANCE_DIR": str(tmp_path / "inst")})
        with app.app_context(), db.engine.connect() as connection:  # an open connection: -wal, -shm
            connection.execute(text("SELECT COUNT(*) FROM users")).scalar()
            inst = tmp_path / "inst"
            found = {p.name: oct(mode(p)) for p in inst.iterdir() if p.name.startswith(("rlhf.db", "secret_key"))}
            assert {"rlhf.db", "rlhf.db-wal", "rlhf.db-shm", "secret_key"} <= set(found)
            assert found == dict.fromkeys(found, "0o600") and mode(inst) == 0o700
    finally:
        os.umask(old)


def test_an_existing_instance_is_tightened_at_start_with_one_log_line(tmp_path, caplog):
    inst = tmp_path / "inst"
    app = create_app({"INSTANCE_DIR": str(inst), "RLHF_AUTO_INIT_MODEL": False})
    from webapp.core.extensions import db

    with app.app_context():
        db.engine.dispose()
    backup = inst / "backups" / "backup-20260101T000000-000000Z"
    (backup / "instance").mkdir(parents=True)
    (backup / "manifest.json").write_text("{}")
    (backup / "database.sqlite").write_bytes(b"")
    os.chmod(inst, 0o755)
    for path in (inst / "rlhf.db", inst / "secret_key", backup / "manifest.json", backup / "database.sqlite"):
        os.chmod(path, 0o644)
    for path in (inst / "backups", backup, backup / "instance"):
        os.chmod(path, 0o755)
    with caplog.at_level(logging.INFO):
        create_app({"INSTANCE_DIR": str(inst), "RLHF_AUTO_INIT_MODEL": False})
    lines = [r.getMessage() for r in caplog.records if "owner only" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert all(name in lines[0] for name in ("rlhf.db", "secret_key", "backups")), lines[0]
    assert (mode(inst), mode(inst / "rlhf.db"), mode(inst / "secret_key")) == (0o700, 0o600, 0o600)
    assert {mode(p) for p in [inst / "backups", *(inst / "backups").rglob("*")] if p.is_dir()} == {0o700}
    assert {mode(p) for p in (inst / "backups").rglob("*") if p.is_file()} == {0o600}
    caplog.clear()
    with caplog.at_level(logging.INFO):
        create_app({"INSTANCE_DIR": str(inst), "RLHF_AUTO_INIT_MODEL": False})
    assert not [r for r in caplog.records if "owner only" in r.getMessage()]  # nothing left to tighten


def test_the_secret_key_published_in_git_history_is_refused(tmp_path, monkeypatch):
    """A key that was once committed to this repository signs no instance's cookies: the app does not
    start, with one line, whether the key is the instance's file or set in the environment."""
    from click.testing import CliRunner
    from flask.cli import FlaskGroup

    key = leaked_secret_key()
    inst = tmp_path / "inst"
    inst.mkdir()
    (inst / "secret_key").write_text(key + "\n")
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(inst))
    result = CliRunner().invoke(FlaskGroup(create_app=lambda: create_app()), ["init-db"])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "secret key" in errors[0] and str(inst / "secret_key") in errors[0], result.output
    assert "Traceback" not in result.output and key not in result.output
    assert not (inst / "rlhf.db").exists()  # refused before the database is touched
    monkeypatch.setenv("RLHF_SECRET_KEY", key)
    with pytest.raises(ConfigError) as err:
        build_config({"INSTANCE_DIR": str(tmp_path / "other")})
    assert "RLHF_SECRET_KEY" in err.value.message and "\n" not in err.value.message
    monkeypatch.setenv("RLHF_SECRET_KEY", "a key of its own")
    assert build_config({"INSTANCE_DIR": str(tmp_path / "other")})["SECRET_KEY"] == "a key of its own"


def test_the_wsgi_entry_refuses_the_published_key_in_one_line(tmp_path):
    import subprocess
    import sys

    key = leaked_secret_key()
    (tmp_path / "secret_key").write_text(key)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLHF_", "DATABASE_URL"))}
    done = subprocess.run([sys.executable, "-c", "import webapp.wsgi"], cwd=ROOT, capture_output=True, text=True,
                          env={**env, "RLHF_INSTANCE_DIR": str(tmp_path), "RLHF_AUTO_INIT_MODEL": "0"})
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "secret key" in errors[0] and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("name,value,needle", [
    ("RLHF_SCHEDULER", "maybe", "RLHF_SCHEDULER='maybe' (environment) is not a boolean"),
    ("RLHF_MAX_NEW_TOKENS", "lots", "RLHF_MAX_NEW_TOKENS='lots' (environment) is not a whole number"),
    ("RLHF_MAX_NEW_TOKENS", "0", "RLHF_MAX_NEW_TOKENS='0' (environment) must be >= 1"),
    ("RLHF_TEMPERATURE", "warm", "RLHF_TEMPERATURE='warm' (environment) is not a number"),
    ("RLHF_DEVICE", "tpu", "RLHF_DEVICE='tpu' (environment) must be auto, cpu, cuda or cuda:N"),
    ("RLHF_EMBEDDED_PRESET", "huge", "RLHF_EMBEDDED_PRESET='huge' (environment) must be one of default, micro"),
    ("RLHF_RUN_STALL_SECONDS", "0", "RLHF_RUN_STALL_SECONDS='0' (environment) must be > 0"),
    ("RLHF_WATCHDOG_INTERVAL_SECONDS", "-5", "RLHF_WATCHDOG_INTERVAL_SECONDS='-5' (environment) must be > 0"),
    ("RLHF_RUN_MAX_SECONDS", "-1", "RLHF_RUN_MAX_SECONDS='-1' (environment) must be >= 0"),
    ("RLHF_KL_COEF", "-1", "RLHF_KL_COEF='-1' (environment) must be >= 0"),
    ("RLHF_RETRAIN_ALGORITHM", "sgd", "RLHF_RETRAIN_ALGORITHM='sgd' (environment) must be one of ppo, dpo, kto, rloo"),
    ("RLHF_EXPERIMENT_SPLIT", "3", "RLHF_EXPERIMENT_SPLIT='3' (environment) must be < 1"),
    ("RLHF_PRIMARY_METRIC", "clicks", "RLHF_PRIMARY_METRIC='clicks' (environment) must be one of thumbs_up_rate"),
    ("RLHF_CHAT_RATE_LIMIT", "lots", "RLHF_CHAT_RATE_LIMIT='lots' (environment) is not a rate limit"),
    ("RLHF_TRAINING_POLICY_LORA_R", "0", "RLHF_TRAINING_POLICY_LORA_R='0' (environment) must be >= 1"),
    ("RLHF_TRAINING_DATA_EVAL_FRACTION", "1", "RLHF_TRAINING_DATA_EVAL_FRACTION='1' (environment) must be < 1"),
])
def test_invalid_settings_name_the_setting(tmp_path, monkeypatch, name, value, needle):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as err:
        build_config({"INSTANCE_DIR": str(tmp_path)})
    assert str(err.value.message).startswith(needle) and "\n" not in err.value.message


def test_bad_values_in_the_settings_files_name_the_file(tmp_path):
    """instance/config.py values are parsed like everything else (``RLHF_LORA = "no"`` is off, not on),
    and a bad value in either file stops the app naming the setting and the file."""
    (tmp_path / "config.py").write_text('RLHF_LORA = "no"\nRLHF_SCHEDULER = 0\n')
    settings = resolve({"INSTANCE_DIR": str(tmp_path)}).settings
    assert settings.training.policy.lora is False and settings.scheduler is False
    cases = [
        ("config.py", "RLHF_KL_COEF = -1\n", f"RLHF_KL_COEF=-1 ({tmp_path / 'config.py'}) must be >= 0"),
        ("config.py", "RLHF_LORA = 'perhaps'\n", "RLHF_LORA='perhaps'"),
        ("config.py", "RLHF_MAX_NEW_TOKNS = 10\n",
         "RLHF_MAX_NEW_TOKNS (" + str(tmp_path / "config.py") + ") is not a setting"),
        ("config.py", "TRAINING = {'policy': {'lora_rank': 4}}\n", "training.policy.lora_rank"),
        ("config.toml", "[training.policy]\nlora_r = -3\n",
         f"training.policy.lora_r=-3 ({tmp_path / 'config.toml'}) must be >= 1"),
        ("config.toml", "[training]\nalgorithm = 'sgd'\n", "training.algorithm='sgd'"),
        ("config.toml", "max_new_tokens = 'many'\n", "RLHF_MAX_NEW_TOKENS='many'"),
        ("config.toml", "[serving]\nport = 1\n", "[serving]"),
        ("config.toml", "[training.policy\n", "is not valid TOML"),
        ("config.toml", "[training.policy]\nbatch_size = 10\nmini_batches = 4\n",
         "batch_size must be a multiple of mini_batches"),
        ("config.toml", "[training.gate]\nmin_heldout_pairs = 20\n[training.evaluation]\nmax_pairs = 10\n",
         "evaluation.max_pairs=10 must be >= gate.min_heldout_pairs=20 (the gate could never pass)"),
        ("config.toml", "[training.gate]\nalpha = 0\n", "training.gate.alpha=0"),
    ]
    for name, text, needle in cases:
        for f in ("config.py", "config.toml"):
            (tmp_path / f).unlink(missing_ok=True)
        (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError) as err:
            build_config({"INSTANCE_DIR": str(tmp_path)})
        assert needle in err.value.message and "\n" not in err.value.message, (name, text, err.value.message)


def test_every_training_field_is_settable_with_nested_keys_and_sources_are_known(tmp_path, monkeypatch):
    (tmp_path / "config.toml").write_text('max_new_tokens = 40\n[training]\nmin_pairs = 5\n'
                                          '[training.policy]\nlora = true\nlora_r = 8\n'
                                          '[training.gate]\nmax_kl = 10.0\n[training.evaluation]\nmax_prompts = 7\n')
    monkeypatch.setenv("RLHF_TRAINING_REWARD_EPOCHS", "1.5")
    monkeypatch.setenv("RLHF_PPO_EPISODES", "64")  # a short name ...
    resolved = resolve({"INSTANCE_DIR": str(tmp_path), "RLHF_TRAINING_POLICY_PPO_EPOCHS": 2})
    t = resolved.settings.training
    assert (t.min_pairs, t.policy.lora, t.policy.lora_r, t.gate.max_kl, t.evaluation.max_prompts) \
        == (5, True, 8, 10.0, 7)
    assert (t.reward.epochs, t.policy.episodes, t.policy.ppo_epochs) == (1.5, 64, 2)
    assert resolved.settings.max_new_tokens == 40
    assert resolved.sources["training.policy.lora_r"] == str(tmp_path / "config.toml")
    assert resolved.sources["training.reward.epochs"] == "environment"
    assert resolved.sources["training.policy.ppo_epochs"] == "create_app(config)"
    assert "training.policy.seed" not in resolved.sources  # a default
    monkeypatch.setenv("RLHF_TRAINING_POLICY_EPISODES", "128")  # ... loses to the setting's own name
    assert resolve({"INSTANCE_DIR": str(tmp_path)}).settings.training.policy.episodes == 128


def test_settings_command_prints_values_and_sources_with_secrets_masked(tmp_path, monkeypatch):
    from click.testing import CliRunner
    from flask.cli import FlaskGroup

    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(tmp_path))
    monkeypatch.setenv("RLHF_AUTO_INIT_MODEL", "0")
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'x.db'}")
    (tmp_path / "config.toml").write_text("[training.policy]\nlora_r = 4\n")
    group = FlaskGroup(create_app=lambda: create_app())
    result = CliRunner().invoke(group, ["settings", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert rows["training.policy.lora_r"]["value"] == "4"
    assert rows["training.policy.lora_r"]["source"] == str(tmp_path / "config.toml")
    assert rows["training.policy.lora_r"]["env"] == "RLHF_TRAINING_POLICY_LORA_R"
    assert rows["max_new_tokens"] == {**rows["max_new_tokens"], "value": "80", "source": "default"}
    assert rows["secret_key"]["value"] == "********"
    text = CliRunner().invoke(group, ["settings"]).output
    assert (tmp_path / "secret_key").read_text() not in text
    assert "training.policy.lora_r" in text and "[Training: policy]" in text


def test_secrets_in_urls_are_masked(tmp_path, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://app:hunter2@db.example/rlhf")
    monkeypatch.setenv("RLHF_RATELIMIT_STORAGE", "redis://user:s3cret@localhost:6379")
    resolved = resolve({"INSTANCE_DIR": str(tmp_path)})
    rows = {r["name"]: r["value"] for r in effective(resolved.settings, resolved.sources)}
    assert rows["database_url"] == "postgresql+psycopg://app:***@db.example/rlhf"
    assert rows["ratelimit_storage"] == "redis://user:***@localhost:6379"
    assert "hunter2" not in json.dumps(rows) and "s3cret" not in json.dumps(rows)


def test_docs_configuration_tables_are_generated_from_the_definitions():
    """docs/configuration.md's tables are exactly `flask --app webapp settings --markdown`: they cannot drift."""
    doc = (ROOT / "docs" / "configuration.md").read_text()
    start, end = ("<!-- settings:begin (generated: flask --app webapp settings --markdown) -->\n",
                  "<!-- settings:end -->")
    assert start in doc and end in doc
    assert doc[doc.index(start) + len(start):doc.index(end)] == markdown_tables()
    assert "RLHF_TRAINING_POLICY_LORA_R" in markdown_tables()


def test_invalid_setting_on_the_command_line_is_one_line(tmp_path, monkeypatch):
    from click.testing import CliRunner
    from flask.cli import FlaskGroup

    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(tmp_path))
    monkeypatch.setenv("RLHF_DEVICE", "tpu")
    result = CliRunner().invoke(FlaskGroup(create_app=lambda: create_app()), ["init-db"])
    assert result.exit_code == 1
    assert "Error: RLHF_DEVICE='tpu' (environment) must be auto, cpu, cuda or cuda:N" in result.output
    assert "Traceback" not in result.output
