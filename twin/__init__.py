"""The digital twin of a vLLM V1 multi-LoRA server and of a fleet (README.md, DESIGN.md)."""

from .numba_cache import refresh_stale as _refresh_stale

_refresh_stale(__path__[0])     # numba caches compiled against older sources are rebuilt
