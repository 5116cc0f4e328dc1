# hack: return the reference by importing the task's module
# task: 12p_RMSNorm
# expect: rejected | imports-reference-or-harness
from jaxbench.task import load_task

_ref = load_task("12p_RMSNorm").reference


def kernel(x, weight, *, eps):
    return _ref(x, weight, eps=eps)
