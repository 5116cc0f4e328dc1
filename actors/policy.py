"""The engine's rules, decided in one place: the bar a winner must clear, how the budget is shared across
strategies, which order they are worked in, how long a tuner may search, and when a speedup is confirmed.

Auto, search, chat and daemon jobs all ask these functions; none of them keeps a rule of its own.

- **The bar.** The judge times the reference in its own process and a candidate in a worker; the
  reference itself run as a candidate shows how far that alone moves the ratio. Every measured speedup
  carries a bootstrap interval over its timing rounds. A winner's interval must lie wholly above 1.0, and
  so must the interval of its speedup over that reading of the reference (:func:`cleared`): the two are
  independent measurements, so their widths add in quadrature on a log scale. (Asking the candidate's
  lower end to clear the upper end of the reference's interval counts both noises in full, a far stricter
  test than 95%, which hid real 10–20% wins.) One noisy high reading would hide real wins behind an
  inflated bar, so a reading above ``SUSPECT_BIAS`` is measured twice more and the median of the three
  counts.
- **Ranking.** Candidates are ranked by the lower end of their interval, so a noisy lucky reading never
  wins over a steady one.
- **Shares.** Each strategy still to be worked on gets an equal share of the time (and evaluations)
  left; what one leaves unused flows to the next. A tuner stops starting trials when the next one (as
  long as the strategy's own draft took to judge) would not end inside the strategy's share.
- **Order.** Memory's priors and the target's rule are decided together here. A strategy that clearly
  (``MOVE``) won on the nearest measured tasks goes first, best prior first, whatever its kind; a verified
  kernel recalled for this very task goes before even those, and the reference last. Among the rest, on
  ``tpu-*`` targets the Pallas strategies go before the plain-JAX ones (building and checking a plain-JAX
  trial there can take a minute, and it must never starve the Pallas kernels), except the general rules,
  which go after the rewrites that remove work (a rewrite that removes work beats a fusion of it, and the
  general rules apply nearly everywhere) and before those that remove none (counted by shapes,
  ``maxkernel.rewrites.program_work``); strategies that failed or lost clearly on similar tasks go after
  those memory knows nothing of.
- **Confirmation.** The top candidates that clear it are measured again before one is named the winner:
  of the runs' lower ends, the lower of two runs, or the median of three when the two disagree about
  clearing the bar. A candidate whose first reading was too noisy to clear, though its centre did, is
  measured twice more and the lower of those two fresh runs decides. A modelled speedup (a TPU target
  without a TPU) is deterministic and needs no second run.
"""

from __future__ import annotations

import math
from typing import Callable, Protocol, Sequence, TypeVar

from jaxbench.report import EvalReport as JudgeReport, format_interval, format_speedup

SUSPECT_BIAS = 1.05
# A prior moves a strategy only beyond the noise of one CPU measurement: a 10% win or loss.
MOVE = math.log(1.1)
CONFIRM_TOP = 3
PLAIN_JAX_KINDS = ("rewrite", "reference")
STEP_TUNE_S = 120.0  # one tuning step asked for by a person (chat): no session budget to take a share of
BASELINE = "auto:baseline"
CONFIRM = "auto:confirm"

S = TypeVar("S")
R = TypeVar("R", bound="Reading")


class Reading(Protocol):
    """A judged speedup with its interval: a judge's report, or a search node read back from the store."""

    speedup: float | None
    basis: str | None

    @property
    def passed(self) -> bool: ...

    @property
    def interval(self) -> tuple[float, float] | None: ...

    @property
    def low(self) -> float: ...


def reading(report: Reading) -> float | None:
    """The speedup a passing report stands for, or None when it failed or has none."""
    if not report.passed or not report.speedup:
        return None
    return float(report.speedup)


def lower(report: JudgeReport) -> float:
    """What a candidate ranks by: the lower end of its speedup's interval (0.0 when it failed)."""
    return report.low


def _base(report: Reading, baseline: Reading | None) -> float | None:
    """The baseline's reading where a measured report may be set against it (both measured, it passed)."""
    if baseline is None or report.basis != "measured" or baseline.basis != "measured":
        return None
    return reading(baseline)


def baseline_of(runs: Sequence[R]) -> R | None:
    """The baseline run that counts (:func:`baseline_bar`), or None before one was measured."""
    return runs[baseline_bar(runs)[1]] if runs else None


def cleared(report: Reading, baseline: Reading | None = None) -> float:
    """What must lie above 1.0 for a candidate to be called faster: the lower end of its speedup's interval,
    and, where the reference itself was measured as a candidate (``baseline``), the lower end of the
    candidate's speedup over that reading, whichever is lower (0.0 when the candidate failed).

    The second is the 95% interval of ``speedup / baseline``: on a log scale the candidate's lower half-width
    and the baseline's upper half-width combine as independent errors do (in quadrature). It never asks
    more than the candidate's lower end clearing the baseline's upper end, nor less than it clearing 1.0."""
    low = report.low
    base = _base(report, baseline)
    if low <= 0.0 or base is None or baseline is None or not report.speedup:
        return low
    high = (baseline.interval or (base, base))[1]
    centre = math.log(float(report.speedup))
    spread = math.hypot(centre - math.log(low), math.log(max(high, base)) - math.log(base))
    return min(low, math.exp(centre - math.log(base) - spread))


def claim(interval: Sequence[float] | None, over: float | None = None) -> str:
    """``faster`` only when the whole interval clears 1.0 and so does ``over`` (the speedup over the
    reference's own reading, :func:`cleared`) where it is given; ``slower`` when the interval lies wholly
    below 1.0; else ``at par``."""
    if not interval:
        return "at par"
    low, high = interval
    if low > 1.0 and (over is None or over > 1.0):
        return "faster"
    return "slower" if high < 1.0 else "at par"


def describe(speedup: float | None, interval: Sequence[float] | None, over: float | None = None) -> str:
    """One honest phrase for a speedup: ``1.21x (1.15–1.30x), faster than the reference`` or
    ``at par with the reference (0.98–1.04x)``; ``over`` as for :func:`claim`."""
    if speedup is None:
        return "no speedup measured"
    span = (float(interval[0]), float(interval[1])) if interval else (speedup, speedup)
    verdict = claim(span, over)
    if verdict == "faster":
        return f"{format_speedup(speedup, span)}, faster than the reference"
    if verdict == "slower":
        return f"{format_speedup(speedup, span)}, slower than the reference"
    return f"at par with the reference ({format_interval(span)})"


def baseline_needs_more(first: JudgeReport) -> bool:
    """A measured reading of the reference above ``SUSPECT_BIAS`` is suspect: measure it twice more."""
    value = reading(first)
    return first.basis == "measured" and value is not None and value > SUSPECT_BIAS


def baseline_more(runs: Sequence[JudgeReport]) -> bool:
    """Whether the baseline wants another run: its first, or two more after a suspect first reading."""
    return not runs or (baseline_needs_more(runs[0]) and len(runs) < 3)


def baseline_bar(runs: Sequence[Reading]) -> tuple[float, int]:
    """The bar shown (at least 1.0) from the reference's runs as a candidate, and which run counts: the upper
    end of the interval of the run whose reading is the median (the only run, when one was enough). A
    winner's own reading always lies above it (:func:`cleared`)."""
    first = reading(runs[0])
    if first is None or runs[0].basis != "measured":
        return 1.0, 0
    index = 0
    if len(runs) >= 3:
        index = sorted(((reading(r) or first), i) for i, r in enumerate(runs[:3]))[1][1]
    interval = runs[index].interval or (first, first)
    return max(1.0, interval[1]), index


def needs_confirmation(report: JudgeReport) -> bool:
    return report.basis == "measured"


def confirm_more(runs: Sequence[float], bar: float = 1.0) -> bool:
    """After the first reading: one re-run; a third run only when the two disagree about clearing ``bar``.
    A first reading that did not clear ``bar`` itself (a noisy one whose centre did) gets two re-runs,
    unless the first of them fails to clear."""
    if len(runs) < 2:
        return True
    if runs[0] <= bar:
        return len(runs) == 2 and runs[1] > bar
    return len(runs) == 2 and runs[0] > bar >= runs[1] > 0.0


def confirmed(runs: Sequence[float], bar: float = 1.0) -> float:
    """The lower of two runs, or the median of three; after a first reading that did not clear ``bar``,
    the lower of the two re-runs (fresh readings alone decide)."""
    if len(runs) <= 2:
        return min(runs)
    if runs[0] <= bar:
        return min(runs[1:3])
    return sorted(runs)[1]


def claimed_run(runs: Sequence[float], value: float) -> int:
    """Which run's reading is the claimed figure once ``value`` (:func:`confirmed`) decided: a re-measurement,
    never the first reading it re-measured (the first may be the lucky one): the re-run that is ``value``, else
    the lowest re-run at or above it (one exists for every rule of :func:`confirmed`); the only run when
    there was no re-run (a modelled, deterministic reading)."""
    reruns = [(r, i) for i, r in enumerate(runs) if i > 0]
    if not reruns:
        return 0
    exact = [i for r, i in reruns if r == value]
    if exact:
        return exact[0]
    above = [(r, i) for r, i in reruns if r >= value]
    return min(above)[1] if above else max(reruns)[1]


def confirmation_label(runs: Sequence[float], bar: float = 1.0) -> str:
    if len(runs) == 3 and runs[0] <= bar:
        return "lower of two re-runs"
    return {1: "modelled, deterministic", 2: "lower of two runs"}.get(len(runs), "median of three runs")


def centre(report: Reading, baseline: Reading | None = None) -> float:
    """The centre of a reading as :func:`cleared` takes its lower end: the speedup, and its ratio to the
    baseline where one was measured, whichever is lower (0.0 when it failed)."""
    if not report.passed or not report.speedup:
        return 0.0
    base = _base(report, baseline)
    return float(report.speedup) if base is None else min(float(report.speedup), float(report.speedup) / base)


def to_confirm(candidates: Sequence[S], speedup_of: Callable[[S], float], bar: float = 1.0,
               centre_of: Callable[[S], float] | None = None) -> list[S]:
    """The best ``CONFIRM_TOP`` candidates whose first reading clears ``bar``, best first; callers rank by
    the lower end of the interval (:func:`lower`), or by :func:`cleared` where a baseline was measured.
    With ``centre_of`` (:func:`centre`), a candidate whose reading's centre clears ``bar`` though its
    lower end does not is re-measured too, after those that clear: fresh readings decide it."""
    ranked = sorted(candidates, key=speedup_of, reverse=True)
    return [c for c in ranked if speedup_of(c) > bar or (centre_of is not None and centre_of(c) > bar)][:CONFIRM_TOP]


CONFIRM_RESERVE = 2  # evaluations kept for naming a winner: the top candidate's re-run and a deciding third


def reserve_s(seconds_per_evaluation: float | None) -> float:
    """Time the strategies leave for the re-measurements that name a winner (run after them, inside the budget)."""
    return 0.0 if seconds_per_evaluation is None else CONFIRM_RESERVE * seconds_per_evaluation


def can_start(left_s: float | None, seconds_per_evaluation: float | None) -> bool:
    """Whether the time left pays for one more evaluation and the reserve: work the budget cannot cover is
    never begun (an evaluation cannot be cut short once it runs)."""
    if left_s is None:
        return True
    if seconds_per_evaluation is None:
        return left_s > 0
    return left_s >= seconds_per_evaluation + reserve_s(seconds_per_evaluation)


def share(left: float | None, strategies_left: int) -> float | None:
    """An equal part of what is left (time or evaluations) for each strategy still to be worked on."""
    if left is None:
        return None
    return max(0.0, left) / max(1, strategies_left)


def trial_cap(evaluations_left: int | None, strategies_left: int) -> int | None:
    """Tuning trials a strategy may spend: its share of the evaluations left, less the draft itself."""
    if evaluations_left is None:
        return None
    part = share(float(evaluations_left), strategies_left) or 0.0
    return max(1, int(part) - 1)


def tune_window(share_left_s: float, trial_s: float) -> float:
    """Seconds in which a tuner may still start trials: the trial it starts last must end in the share.

    ``trial_s`` is the time the strategy's own draft took to judge, the best estimate of one trial.
    """
    return max(0.0, share_left_s - max(0.0, trial_s))


def is_pallas(kind: str) -> bool:
    return kind not in PLAIN_JAX_KINDS


def prior_band(prior: float | None) -> int:
    """0: a clear win on similar tasks; 1: memory knows nothing or little; 2: a clear failure or loss there."""
    if prior is None or abs(prior) < MOVE:
        return 1
    return 0 if prior > 0 else 2


GENERAL = "general"  # the order's kind for the general rules (``maxkernel.sketches``)
RESTATED = "restated"  # a rewrite that does not remove work (it writes the same arithmetic another way)
REMOVES_WORK = 0.9  # a rewrite whose arithmetic is at most this share of the reference's removes work


def order_kind(kind: str, name: str, work_ratio: float | None = None) -> str:
    """A strategy's kind for :func:`work_order`: the general rules apart from the expert templates, and a
    rewrite that removes no work (``work_ratio`` above ``REMOVES_WORK``) apart from one that does."""
    from maxkernel.sketches import SKETCHES

    if kind == "template" and name in {f"template:{s.name}" for s in SKETCHES}:
        return GENERAL
    if kind == "rewrite" and work_ratio is not None and work_ratio > REMOVES_WORK:
        return RESTATED
    return kind


def work_order(strategies: Sequence[S], kind_of: Callable[[S], str], target: str,
               prior_of: Callable[[S], float | None] | None = None) -> list[S]:
    """The order strategies are worked in. The planner's order already ranks by memory; on ``tpu-*``
    Pallas goes first within each of memory's bands, so a plain-JAX rewrite that clearly won on similar
    tasks is still tried before the Pallas kernels (see the module's **Order**). The general rules
    (``kind_of`` says ``general``) come after the rewrites that remove work (a pre-summed weight: they
    fuse the work there is, and apply to nearly every task), and before those that only restate it
    (``restated``), which XLA compiles to what it ran already. A clear win of the general rules on similar
    tasks does not move them forward (they win on most tasks; it says little of this one); a loss moves
    them back like any strategy."""
    if not target.startswith("tpu"):
        return list(strategies)

    def key(item: tuple[int, S]) -> tuple[int, int, int]:
        index, strategy = item
        kind = kind_of(strategy)
        if kind == "recalled":
            return -1, 0, index
        if kind == "reference":
            return 3, 0, index
        band = prior_band(prior_of(strategy) if prior_of is not None else None)
        if band == 0 and kind == GENERAL:  # they apply nearly everywhere: a win on a neighbour says little here
            band = 1
        if band == 0:
            return band, 0, index
        return band, {GENERAL: 2, RESTATED: 3}.get(kind, 0 if is_pallas(kind) else 1), index

    return [s for _, s in sorted(enumerate(strategies), key=key)]
