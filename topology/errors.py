"""The one exception the topology package raises."""

from __future__ import annotations


class TopologyError(ValueError):
    """A topology file that cannot be used, or a lookup of something it does not define.

    ``str(exc)`` is ``"<file>:<line>: <key path>: <problem>"``; parts that are not known
    are left out (no line when it could not be found, no file for text without a path).
    """

    def __init__(
        self,
        problem: str,
        *,
        file: str | None = None,
        line: int | None = None,
        key_path: str | None = None,
    ) -> None:
        self.problem = problem
        self.file = file
        self.line = line
        self.key_path = key_path
        where = ""
        if file is not None:
            where = f"{file}:{line}: " if line is not None else f"{file}: "
        elif line is not None:
            where = f"line {line}: "
        super().__init__(f"{where}{key_path}: {problem}" if key_path else f"{where}{problem}")
