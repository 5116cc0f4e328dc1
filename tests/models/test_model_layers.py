"""The model layers: a category of their own, each a sound task, none among the suite's 50."""

from __future__ import annotations

import pytest

from jaxbench.task import list_models, list_tasks, load_task
from jaxbench.task_check import check_task

LAYERS = [t.id for t in list_models()]


def test_six_layers_ship_apart_from_the_fifty():
    assert set(LAYERS) >= {"llama31_8b_decoder", "mixtral_8x7b_moe", "deepseek_v3_layer", "gemma2_9b_layer",
                           "qwen3_moe_layer", "mamba2_block"}
    suite = [t.id for t in list_tasks()]
    assert len(suite) == 50 and not set(suite) & set(LAYERS)
    for layer in list_models():
        assert layer.spec.category == "model" and layer.spec.source, layer.id


@pytest.mark.parametrize("layer_id", LAYERS)
@pytest.mark.slow
def test_layer_passes_task_check(layer_id):
    check = check_task(load_task(layer_id), timing=False)
    assert check.ok, check.problems


def test_tasks_models_lists_the_layers_and_extract_refuses_a_bad_task(tmp_path):
    import subprocess
    import sys

    env = {**__import__("os").environ, "COLUMNS": "250"}
    listed = subprocess.run([sys.executable, "-m", "maxkernel.cli", "tasks", "--models"], capture_output=True,
                            text=True, env=env, timeout=120)
    assert listed.returncode == 0 and "mamba2_block" in listed.stdout and "12p_RMSNorm" not in listed.stdout
    bad = subprocess.run([sys.executable, "-m", "maxkernel.cli", "extract", str(tmp_path / "nope")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "no such suite task or task folder" in bad.stderr
