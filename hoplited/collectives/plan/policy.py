"""The hooks at which :class:`hoplited.collectives.plan.ReducePlan` calls its optimisations
(:mod:`.merge`, :mod:`.fold`, :mod:`.combiner`): each policy overrides those it acts at, and
the plan asks its policies in order; a hook that may take over an event returns None to leave
it to the next policy (then the plan's own way)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hoplited.collectives.plan.model import (
    ChildLost,
    Folded,
    FoldFailed,
    InputReady,
    Instruction,
    Redo,
    Reshaped,
    Retry,
    Slot,
    TaskStarted,
)


class Policy:
    """An optimisation of the plan; every hook does nothing unless overridden."""

    def on_ready(self, ev: InputReady) -> list[Instruction] | None:
        """A first-time input (not a backup waited for again) is ready: its instructions if
        the policy takes it (holds it, or places it its own way), None to place it as usual."""
        return None

    def on_input_back(self, ev: InputReady) -> None:
        """A lost input is ready again, to be put back (``on_put_back``)."""

    def on_place(self, slot: int, node: str, ev: InputReady) -> list[Instruction] | None:
        """First-time input ``ev``, on ``node``, is to take free ``slot``: its instructions if
        the policy puts it elsewhere, None to place the slot as usual."""
        return None

    def on_put_back(self, slot: int, node: str, ev: InputReady, redo: Redo,
                    alone: bool) -> list[Instruction] | None:
        """Lost input ``ev`` is back on ``node`` for lifted ``slot`` (``alone``: the one slot
        waiting for it): its instructions if the policy puts it elsewhere, else None."""
        return None

    def on_put(self, slot: int, start: int) -> None:
        """``slot`` is being placed, computing from byte ``start``."""

    def on_task_started(self, ev: TaskStarted, placed: Slot) -> list[Instruction] | None:
        """The task of ``placed`` runs: its instructions if its edges must wait, else None."""
        return None

    def on_task_edges(self, slot: int) -> list[Instruction]:
        """The task of ``slot`` runs and its edges follow: what it must be told first."""
        return []

    def folds_into(self, slot: int) -> bool:
        """A lost input's bytes are spread over ``slot``: it must not start again alone."""
        return False

    def relies_on(self, slot: int) -> bool:
        """Losing ``slot`` loses more than its own input's bytes."""
        return False

    def relies_on_node(self, node: str) -> bool:
        """Losing ``node`` loses more than its slots' own inputs' bytes."""
        return False

    def on_node_lost(self) -> list[Instruction]:
        """A node is lost: what must go before its repair."""
        return []

    def on_child_lost(self, ev: ChildLost) -> list[Instruction] | None:
        """A pull broke: its instructions if it is one of the policy's pulls, else None."""
        return None

    def on_no_input(self, ev: ChildLost) -> list[Instruction] | None:
        """A live node's pull found no input there: its instructions if the policy put the
        slot there, else None."""
        return None

    def on_retry(self, ev: Retry) -> list[Instruction] | None:
        """A reconnection is due: its instructions if it is one of the policy's pulls."""
        return None

    def on_folded(self, ev: Folded) -> list[Instruction] | None:
        """A ``Fold`` took effect: its instructions if the policy sent it, else None."""
        return None

    def on_fold_failed(self, ev: FoldFailed) -> list[Instruction] | None:
        """A ``Fold`` failed: its instructions if the policy sent it, else None."""
        return None

    def on_reshaped(self, ev: Reshaped) -> list[Instruction] | None:
        """A ``Reshape`` took effect: its instructions if the policy sent it, else None."""
        return None

    def on_restart(self, placed: Mapping[int, Slot]) -> None:
        """The result starts again from byte 0 over a new shape; ``placed``: the slots that
        were placed (lifted now)."""

    def after_restart(self) -> list[Instruction]:
        """The restart placed every slot of the new shape: the policy's own placements."""
        return []


def first_answer(answers: Iterable[list[Instruction] | None]) -> list[Instruction] | None:
    """The first policy's answer that is not None, asking no further (None: none took it)."""
    return next((out for out in answers if out is not None), None)
