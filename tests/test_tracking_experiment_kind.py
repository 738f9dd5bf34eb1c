"""kernelcamp.tracking.ensure_store tags the experiment as a training experiment (MLflow's experiment
kind ``custom_model_development``), so MLflow 3's UI opens it on the runs table rather than the GenAI
overview; also an experiment created before kernelcamp set the tag. A kind someone chose is kept."""

import pytest
from mlflow.tracking import MlflowClient

from kernelcamp import tracking

KIND = "mlflow.experimentKind"  # the experiment tag MLflow's UI reads (ExperimentKind in its JS)
TRAINING = "custom_model_development"  # ExperimentKind.CUSTOM_MODEL_DEVELOPMENT: "Machine learning"


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A fresh SQLite store in tmp_path, found the way stages find it ($DVC_ROOT)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_a_new_experiment_is_a_training_experiment(store):
    uri, exp_id = tracking.ensure_store({"tracking": {"experiment": "fresh"}})
    assert uri == store
    assert MlflowClient(uri).get_experiment(exp_id).tags.get(KIND) == TRAINING


def test_an_existing_experiment_gets_the_tag_and_a_chosen_kind_stays(store):
    client = MlflowClient(store)  # a store from before: experiments without the tag
    old = client.create_experiment("old")
    chosen = client.create_experiment("chosen", tags={KIND: "genai_development"})

    assert tracking.ensure_store({"tracking": {"experiment": "old"}}) == (store, old)
    assert client.get_experiment(old).tags.get(KIND) == TRAINING
    assert tracking.ensure_store({"tracking": {"experiment": "chosen"}}) == (store, chosen)
    assert client.get_experiment(chosen).tags.get(KIND) == "genai_development"
