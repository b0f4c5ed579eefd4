"""The architecture matrix: GPT-2, Phi, Llama (Llama-3's template), Qwen2 (Qwen2.5-Instruct's ChatML)
and GPT-NeoX, end to end through the web app and the CLI.

Each family is a tiny model built here (tests.support.model_families: random weights and a few hundred
corpus steps in its own chat format, so that it ends its answers) with a tokenizer shaped like the
real family's, imported the way an operator does (RLHF_BASE_MODEL=<dir>, `init-model`). Then: users
chatting at once (one batch), compare, regenerate, `rl-train --lora` (PPO; the gate's verdict
recorded; the adapter served on the base's shared weights), promote and roll back through the
admin API, and PPO on all weights, DPO and RLOO on the imported model (rlhf-level, tiny step counts).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.support.app import ApiClient, flask_cli, make_app, sse_events
from tests.support.feedback_factory import seed_feedback
from tests.support.model_families import FAMILIES, SHAPES, build_tiny_model
from tests.support.models import MODEL_CACHE
from tests.support.paths import TESTS

pytestmark = pytest.mark.slow

PASSWORD = "correct horse"
QUESTIONS = ["How do I cook rice?", "Any tips for sleeping better?", "How can I learn to play guitar?",
             "What should I pack for a trip?"]
# rl-train kept tiny: a few reward steps, 16 PPO episodes, a small evaluation; the gate's evidence is
# reported (a tiny model cannot learn) and its safety limits wide, so the verdict is recorded and passes
FAST = {"RLHF_DEVICE": "cpu", "RLHF_PPO_EPISODES": "16", "RLHF_TRAINING_POLICY_BATCH_SIZE": "8",
        "RLHF_TRAINING_POLICY_PPO_EPOCHS": "1", "RLHF_TRAINING_POLICY_RESPONSE_LENGTH": "24",
        "RLHF_TRAINING_REWARD_MIN_STEPS": "4", "RLHF_TRAINING_REWARD_EPOCHS": "1",
        "RLHF_TRAINING_EVALUATION_MAX_PROMPTS": "4", "RLHF_TRAINING_EVALUATION_MAX_NEW_TOKENS": "24",
        "RLHF_TRAINING_EVALUATION_MAX_PAIRS": "16", "RLHF_TRAINING_GATE_EVIDENCE": "reported",
        "RLHF_GATE_MAX_KL": "1000", "RLHF_TRAINING_GATE_MAX_EMPTY_RATE": "1", "RLHF_TRAINING_GATE_MAX_REPETITION": "1",
        "RLHF_TRAINING_GATE_MIN_DISTINCT2_RATIO": "0", "RLHF_MAX_NEW_TOKENS": "40", "RLHF_SCHEDULER": "0"}
TRAIN_STEPS = 200
ATTENTION_AND_MLP = {"gpt2": {"c_attn", "c_fc"}, "phi": {"q_proj", "v_proj", "fc1", "fc2"},
                     "llama": {"q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
                     "qwen2": {"q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
                     "gpt_neox": {"query_key_value", "dense_h_to_4h", "dense_4h_to_h"}}


def family_model(family: str) -> Path:
    """The tiny model of ``family``, built once per version of tests/support/model_families.py (cached)."""
    source = (TESTS / "support" / "model_families.py").read_bytes()
    key = hashlib.sha256(source + str(TRAIN_STEPS).encode()).hexdigest()[:12]
    target = MODEL_CACHE / f"family-{family}-{key}"
    if not (target / "config.json").is_file():
        tmp = MODEL_CACHE / f".tmp-family-{family}-{key}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        build_tiny_model(family, tmp, train_steps=TRAIN_STEPS)
        shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
    return target


def _environment(mp: pytest.MonkeyPatch, family: str, inst: Path) -> None:
    mp.setenv("RLHF_INSTANCE_DIR", str(inst))
    mp.setenv("RLHF_BASE_MODEL", str(family_model(family)))
    for k, v in FAST.items():
        mp.setenv(k, v)


@pytest.fixture(scope="module", params=FAMILIES)
def family_instance(request, tmp_path_factory):
    """An instance whose base version is the family's model, imported through `init-model`."""
    from tests.support.app import SETTING_ENV_KEYS as _ENV_KEYS

    family = request.param
    mp = pytest.MonkeyPatch()
    for key in _ENV_KEYS:
        mp.delenv(key, raising=False)
    inst = tmp_path_factory.mktemp(family) / "instance"
    _environment(mp, family, inst)
    result = flask_cli("init-model")
    mp.undo()
    assert result.exit_code == 0, result.output
    assert "Active model version: v1-base" in result.output
    return family, inst


@pytest.fixture
def imported(family_instance, monkeypatch):
    """The family's instance, named by the environment (each test's environment starts clean)."""
    _environment(monkeypatch, *family_instance)
    return family_instance


def template_tokens(tok) -> set[str]:
    return {t for t in list(tok.all_special_tokens) + list(tok.get_added_vocab()) if t}


def loaded_of(app, name: str):
    from webapp.core.extensions import db
    from webapp.core.models import ModelVersion
    from webapp.serving.routing import model_pool

    with app.app_context():
        path = db.session.scalars(db.select(ModelVersion).filter_by(name=name)).one().location
        return model_pool().get(path, name)


def ask(user: ApiClient, question: str) -> tuple[int, list[tuple[str, dict]]]:
    conv = user.post("/api/conversations", {}).get_json()["id"]
    resp = user.post(f"/api/conversations/{conv}/messages", {"content": question, "stream": True})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return conv, sse_events(resp)


def assert_clean(answer: str, tokens: set[str]) -> None:
    leaked = [t for t in tokens if t in answer]
    assert not leaked, f"template tokens in a stored answer: {leaked} in {answer!r}"
    assert "\nUser:" not in answer and "\nAssistant:" not in answer


def test_import_keeps_the_familys_template_and_end_of_turn(imported):
    from rlhf.models.chat_format import PLAIN_CHAT_TEMPLATE, end_of_turn_id, turn_markers

    family, inst = imported
    app = make_app(inst)
    loaded = loaded_of(app, "v1-base")
    tok, shape = loaded.tokenizer, SHAPES[family]
    assert type(loaded.model.shared.model).__name__ == json.loads((family_model(family) / "family.json").read_text())[
        "architecture"]
    # the model's own template when it has one, the plain one otherwise
    assert tok.chat_template == (shape.chat_template or PLAIN_CHAT_TEMPLATE)
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id and tok.padding_side == "left"
    end = tok.convert_tokens_to_ids(shape.end_of_turn or shape.eos)
    assert end_of_turn_id(tok) == end and end in turn_markers(tok)[1]
    # no trained embedding row was cut off when the pad token was added
    rows = loaded.model.shared.model.get_input_embeddings().weight.shape[0]
    assert rows >= json.loads((family_model(family) / "family.json").read_text())["embedding_rows"]
    if shape.pad:  # Qwen's own pad token is kept
        assert tok.pad_token == shape.pad


def test_chat_batched_compare_and_regenerate(imported):
    from rlhf.generation import batch_stats, batcher_for

    family, inst = imported
    app = make_app(inst)
    users = [ApiClient(app.test_client()) for _ in QUESTIONS]
    ask(users[0], "hello")  # loads the model
    loaded = loaded_of(app, "v1-base")
    tokens = template_tokens(loaded.tokenizer)
    stats, batcher = batch_stats(loaded), batcher_for(loaded)
    prefills = stats.prefills
    results: dict[int, list] = {}

    def chat(i: int) -> None:
        results[i] = ask(users[i], QUESTIONS[i])

    with batcher.held():  # every user's request is in before the worker starts any
        threads = [threading.Thread(target=chat, args=(i,)) for i in range(len(users))]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(batcher._pending) < len(users) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(batcher._pending) == len(users), "not every request reached the batcher"
    for t in threads:
        t.join(120)
    assert stats.prefills == prefills + 1 and stats.max_rows >= len(users)  # one batch for all of them
    finishes = []
    for conv, events in results.values():
        done = dict(events)["done"]
        assert_clean(done["content"], tokens)
        assert "".join(d["text"] for e, d in events if e == "token").strip() == done["content"]
        finishes.append(done["finish_reason"])
    assert set(finishes) <= {"eos", "stop_string", "length"}

    # regenerate and compare
    conv, events = results[0]
    answer_id = dict(events)["done"]["message_id"]
    again = sse_events(users[0].post(f"/api/messages/{answer_id}/regenerate", {"stream": True}))
    assert_clean(dict(again)["done"]["content"], tokens)
    pair = users[1].post(f"/api/conversations/{results[1][0]}/compare", {"content": "And how long does it take?"})
    assert pair.status_code == 201, pair.get_data(as_text=True)
    body = pair.get_json()
    for side in ("a", "b"):
        assert_clean(body[side]["content"], tokens)
    assert users[1].post(f"/api/pairs/{body['pair_id']}/vote", {"winner": "a"}).status_code == 200


def test_an_answer_ends_at_the_familys_end_of_turn_token(imported):
    """Greedy answers of the corpus-trained model stop at its end-of-turn token (Llama-3: <|eot_id|>,
    which is not EOS; Qwen2: <|im_end|>), and the text has none of the template's tokens."""
    from rlhf.generation import GenerationSettings, stream_chat

    family, inst = imported
    loaded = loaded_of(make_app(inst), "v1-base")
    shape = SHAPES[family]
    end = loaded.tokenizer.convert_tokens_to_ids(shape.end_of_turn or shape.eos)
    ended = []
    for question in QUESTIONS:
        handle = stream_chat(loaded, [{"role": "user", "content": question}],
                             GenerationSettings(max_new_tokens=60, do_sample=False))
        text = "".join(handle.chunks)
        assert_clean(text, template_tokens(loaded.tokenizer))
        if handle.result.finish_reason == "eos":
            ended.append(handle._row.ids[-1])
    if shape.chat_template:  # a chat model writes its end-of-turn token (the plain ones may stop at "\nUser:")
        assert ended and set(ended) == {end}, (ended, end)


def test_the_gates_samples_end_at_the_end_of_turn_token(imported):
    """The evaluation gate samples answers as serving does: each ends at EOS or the end-of-turn
    token, and nothing after it is scored or shown."""
    import torch

    from rlhf.models.chat_format import end_ids, render_prompt
    from rlhf.models.loading import load_causal_lm
    from rlhf.models.sampling import sample_answers
    from rlhf.settings import EvalSettings

    family, inst = imported
    model, tok = load_causal_lm(inst / "models" / "v1-base", "cpu")
    prompts = [render_prompt(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    torch.manual_seed(0)
    texts, _, answers = sample_answers(model, tok, prompts * 2, EvalSettings(max_new_tokens=60, temperature=0.8))
    ends = set(end_ids(tok))
    for text, ids in zip(texts, answers):
        assert not ends & set(ids[:-1]), tok.convert_ids_to_tokens(ids)
        assert_clean(text, template_tokens(tok))
    assert any(ids and ids[-1] in ends for ids in answers)


def admin_client(app):
    from webapp.admin.auth import set_admin_password
    from webapp.core.extensions import db

    with app.app_context():
        set_admin_password("root", PASSWORD)
        db.session.commit()
    client = app.test_client()
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/admin/login").get_data(as_text=True)).group(1)
    assert client.post("/admin/login", data={"username": "root", "password": PASSWORD,
                                             "csrf_token": token}).status_code == 302
    return client, {"X-CSRFToken": client.get("/api/session").get_json()["csrf_token"]}  # a new token at sign-in


def test_rl_train_lora_gate_adapter_serving_promote_and_rollback(imported):
    from rlhf.models.adapters import is_adapter
    from webapp.core.extensions import db
    from webapp.core.models import ModelVersion, TrainingRun

    family, inst = imported
    app = make_app(inst)
    seed_feedback(app, 40)
    result = flask_cli("rl-train", "--lora", "--min-feedback", "10", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["policy"]["algorithm"] == "ppo" and out["policy"]["lora"] and out["policy"]["updates"] >= 1
    assert out["evaluation"]["verdict"] == "passed" and out["decision"] == "candidate"
    with app.app_context():
        run = db.session.scalars(db.select(TrainingRun)).one()
        assert run.metrics["evaluation"]["verdict"] == "passed"  # the gate's verdict is recorded
        version = db.session.scalars(db.select(ModelVersion).filter_by(name=out["version"]["name"])).one()
        version_id, path = version.id, version.location
    assert is_adapter(path)
    # LoRA adapts the attention and the MLP projections of every family
    targets = set(json.loads((Path(path) / "adapter_config.json").read_text())["target_modules"])
    assert targets >= ATTENTION_AND_MLP[family], targets

    admin, headers = admin_client(app)
    promoted = admin.post(f"/api/admin/versions/{version_id}/promote", headers=headers)
    assert promoted.status_code == 200 and promoted.get_json()["version"]["status"] == "active"
    user = ApiClient(app.test_client())
    _, events = ask(user, QUESTIONS[0])
    assert_clean(dict(events)["done"]["content"], template_tokens(loaded_of(app, "v1-base").tokenizer))
    assert admin.get("/api/session").get_json()["model_version"] == out["version"]["name"]
    # the adapter is served on the base's loaded weights
    served, base = loaded_of(app, out["version"]["name"]), loaded_of(app, "v1-base")
    assert served.model.adapter is not None and served.model.shared is base.model.shared

    back = admin.post(f"/api/admin/versions/{version_id}/rollback", headers=headers)
    assert back.status_code == 200 and back.get_json()["active"]["name"] == "v1-base"
    assert admin.get("/api/session").get_json()["model_version"] == "v1-base"
    _, events = ask(ApiClient(app.test_client()), QUESTIONS[1])
    assert dict(events)["done"]["content"] is not None
    return_json = admin.get("/api/admin/audit").get_json()["events"]
    assert [e["action"] for e in return_json][:2] == ["rollback", "promote"]


def test_ppo_on_all_weights_dpo_and_rloo(imported, tmp_path):
    from rlhf.generation import GenerationSettings, LoadedModel, generate_chat
    from rlhf.models.loading import load_causal_lm
    from rlhf.policy import train_dpo, train_ppo, train_rloo
    from rlhf.reward.training import train_reward_model
    from rlhf.settings import PolicySettings, RewardSettings

    family, inst = imported
    base = inst / "models" / "v1-base"
    from rlhf.data.corpus import sample_prompts

    # as many prompts as a PPO batch (TRL's dataloader drops an incomplete one: rlhf.data.stage_sizing)
    prompts = [[{"role": "user", "content": q}] for q in sample_prompts(8, seed=3)]
    pairs = [{"prompt": p, "chosen": [{"role": "assistant", "content": "Rinse it, then simmer it for 15 minutes."}],
              "rejected": [{"role": "assistant", "content": "No."}], "margin": 1.0} for p in prompts]
    reward = train_reward_model(base, pairs, pairs[:2], tmp_path / "reward",
                                RewardSettings(max_steps=2, batch_size=4, min_steps=1), device="cpu")
    assert reward["steps"] == 2
    ppo = train_ppo(base, tmp_path / "reward", prompts, tmp_path / "ppo",
                    PolicySettings(episodes=8, batch_size=8, mini_batches=2, ppo_epochs=1, response_length=48),
                    device="cpu")
    assert ppo["updates"] >= 1 and not ppo["lora"]
    if SHAPES[family].chat_template:  # rollouts end at the template's end-of-turn token (Llama-3's is not EOS),
        assert ppo["val/num_eos_tokens"]["last"] > 0  # and PPO counts them as ended: no missing-EOS penalty
    dpo = train_dpo(base, pairs, tmp_path / "dpo", PolicySettings(max_steps=2, batch_size=4), device="cpu")
    assert dpo["steps"] == 2
    rloo = train_rloo(base, tmp_path / "reward", prompts, tmp_path / "rloo",
                      PolicySettings(max_steps=1, batch_size=4, rloo_generations=2, response_length=16), device="cpu")
    assert rloo["steps"] == 1
    for name in ("ppo", "dpo", "rloo"):
        import torch

        model, tok = load_causal_lm(tmp_path / name, "cpu")
        answer = generate_chat(LoadedModel(name, model, tok, torch.device("cpu")), prompts[0],
                               GenerationSettings(max_new_tokens=16, do_sample=False))
        assert_clean(answer.text, template_tokens(tok))


# ---------------------------------------------------------------------------- what cannot work fails at import

def _broken(tmp_path: Path, what: str) -> Path:
    """The GPT-2 family's model with one thing an RLHF loop needs taken away."""
    from transformers import AutoConfig, AutoModelForCausalLM

    out = tmp_path / what
    shutil.copytree(family_model("gpt2"), out)
    if what == "no-eos":
        cfg = json.loads((out / "tokenizer_config.json").read_text())
        for key in ("eos_token", "bos_token", "unk_token"):
            cfg.pop(key, None)
        (out / "tokenizer_config.json").write_text(json.dumps(cfg))
        (out / "special_tokens_map.json").unlink(missing_ok=True)
    elif what == "no-reward-model-class":  # CodeGen has a causal LM but no sequence-classification class
        config = AutoConfig.for_model("codegen", vocab_size=512, n_positions=64, n_embd=32, n_layer=1, n_head=2,
                                      rotary_dim=8)
        for f in ("config.json", "model.safetensors", "generation_config.json"):
            (out / f).unlink(missing_ok=True)
        AutoModelForCausalLM.from_config(config).save_pretrained(out)
    elif what == "no-causal-lm":  # an encoder-decoder: no causal-LM class
        AutoConfig.for_model("t5", vocab_size=512, d_model=32, d_ff=64, num_layers=1, num_heads=2).save_pretrained(out)
    elif what == "broken-template":
        cfg = json.loads((out / "tokenizer_config.json").read_text())
        cfg["chat_template"] = "{{ raise_exception('Conversation roles must alternate system/user') }}"
        (out / "tokenizer_config.json").write_text(json.dumps(cfg))
        (out / "chat_template.jinja").write_text(cfg["chat_template"])
    return out


@pytest.mark.parametrize("what,needle", [
    ("no-eos", "the tokenizer has no EOS token, so generation could never stop"),
    ("no-reward-model-class", "model type 'codegen' has no sequence-classification class "
                              "(AutoModelForSequenceClassification), which this app needs for the reward model"),
    ("no-causal-lm", "model type 't5' has no causal-LM class (AutoModelForCausalLM), which this app needs to "
                     "generate answers"),
    ("broken-template", "its chat template cannot render a user/assistant conversation "
                        "(Conversation roles must alternate system/user)"),
])
def test_what_cannot_work_fails_at_import_with_one_line(tmp_path, monkeypatch, what, needle):
    source = _broken(tmp_path, what)
    inst = tmp_path / "instance"
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(inst))
    monkeypatch.setenv("RLHF_BASE_MODEL", str(source))
    result = flask_cli("init-model")
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert lines == [f"Error: RLHF_BASE_MODEL={str(source)!r} cannot be used: {needle}"], result.output
    assert not [p for p in (inst / "models").iterdir() if not p.name.startswith(".")]  # no version stored
