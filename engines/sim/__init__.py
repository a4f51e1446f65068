"""The synthetic subject (``sim``, ``sim:<params.yaml>``): a fake model with planted, known parameters, so that
every estimator can be checked for recovering them.

One module a concern (docs/engines.md): :mod:`engines.sim.noise` (reproducible draws from a digest),
:mod:`engines.sim.params` (:class:`SimParams`, the planted parameters and their YAML), :mod:`engines.sim.engine`
(:class:`SimEngine`, the readouts and samples those parameters make).
"""

from engines.sim.engine import SUPPORTS, SimEngine, add_arguments, from_args
from engines.sim.params import SimParams

__all__ = ["SUPPORTS", "SimEngine", "SimParams", "add_arguments", "from_args"]
