"""Server settings sized to the active model (webapp.training.model_size): the scheduler's retrain
threshold and the training run's torch threads follow the model's size unless the operator set them."""
from __future__ import annotations

from rlhf.models import size_settings
from tests.support.app import make_app, register_model
from tests.support.feedback_factory import seed_feedback
from webapp.training import jobs
from webapp.training.model_size import active_model_is_large, sized_setting


def test_a_large_active_model_retrains_on_more_feedback_with_every_core(tmp_path, micro_model_dir, monkeypatch):
    """With the threshold lowered so the micro model counts as large, the scheduler waits for
    LARGE_DEPLOYMENT's 150 events (the default is 50) and a run takes every core; a value the operator
    set stays theirs; without an active model nothing is sized."""
    instance = tmp_path / "instance"
    app = make_app(instance)
    with app.app_context():
        assert not active_model_is_large() and sized_setting("retrain_min_feedback") == 50
    register_model(app, micro_model_dir)
    events = seed_feedback(app, 30)
    assert 50 <= events < 150
    with app.app_context():
        assert not active_model_is_large()
        assert sized_setting("retrain_min_feedback") == 50 and sized_setting("train_threads") == 1
        assert sized_setting("inference_threads") == 1  # not a sized setting
    monkeypatch.setattr(size_settings, "LARGE_PARAMETERS", 1)
    with app.app_context():
        assert active_model_is_large()
        assert sized_setting("retrain_min_feedback") == 150 and sized_setting("train_threads") == 0
        skipped = jobs.retrain_tick()
        assert skipped == {"action": "skip", "reason": f"{events} of 150 new feedback events since the last run",
                           "new_events": events, "needed": 150}
    monkeypatch.setenv("RLHF_TRAIN_THREADS", "1")
    chosen = make_app(instance, RLHF_RETRAIN_MIN_FEEDBACK=60)
    with chosen.app_context():
        assert sized_setting("retrain_min_feedback") == 60 and sized_setting("train_threads") == 1
