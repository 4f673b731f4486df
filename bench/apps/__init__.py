"""The Hoplite paper's applications, each runnable on plain Ray and on Ray + Hoplite.

- :mod:`bench.apps.async_sgd`: asynchronous SGD, a parameter server summing the first k
  gradients its workers push and broadcasting the new weights;
- :mod:`bench.apps.rl_broadcast`: a learner broadcasting its weights to rollout actors after
  every update;
- :mod:`bench.apps.serving`: a model broadcast to an ensemble of replicas, then queries fanned
  out to all of them and their outputs summed.

Each app has one code path; what moves its arrays is a :class:`bench.apps.transport.Transport`,
Ray's object store (``ray.put``/``ray.get``/``ray.wait``) or Hoplite (put/get/reduce through the
node-local daemon). Every reduce and broadcast result is checked against the value it must
have. ``python -m bench.apps.<app> --system ray|hoplite --smoke`` runs one app in a small local
Ray cluster and prints one JSON line; ``python -m bench.apps --smoke`` runs all of them on both
systems and prints a table (``make apps``).
"""
