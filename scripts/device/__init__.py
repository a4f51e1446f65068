"""The parts of the GPU check, ``scripts/device_check.py`` (its docstring says what each step measures).

:mod:`scripts.device.trials` (the trials, engines and differences the tiny steps read),
:mod:`scripts.device.tiny_steps` (parity, sampling, split, lens frame on the tiny models),
:mod:`scripts.device.check` (what every step is handed, and the shared random Qwen3-MoE),
:mod:`scripts.device.moe_steps` (the steps on that model) and :mod:`scripts.device.steps` (the table of
steps, their estimates, the JSON record and the loop that runs them). The command line stays in
``scripts/device_check.py``.
"""
