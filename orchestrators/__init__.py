"""The orchestrators: Auto loop, graph search, HITL chat and the daemon.

Each drives the shared actors over the bus (``orchestrators.bus``); none calls the evaluator or a model
itself. Modules are imported on use so that ``maxkernel`` starts fast.
"""
