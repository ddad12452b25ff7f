"""Backend errors of collectives as hotswitch's fault types."""

from hotswitch._C import SwitchFault, SwitchTimeout

__all__ = ["as_fault"]


def as_fault(error: RuntimeError, where: str) -> SwitchFault:
    """A backend's ``RuntimeError`` from a collective (a dead peer closes its connections, a
    stalled one runs past the group's timeout) as ``SwitchTimeout`` when the backend reports a
    timeout, else ``SwitchFault``; the message names ``where`` and keeps the backend's text.
    A ``SwitchFault`` (or ``SwitchTimeout``) passes through unchanged."""
    if isinstance(error, SwitchFault):
        return error
    text = str(error)
    # gloo says "Timed out" / "timed out", NCCL "Timeout"; no error code tells them apart.
    kind = SwitchTimeout if "timed out" in text.lower() or "timeout" in text.lower() else SwitchFault
    return kind(f"{where}: {text}")
