"""The generated mini-corpus of tests/models/training/ (the ablation runs on it, as `crossprobe train` does)."""

from tests.models.training.conftest import corpus  # noqa: F401  (a fixture, by name)
