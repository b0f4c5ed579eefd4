"""LoRA adapter versions (rlhf.models.adapters): stored as adapters, served on the base's shared weights."""
from __future__ import annotations

import json
import shutil
import threading

import pytest
import torch

from rlhf.generation import GenerationSettings, LoadedModel, ModelPool, generate_chat
from rlhf.models import registry
from rlhf.models.adapters import adapter_bytes, base_of, is_adapter
from rlhf.models.loading import ModelLoadError, load_causal_lm
from rlhf.policy.common import lora_config, save_policy
from rlhf.settings import PolicySettings

GREEDY = GenerationSettings(do_sample=False, max_new_tokens=16)
QUESTIONS = [[{"role": "user", "content": q}] for q in
             ("How do I cook rice?", "What should I read next?", "Fix my bike chain", "hi")]


def make_adapter_version(store, base_path, seed: int, scale: float = 0.5):
    """A LoRA version on ``base_path`` with random, non-trivial weights, saved the way training
    saves one (``save_policy``) and registered in the store with its lineage."""
    from peft import get_peft_model

    torch.manual_seed(seed)
    model, tok = load_causal_lm(base_path, "cpu")
    cfg = lora_config(model, PolicySettings(lora=True, lora_r=4))
    peft_model = get_peft_model(model, cfg)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.normal_(0, scale)
    name, path, _ = registry.write_version(
        store, "ppo", lambda tmp: save_policy(peft_model, tok, tmp, base_path, PolicySettings(lora=True)),
        lineage={"parent": base_path.name})
    return path


@pytest.fixture(scope="module")
def store(micro_model_dir, tmp_path_factory):
    store = tmp_path_factory.mktemp("adapters") / "models"
    _, base, _ = registry.write_version(store, "base", lambda tmp: shutil.copytree(micro_model_dir, tmp,
                                                                                   dirs_exist_ok=True) and None,
                                        name="v1-base")
    return {"base": base, "a": make_adapter_version(store, base, 1), "b": make_adapter_version(store, base, 2)}


def logits(loaded_or_model, tok, text="User: How do I cook rice?\nAssistant:"):
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    model = loaded_or_model.model if isinstance(loaded_or_model, LoadedModel) else loaded_or_model
    with torch.inference_mode():
        return model(input_ids=ids).logits[0, -1]


def answers(loaded):
    return [generate_chat(loaded, q, GREEDY).text for q in QUESTIONS]


def test_an_adapter_version_is_the_adapter_and_names_its_base(store):
    path = store["a"]
    assert is_adapter(path) and registry.is_complete(path)
    assert not (path / "config.json").exists() and not (path / "model.safetensors").exists()
    lineage = json.loads((path / "version.json").read_text())
    assert lineage["parent"] == "v1-base"
    assert lineage["adapter"] == {"base": "v1-base", "base_path": str(store["base"].resolve())}
    assert base_of(path) == store["base"]
    assert adapter_bytes(path) < (store["base"] / "model.safetensors").stat().st_size / 4


def test_the_base_is_found_next_to_the_adapter_when_the_store_moved(store, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(store["base"].parent, moved)
    assert base_of(moved / store["a"].name) == moved / "v1-base"


def base_weights(loaded):
    return {p.data_ptr() for n, p in loaded.model.named_parameters() if "lora_" not in n}


def test_pool_serves_adapters_on_the_base_weights_without_copying_them(store):
    pool = ModelPool("cpu")
    variant = pool.get(store["a"], "v2")  # loads its base too
    base = pool.get(store["base"], "v1")
    assert pool.loaded() == [str(store["base"]), str(store["a"])]
    assert variant.model.shared is base.model.shared and variant.model.adapter and base.model.adapter is None
    weights = base_weights(base)
    other = pool.get(store["b"], "v3")
    assert other.model.shared is base.model.shared and other.model.adapter != variant.model.adapter
    assert base_weights(base) == weights == base_weights(other)  # the same tensors, not copies
    assert variant.tokenizer is base.tokenizer


def test_loading_the_base_first_then_its_adapter_shares_it(store):
    pool = ModelPool("cpu")
    base = pool.get(store["base"])
    weights = base_weights(base)
    assert pool.get(store["a"]).model.shared is base.model.shared and base_weights(base) == weights


def test_adapter_answers_differ_and_the_base_answers_are_unaffected(store):
    pool = ModelPool("cpu")
    base = pool.get(store["base"])
    base_logits, base_answers = logits(base, base.tokenizer), answers(base)
    a, b = pool.get(store["a"]), pool.get(store["b"])
    # the base model's answers are exactly what they were before any adapter was attached
    assert torch.equal(logits(base, base.tokenizer), base_logits)
    assert answers(base) == base_answers
    # each adapter version answers like its merged model (what a full-copy version would say) ...
    for loaded, path in ((a, store["a"]), (b, store["b"])):
        merged, _ = load_causal_lm(path, "cpu")
        assert torch.allclose(logits(loaded, base.tokenizer), logits(merged, base.tokenizer), atol=1e-4)
        assert answers(loaded) == answers(LoadedModel("merged", merged, base.tokenizer, torch.device("cpu")))
    # ... which is not the base's
    assert not torch.allclose(logits(a, base.tokenizer), base_logits, atol=1e-2)
    assert answers(a) != base_answers and answers(b) != base_answers and answers(a) != answers(b)
    # calling the shared model without a view is the base model too
    assert torch.equal(logits(base.model.shared.model, base.tokenizer), base_logits)


def test_control_and_variants_answer_concurrently(store):
    pool = ModelPool("cpu")
    loaded = {k: pool.get(store[k]) for k in ("base", "a", "b")}
    expected = {k: answers(m) for k, m in loaded.items()}
    got: dict[str, list] = {}
    errors: list[BaseException] = []

    def ask(key: str, slot: str) -> None:
        try:
            got[slot] = [answers(loaded[key]) for _ in range(3)]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(k, f"{k}{i}")) for i in range(2) for k in ("base", "a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors
    for slot, runs in got.items():
        assert all(r == expected[slot[:-1]] for r in runs), slot


def test_attaching_an_adapter_while_the_base_answers(store, tmp_path):
    """Loading a variant waits for forward passes in flight and never changes the base's answers."""
    pool = ModelPool("cpu")
    base = pool.get(store["base"])
    expected = answers(base)
    stop, seen = threading.Event(), []

    def keep_asking() -> None:
        while not stop.is_set():
            seen.append(answers(base))

    t = threading.Thread(target=keep_asking)
    t.start()
    try:
        pool.get(store["a"])
        pool.get(store["b"])
    finally:
        stop.set()
        t.join(300)
    assert seen and all(s == expected for s in seen)


def test_an_adapter_without_its_base_cannot_be_loaded(store, tmp_path):
    lonely = tmp_path / "models"
    shutil.copytree(store["a"], lonely / store["a"].name)
    (lonely / store["a"].name / "version.json").write_text(json.dumps({"adapter": {"base": "v1-base"}}))
    cfg = json.loads((lonely / store["a"].name / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(tmp_path / "gone")
    (lonely / store["a"].name / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="missing"):
        ModelPool("cpu").get(lonely / store["a"].name)
    with pytest.raises(ModelLoadError):
        load_causal_lm(lonely / store["a"].name, "cpu")


def test_merged_full_versions_still_load_as_plain_models(store, tmp_path):
    merged, tok = load_causal_lm(store["a"], "cpu")
    merged.save_pretrained(tmp_path / "full")
    tok.save_pretrained(tmp_path / "full")
    assert not is_adapter(tmp_path / "full")
    pool = ModelPool("cpu")
    full, base = pool.get(tmp_path / "full"), pool.get(store["base"])
    assert full.model.shared is not base.model.shared  # its own weights
    assert answers(full) == answers(pool.get(store["a"]))


def test_pruning_keeps_the_base_of_a_kept_adapter_version(tmp_path, micro_model_dir):
    from tests.support.app import make_app, register_model
    from webapp.core.extensions import db
    from webapp.core.models import ModelVersion
    from webapp.training import jobs

    app = make_app(tmp_path / "instance", RLHF_RETAIN_RETIRED_VERSIONS=0)
    register_model(app, micro_model_dir, name="v1-base", status="retired")
    register_model(app, micro_model_dir, name="v2-base", status="active")
    store = tmp_path / "instance" / "models"
    path = make_adapter_version(store, store / "v1-base", 3)
    with app.app_context():
        db.session.add(ModelVersion(name=path.name, path=str(path), kind="ppo", status="candidate",
                                    parent_id=1))
        db.session.commit()
        assert jobs.prune_retired_versions(0) == []  # v1-base carries the candidate
        db.session.get(ModelVersion, 3).status = "retired"
        db.session.commit()
        assert sorted(jobs.prune_retired_versions(0)) == ["v1-base", path.name]


@pytest.mark.slow
def test_rl_train_with_lora_registers_an_adapter_version_that_serves(tmp_path, micro_model_dir, monkeypatch):
    from click.testing import CliRunner
    from flask.cli import FlaskGroup

    from tests.support.app import make_app, register_model
    from tests.support.feedback_factory import seed_feedback
    from webapp import create_app

    inst = tmp_path / "instance"
    app = make_app(inst)
    register_model(app, micro_model_dir)
    seed_feedback(app, 40)
    for k, v in {"RLHF_INSTANCE_DIR": str(inst), "RLHF_DEVICE": "cpu", "RLHF_PPO_EPISODES": "32",
                 "RLHF_POLICY_LR": "1e-3"}.items():
        monkeypatch.setenv(k, v)

    def rl_train():
        result = CliRunner().invoke(FlaskGroup(create_app=lambda: create_app()),
                                    ["rl-train", "--min-feedback", "10", "--lora", "--max-steps", "2", "--json"])
        assert result.exit_code in (0, 3), result.output
        return json.loads(result.stdout)

    out = rl_train()
    path = inst / "models" / out["version"]["name"]
    assert is_adapter(path) and registry.is_complete(path)
    assert json.loads((path / "version.json").read_text())["adapter"]["base"] == "v1-base"
    pool = ModelPool("cpu")
    assert pool.get(path).model.shared is pool.get(inst / "models" / "v1-base").model.shared
    answers(pool.get(path))

    # a LoRA run on top of an adapter version trains on the merged parent and saves a full model
    from webapp.core.extensions import db
    from webapp.core.models import ModelVersion

    with app.app_context():
        for v in db.session.scalars(db.select(ModelVersion)):
            v.status = "active" if v.name == out["version"]["name"] else "retired"
        db.session.commit()
    again = rl_train()
    second = inst / "models" / again["version"]["name"]
    assert again["version"]["parent"] == out["version"]["name"]
    assert (second / "config.json").is_file() and not is_adapter(second)
