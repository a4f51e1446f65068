"""The vLLM engine (``vllm:<model>``): exact answer-slot readouts and samples through vLLM, in process.

One module a concern (docs/engines.md): :mod:`engines.vllm.settings` (:class:`VLLMSettings`, the ``--vllm-*``
flags), :mod:`engines.vllm.requests` (prompts, sampling parameters, reading vLLM's logprobs),
:mod:`engines.vllm.process` (starting and stopping vLLM, device memory), :mod:`engines.vllm.replicas` (data-parallel
replicas), :mod:`engines.vllm.engine` (:class:`VLLMEngine`). vLLM itself is imported only when a model loads.
"""

from engines.vllm.engine import VLLMEngine, add_arguments, from_args
from engines.vllm.process import free_device_memory
from engines.vllm.settings import SUPPORTS, VLLMSettings

__all__ = ["SUPPORTS", "VLLMEngine", "VLLMSettings", "add_arguments", "free_device_memory", "from_args"]
