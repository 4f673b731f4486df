"""The one error of the simulator: a run that left what it models (docs/simulation.md)."""

from __future__ import annotations


class SimulationError(Exception):
    """The simulation cannot go on: a decision core asked for something not modelled (a
    failure's repair, a pull within one node), or the run stopped with work left undone."""
