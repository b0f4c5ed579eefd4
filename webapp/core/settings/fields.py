"""The settings' definitions: every field of :class:`Settings` (type, default, meaning, group, Flask
key, environment variable, allowed values) and the checks of values a range cannot express.
Nothing here reads a source: webapp/core/settings/sources.py does."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from limits import parse_many
from limits.util import SEPARATORS, SINGLE_EXPR

from rlhf.settings import CycleSettings
from webapp.core.metric_catalog import METRIC_NAMES

# The folder of the webapp and rlhf packages: the repository root, or site-packages when installed
# from a wheel (pip install . included). The wheel ships templates/ and static/ inside the webapp
# package (setup.py), and there the instance folder defaults to ./instance of the working directory.
ROOT = Path(__file__).resolve().parents[3]
INSTALLED_FROM_WHEEL = (ROOT / "webapp" / "templates").is_dir()
ASSETS = ROOT / "webapp" if INSTALLED_FROM_WHEEL else ROOT  # the folder holding templates/ and static/


def setting(default: Any, doc: str, group: str, *, key: str | None = None, env: str | None = None,
            secret: bool = False, shown_default: str | None = None, check: Callable[[Any], str | None] | None = None,
            **bounds: Any) -> Any:
    """A field of :class:`Settings`: its Flask config ``key`` and environment variable ``env``
    (both ``RLHF_<NAME>`` unless given), meaning, group, and allowed values (``low``/``high``/
    ``above``/``below``/``choices`` as in rlhf.settings.knob, or a ``check`` returning a problem)."""
    return field(default=default, metadata={"doc": doc, "group": group, "key": key, "env": env, "secret": secret,
                                            "shown_default": shown_default, "check": check, **bounds})


def rate_limit_problem(value: str) -> str | None:
    """Why ``value`` is no usable rate limit, or None. Beyond what ``limits`` parses: it reads
    ``1 per 0 second`` as one per second without a word, and ``0 per minute`` refuses everything."""
    try:
        parse_many(value)
    except ValueError:
        return "is not a rate limit (e.g. '30 per minute' or '30 per minute; 500 per day')"
    for part in SEPARATORS.split(value):
        amount, _, multiples, _ = SINGLE_EXPR.match(part).groups()
        if multiples is not None and int(multiples) == 0:
            return (f"is not a usable rate limit: {part.strip()!r} has a period of 0 (e.g. '1 per second' or "
                    "'10 per 5 seconds')")
        if int(amount) == 0:
            return (f"is not a usable rate limit: {part.strip()!r} allows no request at all (to switch the "
                    "limits off: RLHF_RATELIMIT_ENABLED=0)")
    return None


def _device(value: str) -> str | None:
    if value in ("auto", "cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit()):
        return None
    return "must be auto, cpu, cuda or cuda:N"


def _preset(value: str) -> str | None:
    from rlhf.models.embedded import PRESETS  # the model builder (torch); the app imports it anyway

    return None if value in PRESETS else "must be one of " + ", ".join(PRESETS)


def _existing_file(value: str) -> str | None:
    return None if not value or (ROOT / value).is_file() else "is not a file"  # a relative path: from ROOT


def _not_blank(value: str) -> str | None:
    return "must not be empty" if not value.strip() else None


def _refusal_text(value: str) -> str | None:
    if not value.strip():
        return "must not be empty"
    return "must be at most 500 characters" if len(value) > 500 else None


def _model_name(value: str) -> str | None:
    ok = 0 < len(value) <= 100 and value.strip() == value and "/" not in value and value.isprintable()
    return None if ok else "must be 1-100 printable characters without '/' or surrounding spaces"


def _http_url(value: str) -> str | None:
    ok = value.startswith(("http://", "https://")) and len(value) > 8
    return None if ok else "must be an http:// or https:// URL"


@dataclass(frozen=True)
class Settings:
    # storage
    database_url: str | None = setting(None, "any SQLAlchemy URL; PostgreSQL: `postgresql+psycopg://user:password@"
                                       "host/dbname` (driver `psycopg[binary]`, in the `[dev]` extra)", "Storage",
                                       key="SQLALCHEMY_DATABASE_URI", env="DATABASE_URL", secret=True,
                                       shown_default="`sqlite:///<instance>/rlhf.db`")
    sqlite_busy_timeout_ms: int = setting(15000, "SQLite: how long a write waits for the database lock", "Storage",
                                          key="SQLITE_BUSY_TIMEOUT_MS", low=0)
    secret_key: str | None = setting(None, "cookie signing key", "Storage", key="SECRET_KEY", secret=True,
                                     shown_default="generated once into `<instance>/secret_key` (0600)")
    auto_upgrade: bool = setting(True, "bring the database to the code's schema revision at start-up (the single-"
                                 "process `serve` and the quickstart). Where several processes share one database "
                                 "(gunicorn on `webapp.wsgi:app`, which never upgrades by itself, a separate "
                                 "`flask scheduler`, several hosts) set `0` and run `flask --app webapp db upgrade` "
                                 "once per release: until then requests get a 503 and commands stop with that "
                                 "instruction", "Storage")
    backup_interval_hours: float = setting(0.0, "the scheduler writes a backup (`flask --app webapp backup`) this "
                                           "often; `0`: no scheduled backups", "Storage", low=0.0)
    backup_dir: str = setting("", "folder of the scheduled backups (one subfolder each, named by time)", "Storage",
                              shown_default="`<instance>/backups`")
    backup_keep: int = setting(7, "scheduled backups kept (the oldest are deleted after a new one is complete)",
                               "Storage", low=1)
    # models
    base_model: str = setting("embedded", "`embedded`, a hub id (`gpt2`) or a local model directory", "Models",
                              check=_not_blank)
    embedded_preset: str = setting("default", "`micro` builds a tiny model in a second (tests)", "Models",
                                   check=_preset)
    device: str = setting("auto", "`auto`, `cpu`, `cuda` or `cuda:N` (serving and training)", "Models", check=_device)
    auto_init_model: bool = setting(True, "build the base model on first start when none is active", "Models")
    # generation
    max_new_tokens: int = setting(80, "generation limit per answer", "Generation", low=1, high=4096)
    temperature: float = setting(0.8, "sampling temperature", "Generation", above=0.0, high=5.0)
    top_p: float = setting(0.95, "nucleus sampling: smallest token set with this much probability", "Generation",
                           above=0.0, high=1.0)
    inference_url: str | None = setting(None, "base URL of an OpenAI-compatible inference server (vLLM, or "
                                        "`python -m rlhf.generation.openai_server`) that generates the answers instead "
                                        "of this process, e.g. `http://gpu-box:8000`; each version is requested by its "
                                        "name, LoRA versions are registered there when first served (docs/"
                                        "architecture.md, \"Inference backend (vLLM)\"). None: in-process generation",
                                        "Generation", check=_http_url)
    inference_timeout_seconds: float = setting(120.0, "with `RLHF_INFERENCE_URL`: longest wait for the server's next "
                                               "bytes (the answer fails with an error in the chat after it)",
                                               "Generation", above=0.0)
    inference_api_key: str | None = setting(None, "with `RLHF_INFERENCE_URL`: the bearer token the server requires "
                                            "(vLLM's `--api-key`)", "Generation", secret=True)
    max_message_chars: int = setting(4000, "longest message a user may send, in characters", "Generation", low=1)
    inference_threads: int = setting(1, "torch threads of `serve` for generating answers (0: torch's default, all "
                                     "cores). One thread generates every concurrent answer as one batch; on small "
                                     "models and busy machines one torch thread is much faster than several (on this "
                                     "2-core machine under load, 2 threads made each token about 8x slower); raise it "
                                     "for large models on idle cores", "Generation", low=0)
    # the loop
    scheduler: bool = setting(True, "run the scheduler inside the `serve` process (the learning loop is on by "
                              "default). `serve --workers N>1` refuses it with a clear error: set `0` there and run "
                              "`flask --app webapp scheduler` once, as its own process. Only one scheduler runs per "
                              "instance (`scheduler.lock`)", "Scheduler")
    retrain_interval_seconds: float = setting(3600.0, "how often the retrain job looks for new feedback", "Scheduler",
                                              above=0.0)
    retrain_min_feedback: int = setting(50, "new feedback events a scheduled retrain needs (when not set: 150 while "
                                        "the active model has 50 M parameters or more, whose cycle takes minutes)",
                                        "Scheduler", low=0)
    retrain_during_experiment: bool = setting(False, "the retrain job also starts runs while an experiment is "
                                              "running. Off: it waits for the verdict (at most "
                                              "`RLHF_EXPERIMENT_MAX_HOURS`), so that the next candidate grows from "
                                              "the winner, the experiment's answers are not slowed by training, and "
                                              "its own ratings count towards the next run", "Scheduler")
    train_threads: int = setting(1, "torch threads of `rl-train` (0: torch's default, all cores). One by default: on "
                                 "a small machine shared with the web server, torch's threads spin-wait for each "
                                 "other under load (when not set: 0 while the active model has 50 M parameters or "
                                 "more, whose cycle is minutes of large matrix products)", "Scheduler", low=0)
    train_processes: int = setting(1, "processes a training run started by the scheduler or the admin's train-now "
                                   "uses: above 1, `rl-train` runs under `accelerate launch --num_processes N` "
                                   "(data parallel; one process per GPU, or gloo on CPUs; see [Training on several "
                                   "processes](training.md#training-on-several-processes-or-gpus))", "Scheduler", low=1)
    accelerate_config: str = setting("", "accelerate config file for such runs (e.g. `rlhf/launch/"
                                     "deepspeed_zero2.yaml`; relative to the repository root); empty: the bundled "
                                     "data-parallel config for the device, `rlhf/launch/multi_gpu.yaml` or "
                                     "`multi_cpu.yaml`", "Scheduler",
                                     shown_default="empty", check=_existing_file)
    tensorboard: bool = setting(False, "trainers also write TensorBoard event files to `<instance>/runs/run-<id>/"
                                "tensorboard/{reward,policy}` (`tensorboard --logdir instance/runs`). Needs the "
                                "`tensorboard` package (`pip install -e '.[tensorboard]'`, also in `[dev]`); without "
                                "it a run is refused with a one-line error", "Scheduler")
    run_stall_seconds: float = setting(600.0, "the watchdog stops a run that reports no progress for this long",
                                       "Scheduler", above=0.0)
    run_max_seconds: float = setting(0.0, "the watchdog stops a run that takes longer (0: worked out from the data "
                                     "size: 30 min + 2 s per unit of work, scaled up for models over 10 M "
                                     "parameters)", "Scheduler", low=0.0)
    watchdog_interval_seconds: float = setting(30.0, "how often the scheduler's watchdog job looks at running runs",
                                               "Scheduler", above=0.0)
    monitor_interval_seconds: float = setting(60.0, "how often the experiment monitor looks", "Scheduler", above=0.0)
    housekeeping_interval_seconds: float = setting(3600.0, "how often housekeeping runs", "Scheduler", above=0.0)
    retain_retired_versions: int = setting(3, "retired versions kept on disk (older ones are pruned)", "Scheduler",
                                           low=0)
    # experiments
    primary_metric: str = setting("thumbs_up_rate", "the metric the promotion policy decides on", "Experiments",
                                  choices=METRIC_NAMES)
    promote_alpha: float = setting(0.05, "significance level of the promotion policy", "Experiments",
                                   above=0.0, below=0.5)
    sequential_tuning: float = setting(500.0, "GrowthBook's sequential tuning parameter: the number of users (both "
                                       "arms) at which the always-valid confidence sequence is narrowest; it stays "
                                       "valid at every other size, only wider. 500: near the size this app's "
                                       "experiments reach (GrowthBook's default, 5000, found +10 points in 25 % "
                                       "of simulated experiments of ~490 users, 500 in 65 %)", "Experiments",
                                       above=0.0)
    experiment_max_hours: float = setting(72.0, "an experiment without a significant result by then keeps the "
                                          "control", "Experiments", above=0.0)
    experiment_split: float = setting(0.5, "variant share of automatically started experiments", "Experiments",
                                      above=0.0, below=1.0)
    ab_user_cap: float = setting(1.0, "most weight one user has in an A/B metric: a user's thumbs, ratings, votes, "
                                 "... are scaled to count as at most this many observations (1: every user is one "
                                 "unit however much they rate, so no heavy user or script steers a verdict; 0: no "
                                 "cap, every observation counts)", "Experiments", low=0.0)
    guardrail_alpha: float = setting(0.01, "level of the guardrails' sequential non-inferiority test: a variant truly "
                                     "worse by a typical effect (5 points, a quarter star) on thumbs, rating, "
                                     "compare votes or flagged answers is promoted with at most this probability, "
                                     "however often the monitor looks", "Experiments", above=0.0, below=0.5)
    ab_min_sample: int = setting(30, "users with data per arm before a metric is judged", "Experiments", low=1)
    compare_rate: float = setting(0.1, "share of questions answered side by side while an experiment runs",
                                  "Experiments", low=0.0, high=1.0)
    # rate limits
    login_rate_limit: str = setting("10 per minute", "admin sign-in attempts for one username (however it is "
                                    "written: case, surrounding spaces) from one client address. Never counted "
                                    "across addresses, so wrong passwords from elsewhere cannot lock an admin out",
                                    "Rate limits", check=rate_limit_problem)
    login_rate_limit_per_address: str = setting("30 per minute", "admin sign-in attempts from one client address, "
                                                "whatever the username", "Rate limits", check=rate_limit_problem)
    chat_rate_limit: str = setting("30 per minute", "questions per user: posting a message, regenerate and compare "
                                   "share it", "Rate limits", check=rate_limit_problem)
    chat_rate_limit_per_address: str = setting("600 per minute", "the same, per client address (high: many users "
                                               "can share one address)", "Rate limits", check=rate_limit_problem)
    feedback_rate_limit: str = setting("120 per minute", "feedback and compare votes per user", "Rate limits",
                                       check=rate_limit_problem)
    feedback_rate_limit_per_address: str = setting("2400 per minute", "the same, per client address", "Rate limits",
                                                   check=rate_limit_problem)
    ratelimit_enabled: bool = setting(True, "`0` switches every rate limit off (load tests, benchmarks)",
                                      "Rate limits", key="RATELIMIT_ENABLED")
    ratelimit_storage: str = setting("memory://", "rate-limit storage (e.g. `redis://...` with several workers)",
                                     "Rate limits", key="RATELIMIT_STORAGE_URI", secret=True)
    # cookies
    cookie_secure: bool = setting(False, "mark the session cookie Secure and send HSTS (`Strict-Transport-Security: "
                                  "max-age=31536000`): set it to `1` whenever the app is served over HTTPS (the "
                                  "default run is plain http on localhost, where a Secure cookie would never be sent "
                                  "back). The cookie is always HttpOnly and SameSite=Lax", "Cookies",
                                  key="SESSION_COOKIE_SECURE")
    # sessions, requests
    admin_session_idle_hours: float = setting(12.0, "an admin's session ends after this many hours without a request "
                                              "(sign in again)", "Sessions", above=0.0)
    admin_session_max_hours: float = setting(168.0, "an admin's session ends this many hours after signing in, "
                                             "however active (168: a week)", "Sessions", above=0.0)
    max_request_mb: float = setting(1.0, "largest request body, in MiB; a larger one is refused with 413 before it is "
                                    "read", "Requests", above=0.0, high=1024.0)
    # feedback integrity: new anonymous identities per address, end-user accounts, the client address
    new_identities_per_hour: int = setting(30, "new anonymous identities (cookies) one client address may create "
                                           "per hour; beyond it the API answers 429 (sign in, or try later). "
                                           "Existing identities and signed-in users are never affected. A household "
                                           "or office behind one address stays far below it; `0`: no limit. Off "
                                           "with `RLHF_RATELIMIT_ENABLED=0`", "Feedback integrity", low=0)
    account_rate_limit: str = setting("10 per minute", "end users' sign-in, registration and password-change "
                                      "attempts per client address, and per username from one address (never "
                                      "across addresses, as for admins)", "Feedback integrity",
                                      check=rate_limit_problem)
    trusted_proxies: int = setting(0, "reverse proxies in front of the app whose `X-Forwarded-For` and "
                                   "`X-Forwarded-Proto` are believed (werkzeug's ProxyFix). `0`: the client address "
                                   "is the connection's. Behind a proxy set it to the number of proxies, or every "
                                   "visitor has the proxy's address (one identity limit and one per-address rate "
                                   "limit for all); never set it without a proxy, or clients can forge their "
                                   "address with `X-Forwarded-For`", "Feedback integrity", low=0, high=10)
    # safety: the output rail that checks every answer before it is shown
    rail_enabled: bool = setting(True, "the output rail: every answer (streamed, regenerated, compared) is checked "
                                 "before it is shown, against the blocked phrases and patterns and the personal-data "
                                 "presets of the admin's Safety page, and the served version's cost head when it has "
                                 "one; unsafe text is never sent. `0`: answers are shown unchecked", "Safety")
    rail_action: str = setting("refuse", "what a blocked answer becomes: `refuse` (the refusal text at once; cheap "
                               "and predictable) or `regenerate` (new answers are sampled, up to "
                               "`RLHF_RAIL_REGENERATE_ATTEMPTS`, then the refusal)", "Safety",
                               choices=("refuse", "regenerate"))
    rail_refusal_text: str = setting("Sorry, I can't share that answer.", "the answer shown (and stored) in place of "
                                     "a blocked one", "Safety", check=_refusal_text)
    rail_cost_threshold: float = setting(0.9, "the cost head's flag probability at which an answer is blocked "
                                         "(versions whose reward model has criterion heads; others are checked by "
                                         "the rules only)", "Safety", above=0.0, high=1.0)
    rail_regenerate_attempts: int = setting(2, "with `RLHF_RAIL_ACTION=regenerate`: new answers sampled before "
                                            "refusing", "Safety", low=1, high=5)
    # Open WebUI: its users' ratings pulled into the loop (docs/integrations/open-webui.md)
    openwebui_url: str | None = setting(None, "base URL of an Open WebUI whose users chat with this app over `/v1` "
                                        "(e.g. `http://openwebui:8080`): the scheduler pulls its feedback export "
                                        "(`/api/v1/evaluations/feedbacks/all/export`) every "
                                        "`RLHF_OPENWEBUI_PULL_INTERVAL_SECONDS` and imports the ratings as "
                                        "`flask --app webapp import-feedback --format open-webui` does. None: no pull",
                                        "Open WebUI", check=_http_url)
    openwebui_api_key: str | None = setting(None, "with `RLHF_OPENWEBUI_URL`: an Open WebUI admin's API key (the "
                                            "export is admin-only), sent as `Authorization: Bearer`", "Open WebUI",
                                            secret=True)
    openwebui_pull_interval_seconds: float = setting(900.0, "with `RLHF_OPENWEBUI_URL`: how often the scheduler "
                                                     "pulls the export (a pull that finds nothing new writes "
                                                     "nothing)", "Open WebUI", above=0.0)
    # the OpenAI-compatible API (/v1)
    api_model_name: str = setting("rlhf-chat", "the model name the `/v1` API lists and answers as (`GET /v1/models`); "
                                  "whichever version or A/B arm serves a request, this is the name clients see",
                                  "API", check=_model_name)
    api_rate_limit: str = setting("600 per minute", "`/v1` requests per API key (models, completions and feedback "
                                  "share it), unless the key has a limit of its own", "API", check=rate_limit_problem)
    api_max_messages: int = setting(200, "most messages one `/v1` chat completion may carry (its history "
                                    "included); more is a 400 (`array_above_max_length`). Every message of a new "
                                    "history is stored, so this bounds the rows one request writes", "API", low=1,
                                    high=100_000)
    api_max_history_chars: int = setting(200_000, "most characters all messages of one `/v1` chat completion may "
                                         "hold together; more is a 400 (`context_length_exceeded`)", "API", low=1)
    # training: the rlhf dataclasses themselves (device comes from the app's device above)
    training: CycleSettings = field(default_factory=CycleSettings)
