"""The sub-agents of MaxKernel as AutoGen actors, and their brains (rules and LLM).

``run_session`` runs one plan through the actors on the local runtime (``maxkernel.optimize`` runs a
whole optimization: an Auto session in ``orchestrators``); ``register_actors`` puts any subset of the
roles on a runtime (local, or a gRPC worker), which is how work is spread over machines.
"""

from actors.config import ActorConfig
from actors.registry import register_actors
from actors.session import SessionResult, prepare_brain, run_session

__all__ = ["ActorConfig", "SessionResult", "prepare_brain", "register_actors", "run_session"]
