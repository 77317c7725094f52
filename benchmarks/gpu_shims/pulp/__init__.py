"""A stand-in for PuLP on the GPU machine, used by benchmarks/h200_run.sh only.

PuLP's wheel (16 MB, a bundled CBC solver) does not fit in one transfer to that machine beside the
Triton server's wheel, and nothing there can be downloaded. ModelOpt imports PuLP at module level for
its NAS searcher (``modelopt/torch/opt/searcher.py``), which post-training quantization never runs:
names resolve (its annotations need them) and any use raises.
"""


class _Unavailable:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("PuLP is not installed on this machine (benchmarks/gpu_shims stands in for it)")


def __getattr__(name: str):
    return _Unavailable
