"""The simulator's exceptions: one base for the package, one subclass per kind of bad input."""

from __future__ import annotations

from pathlib import Path


class SimulationError(Exception):
    """Base of every error the simulator and the tuning CLI raise."""


class TraceError(SimulationError):
    """A trace row is invalid; the message names the file and the line.

    Attributes:
        path: the trace file (for a tarball, ``archive.tar.gz:member.csv``).
        line: the 1-based line number of the bad row (the header is line 1); 0 for a problem
            of the whole file, which the message then gives without a line.
        problem: what is wrong with it.
    """

    def __init__(self, path: Path | str, line: int, problem: str) -> None:
        self.path = str(path)
        self.line = line
        self.problem = problem
        super().__init__(f"{self.path}:{line}: {problem}" if line else f"{self.path}: {problem}")

    def __reduce__(self) -> tuple[type[TraceError], tuple[str, int, str]]:
        # Rebuilt from its fields, so that it survives the trip back from a worker process.
        return type(self), (self.path, self.line, self.problem)


class ClusterFileError(SimulationError):
    """A cluster file is invalid; the message names the file and every problem."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = list(problems)
        listing = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{source}: {len(self.problems)} problem(s):\n{listing}")

    def __reduce__(self) -> tuple[type[ClusterFileError], tuple[str, list[str]]]:
        return type(self), (self.source, self.problems)


class SearchSpaceError(SimulationError):
    """A tuning search space is invalid; the message names the file and the parameter."""
