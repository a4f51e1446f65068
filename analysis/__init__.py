"""Analysis: run folders in, ``report/`` out. Mirrors ``experiments/``: a package per paper, one toolkit.

Paper map (instruments in ``experiments/``, numbers here, definitions in ``docs/``):

- ``battery/``, paper 003 (yes/no bias decomposition; ``experiments/battery.py``, ``experiments/yesno.py``):
  estimators ``stance`` (theta, sigma_repro, G), ``yesno`` (P(CBR) cells, lexical / order split),
  ``binary`` (label families), ``fit`` ((s, m) logistic fits), ``calibration`` (readout temperature);
  ``report`` (battery and yes/no reports), ``figures``, ``compare`` (``probe compare``).
- ``cue/``, paper 001 (cue visibility; ``experiments/cue/``): estimators ``metrics`` (In-favor / Against,
  net bias, Gap, puzzle checks, sign tests) and ``flags`` (degenerate readings); ``report``; ``compare``.
- ``influence/``, paper 000 (direction-flipped influence audit; ``experiments/influence/``): estimators
  ``audit`` (summaries, controls; the cells, conditions, effects and their statistics are
  ``experiments/influence/effects.py`` and ``stats.py``, which the follow-up probe shares), ``flags``,
  ``asym`` (|Asym| ~ |baseline bias| mixed models), ``imported`` (condition tables from ``probe import``),
  ``coding`` (agreement of coded reasoning traces), ``followup`` (follow-up questions); ``report``;
  ``compare``.
- ``common/``, the toolkit every paper uses: ``frames`` (a run as data frames), ``checks`` (what the
  numbers rest on, appended to every report), ``tables`` (the Markdown table writer), ``bootstrap``
  (resampling, cluster weights, percentile CIs), ``figures`` (Agg, atomic PNG writes), ``report``
  (sections, ``summary.md``, the panel and dropped-items parts of a comparison).

Entry points, cross-paper: ``analysis.report.write_report`` (``probe analyze``) and
``analysis.compare.write_comparison`` (``probe compare``) dispatch to the experiment's report or
comparison. Imports run one way: ``common`` <- paper packages <- the two entry points.
"""
