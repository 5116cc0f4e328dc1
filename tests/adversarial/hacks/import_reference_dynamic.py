# hack: load the reference with a dynamic import so no import statement names it
# task: 12p_RMSNorm
# expect: rejected | dynamic-import
# expect-unscanned: rejected | reading
_util = __import__("importlib.util").util
_suite = __import__("jaxbench").__file__.rsplit("/", 1)[0] + "/tasks/12p_RMSNorm/reference.py"


def kernel(x, weight, *, eps):
    spec = _util.spec_from_file_location("r", _suite)
    mod = _util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.reference(x, weight, eps=eps)
