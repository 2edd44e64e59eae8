"""docs/learning.py: the example that fits a substitution matrix, the gap and the temperature through the
op on real sequences must keep working, and its plot must be written only where matplotlib is."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

LEARNING = Path(__file__).resolve().parent.parent / "docs" / "learning.py"


@pytest.fixture(scope="module")
def learning():
    """docs/ is not a package, so the script is imported by path."""
    spec = importlib.util.spec_from_file_location("docs_learning", LEARNING)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def result(learning):
    # 150 steps take about 6 s once the CPU engine is built. Seed 0 reaches a loss ratio of ~1e-3, a gap
    # of -3.7 (teacher -4), a temperature of 1.35 (teacher 1, from 3) and a correlation of 0.8 with
    # BLOSUM62 (from 0 at a matrix of zeros); the bounds leave room for rounding, not for a broken gradient.
    return learning.fit(steps=150, seed=0)


def test_fit_learns_matrix_gap_and_temperature(learning, result):
    history = result["history"]
    assert len(history["loss"]) == len(history["gap"]) == len(history["temperature"]) == 151
    assert history["loss"][-1] < 0.01 * history["loss"][0]
    assert abs(result["gap"] - learning.TEACHER_GAP) < 0.7  # from -1
    assert abs(result["temperature"] - learning.TEACHER_TEMPERATURE) < 0.6  # from 3
    matrix = result["matrix"]
    assert (matrix - matrix.T).abs().max().item() == 0  # symmetric by construction
    assert learning.correlation(matrix, result["teacher_matrix"]) > 0.7


def test_plot_only_with_matplotlib(learning, result, tmp_path):
    path = tmp_path / "learning.png"
    written = learning.plot(result, str(path))
    if importlib.util.find_spec("matplotlib") is None:
        assert written is False and not path.exists()
    else:
        assert written is True and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
