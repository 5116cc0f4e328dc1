"""One ledger in the store: calls booked by separate processes add up, and a budget binds them all."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from maxkernel.llm.errors import BudgetExceeded
from maxkernel.llm.meter import Ledger
from maxkernel.llm.presets import Price
from memory.store import Store

PRICE = Price(input=1.0, output=2.0)

_OTHER_PROCESS = textwrap.dedent("""
    import sys
    from maxkernel.llm.meter import Ledger
    from maxkernel.llm.presets import Price
    from memory.store import Store

    with Store.open(sys.argv[1]) as store:
        ledger = Ledger(max_tokens=1000, shared=store, scope="s1")
        for _ in range(3):
            ledger.check()
            ledger.add("coder", "m", 100, 50, Price(input=1.0, output=2.0))
""")


@pytest.mark.slow
def test_a_budget_is_enforced_across_processes(store_url: str) -> None:
    with Store.open(store_url) as store:
        ledger = Ledger(max_tokens=1000, shared=store, scope="s1")
        ledger.add("planner", "m", 200, 100, PRICE)
        elsewhere = Ledger(max_tokens=1000, shared=store, scope="s2")
        elsewhere.add("planner", "m", 900, 0, PRICE)  # another scope never counts against s1
        subprocess.run([sys.executable, "-c", _OTHER_PROCESS, store_url], check=True, timeout=120)
        spent = store.spent("s1")
        assert (spent.calls, spent.tokens) == (4, 300 + 3 * 150)
        assert spent.cost_usd == pytest.approx((200 + 300) * 1e-6 + (100 + 150) * 2e-6)
        assert ledger.tokens == 300  # this process's share; the check looks at the fleet's
        ledger.check()
        ledger.add("planner", "m", 200, 100, PRICE)
        with pytest.raises(BudgetExceeded, match="1050 of 1000 tokens"):
            ledger.check()
        assert store.spent("s2").tokens == 900


def test_a_ledger_without_a_store_counts_this_process_only() -> None:
    ledger = Ledger(max_cost_usd=0.001)
    ledger.add("coder", "m", 400, 200, PRICE)
    ledger.check()
    ledger.add("coder", "m", 400, 200, PRICE)
    with pytest.raises(BudgetExceeded, match="money budget spent"):
        ledger.check()
