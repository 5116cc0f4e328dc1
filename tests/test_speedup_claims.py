"""Claims carry their noise: the bootstrap interval of a speedup, the words it allows, and ranking by its
lower end so that a noisy lucky reading never wins over a steady one."""

from __future__ import annotations

import numpy as np
import pytest

from actors import policy
from jaxbench.report import EvalReport, format_interval, format_speedup
from jaxbench.timing import speedup_interval


def _report(speedup: float, ci: tuple[float, float] | None, basis: str = "measured") -> EvalReport:
    return EvalReport(task="t", status="ok", correct=True, speedup=speedup, speedup_ci=ci, basis=basis)  # type: ignore[arg-type]


def test_the_interval_covers_one_for_equal_sides_and_clears_it_for_a_real_gain() -> None:
    rng = np.random.default_rng(7)
    ref = list(1.0 + 0.1 * rng.standard_normal(10))
    same = list(1.0 + 0.1 * rng.standard_normal(10))
    low, high = speedup_interval(ref, same)
    assert low < 1.0 < high
    half = [t / 2.0 for t in same]  # the candidate takes half the time, with the same noise
    low2, high2 = speedup_interval(ref, half)
    assert 1.5 < low2 < 2.0 < high2 < 2.6
    assert speedup_interval(ref, half) == (low2, high2)  # the same timings give the same interval
    noisy = list(np.asarray(half) * np.exp(1.0 * rng.standard_normal(10)))
    wide = speedup_interval(ref, noisy)
    assert wide[1] - wide[0] > 2 * (high2 - low2)  # more noise, a wider interval
    with pytest.raises(ValueError, match="paired rounds"):
        speedup_interval(ref, half[:5])


def test_faster_only_when_the_whole_interval_clears_one_and_the_reference_run_as_a_candidate() -> None:
    # What issue 17 saw: 1.37x while the reference as a candidate scored 1.33x, and 1.03x / 1.01x.
    baseline = _report(1.33, (1.21, 1.45))
    assert policy.baseline_bar([baseline])[0] == 1.45  # the upper end of the reference's own interval
    seen = _report(1.37, (1.28, 1.46))
    over = policy.cleared(seen, baseline)
    assert over < 1.0 and policy.claim(seen.interval, over) == "at par"
    assert policy.claim((0.98, 1.08)) == "at par" and policy.claim((1.001, 1.05)) == "faster"
    clear = _report(1.6, (1.5, 1.7))
    assert policy.claim(clear.interval, policy.cleared(clear, baseline)) == "faster"
    assert policy.claim((0.7, 0.9)) == "slower"
    assert policy.describe(1.03, (0.98, 1.08)) == "at par with the reference (0.98–1.08x)"
    assert policy.describe(1.6, (1.5, 1.7), policy.cleared(clear, baseline)) == \
        "1.60x (1.50–1.70x), faster than the reference"
    assert "faster" not in policy.describe(1.0024, (0.97, 1.04))  # chat's profile case
    # A modelled figure is deterministic: its interval is the point.
    modelled = _report(1.2, None, basis="modelled")
    assert modelled.interval == (1.2, 1.2) and policy.claim(modelled.interval) == "faster"
    assert format_interval((1.2, 1.2)) == "1.20x" and format_speedup(1.2, (1.2, 1.2)) == "1.20x"


def test_the_bar_combines_both_readings_noise_instead_of_adding_it() -> None:
    """A 10% win read as 1.10x (1.04–1.16x) beside a centred baseline of 1.00x (0.95–1.06x): its lower end
    does not clear the baseline's upper end, yet the interval of its speedup over the baseline (the two
    independent errors combined in quadrature) lies wholly above 1.0."""
    baseline = _report(1.0, (0.95, 1.06))
    win = _report(1.10, (1.04, 1.16))
    assert win.low < 1.06 and policy.cleared(win, baseline) > 1.0
    # Never stricter than lower end above the baseline's upper end, never laxer than lower end above 1.0.
    rng = np.random.default_rng(3)
    for _ in range(500):
        b = float(np.exp(rng.normal(0.0, 0.1)))
        base = _report(b, (b * float(np.exp(-rng.uniform(0, 0.2))), b * float(np.exp(rng.uniform(0, 0.2)))))
        s = float(np.exp(rng.normal(0.1, 0.2)))
        cand = _report(s, (s * float(np.exp(-rng.uniform(0, 0.2))), s * float(np.exp(rng.uniform(0, 0.2)))))
        over = policy.cleared(cand, base)
        assert over <= cand.low
        if cand.low > max(1.0, base.interval[1]):
            assert over > 1.0
    # A slower worker's reading of the reference (0.93x) never lifts a candidate above its own interval.
    assert policy.cleared(_report(1.03, (0.99, 1.07)), _report(0.93, (0.9, 0.96))) == 0.99
    # Without a measured baseline (a modelled target, a failed reference run) only the lower end counts.
    assert policy.cleared(win, None) == win.low == policy.cleared(win, _report(3.0, None, basis="modelled"))
    assert policy.cleared(EvalReport(task="t", status="incorrect", speedup=2.0, speedup_ci=(1.9, 2.1)), baseline) == 0.0


def test_ranking_and_confirmation_go_by_the_lower_end() -> None:
    lucky = _report(1.9, (0.8, 2.6))  # one lucky reading, cv well above 1
    steady = _report(1.3, (1.25, 1.36))
    ranked = policy.to_confirm([lucky, steady], policy.lower, 1.05)
    assert ranked == [steady]  # the lucky one's interval does not clear the bar: it is not even confirmed
    assert policy.to_confirm([lucky, steady], policy.lower, 1.0) == [steady]
    # Asked to, the engine re-measures the lucky one too, after the steady one: fresh readings decide it.
    assert policy.to_confirm([lucky, steady], policy.lower, 1.0, centre_of=policy.centre) == [steady, lucky]
    baseline = _report(1.0, (0.95, 1.06))
    assert policy.centre(lucky, baseline) == 1.9 and policy.centre(lucky, _report(1.25, (1.2, 1.3))) == 1.9 / 1.25
    assert policy.to_confirm([_report(0.98, (0.8, 1.1))], policy.lower, 1.0, centre_of=policy.centre) == []
    failed = EvalReport(task="t", status="incorrect", speedup=3.0, speedup_ci=(2.9, 3.1))
    assert policy.lower(failed) == 0.0  # a failed candidate never ranks


def test_the_tuner_keeps_a_steady_trial_over_a_lucky_one() -> None:
    from maxkernel.tuning.database import Database, Trial

    db = Database()
    db.add(Trial(strategy="s", params={"block": 8}, report=_report(1.9, (0.8, 2.6)), seconds=0.1))
    db.add(Trial(strategy="s", params={"block": 16}, report=_report(1.3, (1.25, 1.36)), seconds=0.1))
    assert db.best("s").params == {"block": 16}


def test_the_profiler_says_at_par_for_a_reading_inside_the_noise() -> None:
    from actors.profile_facts import ProfileFacts, rules_diagnosis

    noisy = ProfileFacts(basis="measured", ref_ms=1.0, kernel_ms=0.9976, speedup=1.0024, speedup_ci=(0.97, 1.04))
    diagnosis, _ = rules_diagnosis(noisy, "cpu")
    assert "at par with the reference (0.97–1.04x)" in diagnosis and "faster" not in diagnosis
    clear = ProfileFacts(basis="measured", ref_ms=2.0, kernel_ms=1.0, speedup=2.0, speedup_ci=(1.8, 2.2))
    assert "2.00x (1.80–2.20x), faster than the reference" in rules_diagnosis(clear, "cpu")[0]


def test_a_recalled_kernel_ranks_by_its_remembered_lower_end() -> None:
    from maxkernel.messages import RecalledKernel

    lucky = RecalledKernel(id="a", task_id="t", score=1.0, speedup=1.9, speedup_ci=(0.8, 2.6), code="")
    steady = RecalledKernel(id="b", task_id="t", score=1.0, speedup=1.3, speedup_ci=(1.25, 1.36), code="")
    assert max([lucky, steady], key=lambda k: k.low).id == "b"
    assert RecalledKernel(id="c", task_id="t", score=1.0, speedup=1.1, code="").low == 1.1  # modelled: the point
