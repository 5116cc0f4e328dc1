"""The probe for the optional CUDA plugin answers on any machine, with or without the plugin installed."""

from __future__ import annotations

import pytest


def test_no_plugin_namespace_means_no_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine that never had the CUDA plugin lacks even its namespace package: that reads as absent,
    not as an error while the GPU tests are collected."""
    import maxkernel.targets.gpu_lowering as lowering

    monkeypatch.setattr(lowering, "PLUGIN_MODULE", "maxkernel_no_such_namespace.xla_cuda12")
    assert lowering.plugin_available() is False
