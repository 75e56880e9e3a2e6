"""Real vLLM in the loop: verify a placement on live servers and profile a GPU for calibration.

``python -m twin.harness verify`` replays a plan's workload on one server per GPU (real vLLM
0.8.5, or ``python -m twin serve`` stand-ins) and compares with the twin; ``python -m
twin.harness profile`` runs the studies ``python -m twin calibrate`` needs. The CPU path needs
neither vllm nor torch.
"""
