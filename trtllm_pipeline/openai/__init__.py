"""An OpenAI-compatible HTTP front on a deployment: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``.

A service above the client: ``protocol`` (request and response shapes), ``translate`` (OpenAI
parameters to ``SamplingParams`` and the ``tensorrt_llm_bls`` inputs), ``reasoning`` (the R1
``</think>`` split), ``upstream`` (Triton over gRPC streaming, for asyncio), ``app`` (the FastAPI
routes) and ``server`` (the process ``serve`` starts).
"""
