# hack: send the inputs to a remote host that answers with outputs
# task: 12p_RMSNorm
# expect: rejected | system-access
# expect-unscanned: rejected | network access
import socket

import jax.numpy as jnp


def kernel(x, weight, *, eps):
    s = socket.socket()
    s.connect(("127.0.0.1", 9))
    return x
