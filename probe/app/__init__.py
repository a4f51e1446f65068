"""The application layer: the ``probe`` command line and what wires engines, experiments and analysis together.

Nothing below imports from here: the core (the rest of :mod:`probe`) imports
no other top-level package, ``engines`` and ``experiments`` build on the core,
``analysis`` on those, and this layer on all of them (``tests/test_layers.py``).
"""
