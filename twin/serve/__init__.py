"""``twin serve``: an OpenAI-compatible vLLM stand-in whose timing comes from the twin.

Modules: ``engine`` (the online twin engine on a virtual clock), ``app`` (HTTP routes),
``validate`` (request checks as vLLM's OpenAI server does them), ``metrics`` (Prometheus
``/metrics`` with the names of a chosen vLLM release), ``adapters`` (LoRA module registry),
``cli`` (``python -m twin serve`` / ``python -m twin.serve``). In Python::

    from twin.serve.app import ServeConfig, TwinServer
    server = TwinServer(ServeConfig(profile=load_profile("llama-3.1-8b-instruct"),
                                    served_model_name="base", max_loras=8, port=0))
    host, port = await server.start()   # inside a running asyncio loop; later: await server.stop()
"""
