"""A discrete-event simulation of a hoplite cluster that drives the real decision cores.

The network (links shared fairly, per-hop latency, pipelined block transfers) is modelled;
every decision is made by the daemon's own pure cores (docs/design.md §9): the directory's
``DirectoryState``, the receivers' ``FetchPlan`` and the reduce's ``ReducePlan`` with its
tree. No asyncio, no sockets, no wall clock: a heap of simulated times. ``hoplite simulate``
is the command line; docs/simulation.md says what is modelled and what is not.
"""
