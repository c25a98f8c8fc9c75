"""Verifiable tasks: problems with prompts, and verifiers that score a response in [0, 1]."""

from hacfed.tasks.base import Problem, Task, Verdict

__all__ = ["Problem", "Task", "Verdict"]
