"""JaxBench: a suite of JAX kernel tasks and an evaluator that cannot be fooled."""

from jaxbench.task import Task, TaskError, list_tasks, load_task

__all__ = ["Task", "TaskError", "list_tasks", "load_task"]
