"""swcli: soft (logsumexp-smoothed) Smith-Waterman local alignment for PyTorch, and a FASTA aligner.

The public API is imported lazily, so that `swcli --help` starts without importing torch.
"""

__version__ = "0.1.0"
__all__ = ["soft_smith_waterman", "soft_smith_waterman_codes", "SoftSmithWaterman", "load_engine", "__version__"]


def __getattr__(name):
    if name in ("soft_smith_waterman", "soft_smith_waterman_codes", "SoftSmithWaterman", "load_engine"):
        from swcli import ops

        value = getattr(ops, name)
        globals()[name] = value  # later lookups skip this function and its import (about 10 us)
        return value
    raise AttributeError(f"module 'swcli' has no attribute {name!r}")
