"""The direction-flipped influence audit (paper 000): triage, BBQ and DailyDilemmas.

Each condition (model x scenario x influence type) is asked with no cue, with
a cue toward side A and with the matched cue toward side B; the analysis
(:mod:`analysis.influence.audit`) turns the three into instability, asymmetry and
backfire. Prompt and cue wordings are data (``experiments/data/influence``).
"""

from __future__ import annotations

from experiments.influence.bbq import EXPERIMENT as BBQ
from experiments.influence.dd import EXPERIMENT as DD
from experiments.influence.imported import EXPERIMENT as IMPORTED
from experiments.influence.triage import EXPERIMENT as TRIAGE

EXPERIMENTS = (TRIAGE, BBQ, DD, IMPORTED)
