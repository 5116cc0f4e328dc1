"""The Python API: ``maxkernel.optimize`` is the engine's one call, loaded only when first used."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_optimize_is_re_exported_lazily_from_the_package() -> None:
    code = ("import sys, maxkernel\n"
            "assert 'orchestrators' not in sys.modules and 'actors' not in sys.modules\n"
            "from orchestrators.api import optimize\n"
            "assert maxkernel.optimize is optimize\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    import maxkernel

    with pytest.raises(AttributeError, match="no attribute 'optimise'"):
        maxkernel.optimise  # noqa: B018


def test_an_unknown_brain_fails_before_anything_starts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import maxkernel

    with pytest.raises(ValueError, match="unknown brain 'gpt'"):
        maxkernel.optimize("12p_RMSNorm", brain="gpt", data_dir=str(tmp_path))
    assert not (tmp_path / "maxkernel.db").exists()
