"""Size limits of one twin run, checked before any work so that a mistyped size is refused at
once instead of growing past the machine's memory.

The twin holds every request of a run in memory (arrival, adapter, lengths, first-token and
finish times, plus the generator's temporaries: about 100 bytes per request at the peak), and
draws one arrival stream per adapter in a Python loop. The defaults are a hundred times the
heaviest shipped scenario (384 adapters, ~80k requests per simulated hour).
"""

from __future__ import annotations


MAX_REQUESTS_PER_SERVER = 10_000_000      # ~1 GB at the peak
MAX_ADAPTERS_PER_SERVER = 100_000         # one Python-level arrival stream per adapter
MAX_DURATION_S = 7 * 86_400.0             # a week of simulated time
MAX_ADAPTERS_PER_INSTANCE = 1_000_000     # adapters of one instance / adapters CSV (all GPUs)
MAX_TRACE_REQUESTS = MAX_REQUESTS_PER_SERVER   # rows of one trace CSV
# tokens (input + output) of one request when no profile is at hand: 8 x the longest context of
# the shipped profiles (131,072); with a profile, its max_model_len (vLLM refuses longer ones)
MAX_TOKENS_PER_REQUEST = 1_048_576


def check_run_size(n_adapters: int, total_rate: float, duration_s: float,
                   where: str = "run") -> None:
    """Refuse a run whose adapter count, window or expected request count exceeds the limits
    (``ValueError`` naming the value, the limit and the reason)."""
    if n_adapters > MAX_ADAPTERS_PER_SERVER:
        raise ValueError(f"{where}: {n_adapters:,} adapters on one server exceed the limit of "
                         f"{MAX_ADAPTERS_PER_SERVER:,} (the twin draws one arrival stream per "
                         "adapter; vLLM serves far fewer per GPU)")
    if duration_s > MAX_DURATION_S:
        raise ValueError(f"{where}: window {duration_s:g} s exceeds the limit of "
                         f"{MAX_DURATION_S:g} s (one week)")
    expected = total_rate * duration_s
    if expected > MAX_REQUESTS_PER_SERVER:
        raise ValueError(f"{where}: about {expected:,.0f} requests expected ({total_rate:g} req/s "
                         f"x {duration_s:g} s) exceed the limit of {MAX_REQUESTS_PER_SERVER:,} "
                         "per server (~100 bytes each in memory); shorten the window or lower "
                         "the rates")



def check_adapter_count(n_adapters: int, where: str = "adapters") -> None:
    """Refuse more than ``MAX_ADAPTERS_PER_INSTANCE`` adapters before any is built."""
    if n_adapters > MAX_ADAPTERS_PER_INSTANCE:
        raise ValueError(f"{where}: {n_adapters:,} adapters exceed the limit of "
                         f"{MAX_ADAPTERS_PER_INSTANCE:,} per instance (each becomes an object "
                         "and a model column; the largest shipped instance has 10,000)")


def tokens_limit(max_model_len: int | None = None) -> tuple[int, str]:
    """(largest input + output tokens of one request, what the limit is)."""
    if max_model_len is not None:
        return int(max_model_len), f"the profile's max_model_len {int(max_model_len):,}"
    return MAX_TOKENS_PER_REQUEST, f"the limit of {MAX_TOKENS_PER_REQUEST:,} tokens per request"


# ranges of the ``twin serve`` flags the twin can simulate (``twin.serve.cli`` checks them;
# ``twin.serve.app.ServeConfig`` checks the time scale too)
TIME_SCALE_RANGE = (1e-3, 1e3)            # twin seconds per wall second
MAX_NUM_SEQS_MAX = 65_536
MAX_NUM_BATCHED_TOKENS_MAX = 1_048_576
