"""Target names and TPU generation specs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from maxkernel.targets import GENERATIONS, TargetError, TpuSpec, load_tpu_spec, load_tpu_specs, parse_target
from maxkernel.targets.specs import TARGETS_FILE


@pytest.mark.parametrize(
    ("name", "expected"),
    [("cpu", ("cpu", None)), ("gpu", ("gpu", None)), ("tpu-v4", ("tpu", "v4")), ("tpu-v5e", ("tpu", "v5e")),
     ("tpu-v5p", ("tpu", "v5p")), ("tpu-v6e", ("tpu", "v6e")), ("tpu-v7", ("tpu", "v7")),
     (" TPU-V5E ", ("tpu", "v5e"))],
)
def test_parse_target_accepts_known_targets(name: str, expected: tuple[str, str | None]) -> None:
    assert parse_target(name) == expected


@pytest.mark.parametrize("name", ["tpu", "tpu-v9", "v5e", "tpu-v5", "cuda", "", "tpu-v5e-8"])
def test_parse_target_rejects_others_in_one_line(name: str) -> None:
    with pytest.raises(TargetError) as info:
        parse_target(name)
    message = str(info.value)
    assert "\n" not in message
    assert repr(name) in message and "tpu-v6e" in message


def test_spec_names_with_or_without_prefix_are_the_same_spec() -> None:
    assert load_tpu_spec("v5e") is load_tpu_spec("tpu-v5e")
    with pytest.raises(TargetError, match="unknown TPU generation"):
        load_tpu_spec("v3")


def test_every_generation_has_a_sane_spec() -> None:
    specs = load_tpu_specs()
    assert sorted(specs) == sorted(GENERATIONS)
    for name, spec in specs.items():
        assert spec.name == name and spec.target == f"tpu-{name}"
        assert spec.peak_f32_flops < spec.peak_bf16_flops <= spec.peak_int8_ops
        assert spec.eup_ops <= spec.vpu_ops < spec.peak_bf16_flops  # the fit holds the EUP at most the VPU rate
        assert spec.scoped_vmem_bytes <= spec.vmem_bytes
        assert spec.mxu_shape[0] in (128, 256) and spec.mxu_shape[0] == spec.mxu_shape[1]
        assert 0 < spec.step_overhead_s < 1e-5


def test_published_figures_are_the_cloud_docs_ones() -> None:
    v5e, v6e, v5p = load_tpu_spec("v5e"), load_tpu_spec("v6e"), load_tpu_spec("v5p")
    assert (v5e.peak_bf16_flops, v5e.hbm_bandwidth, v5e.cores_per_chip) == (197e12, 819e9, 1)
    assert (v6e.peak_bf16_flops, v6e.hbm_bandwidth, v6e.mxu_shape) == (918e12, 1640e9, (256, 256))
    assert v5p.per_core(v5p.peak_bf16_flops) == pytest.approx(229.5e12)  # two TensorCores share the chip


def test_vmem_budget_uses_the_kernel_limit_capped_at_physical_vmem() -> None:
    v5e = load_tpu_spec("v5e")
    assert v5e.vmem_budget(None) == 16 * 2**20
    assert v5e.vmem_budget(100 * 2**20) == 100 * 2**20
    assert v5e.vmem_budget(1 << 40) == v5e.vmem_bytes


def _write_specs(tmp_path: Path, edit: dict) -> Path:
    raw = yaml.safe_load(TARGETS_FILE.read_text())
    raw.update(edit)
    path = tmp_path / "targets.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_bad_spec_file_is_one_clear_error(tmp_path: Path) -> None:
    raw = yaml.safe_load(TARGETS_FILE.read_text())
    broken = dict(raw["v5e"], hbm_bandwidth=-1)
    with pytest.raises(TargetError, match=r"targets.yaml: v5e.hbm_bandwidth"):
        load_tpu_specs(_write_specs(tmp_path, {"v5e": broken}))
    missing = tmp_path / "missing.yaml"
    missing.write_text(yaml.safe_dump({k: v for k, v in raw.items() if k != "v7"}))
    with pytest.raises(TargetError, match="differ from"):
        load_tpu_specs(missing)


def test_spec_model_rejects_inconsistent_cores() -> None:
    values = dict(yaml.safe_load(TARGETS_FILE.read_text())["v5e"], name="x", cores_per_device=2)
    with pytest.raises(ValueError, match="cores_per_device"):
        TpuSpec.model_validate(values)


def test_parsing_a_target_does_not_import_jax() -> None:
    """The CLI parses --target before any work: that must stay cheap."""
    code = ("import sys; from maxkernel.targets import parse_target, load_tpu_spec; "
            "parse_target('tpu-v5e'); load_tpu_spec('v5e'); assert 'jax' not in sys.modules, 'jax imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
