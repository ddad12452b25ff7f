"""Declared points where the runtime calls registered functions: what fault injection,
profilers and tests attach to instead of replacing private methods.

Points (``HOOK_POINTS``):

- ``"switch"``: before every parameter or gradient switch's exchange;
- ``"forward"``: before the forward of each micro-batch on this rank's pipeline stage;
- ``"save"``: before each box of a checkpoint is written;
- ``"gradients"``: once per training step, when the step's gradients are complete in the
  home accumulator and before they are checked for overflow, unscaled and clipped; the hook
  gets that accumulator (this rank's ``name -> tensor`` dict, or the ZeRO flat buffer), still
  multiplied by the loss scale, and may read or change it in place.

A hook takes no arguments, except at ``"gradients"``; what it raises propagates as the
runtime's own error at that point would.
"""

from typing import Callable, Dict, List

__all__ = ["HOOK_POINTS", "Hooks"]

HOOK_POINTS = ("switch", "forward", "save", "gradients")


class Hooks:
    """Functions registered per hook point, called in registration order."""

    def __init__(self):
        self._fns: Dict[str, List[Callable[..., None]]] = {p: [] for p in HOOK_POINTS}

    def add(self, point: str, fn: Callable[..., None]) -> Callable[[], None]:
        """Registers ``fn`` at ``point``; returns a function that removes it again.
        ValueError for an unknown point or a non-callable."""
        if point not in self._fns:
            raise ValueError(f"hook point {point!r} is not one of {', '.join(HOOK_POINTS)}")
        if not callable(fn):
            raise ValueError(f"a hook must be callable, got {type(fn).__name__}")
        self._fns[point].append(fn)
        return lambda: self._fns[point].remove(fn)

    def fire(self, point: str, *args) -> None:
        for fn in self._fns[point]:
            fn(*args)
