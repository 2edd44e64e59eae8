"""`swcli verify`: a sample of the pairs scored by the chosen backend and by the float64 reference loop."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from swcli.errors import SwcliError
from swcli.fasta import FastaRecord
from swcli.output import format_score
from swcli.pipeline import Settings, Stats, encode_chunk, score_batches, score_chunk


@dataclass(frozen=True)
class Check:
    number: int  # 1-based position of the pair in the input
    query: FastaRecord
    target: FastaRecord
    score: float  # the backend's
    reference: float  # the float64 reference loop's

    @property
    def absolute(self) -> float:
        return abs(self.score - self.reference)

    @property
    def relative(self) -> float:
        return self.absolute / max(1.0, abs(self.reference))


@dataclass
class Report:
    backend: str
    total_pairs: int
    eligible_pairs: int  # those within the reference loop's cell limit
    max_cells: int
    checks: list[Check]
    gaps: str = ""  # the gaps both sides scored with, as scoring.Gaps.describe() says them

    @property
    def worst_relative(self) -> float:
        # NaN anywhere (a NaN score) must fail: max() would skip it.
        values = [c.relative for c in self.checks]
        return float("inf") if any(v != v for v in values) else max(values)

    def describe(self, tolerance: float) -> str:
        by_abs = max(self.checks, key=lambda c: c.absolute)
        by_rel = max(self.checks, key=lambda c: c.relative)

        def name(c: Check) -> str:
            return (f"pair {c.number} ({c.query.id} vs {c.target.id}, {len(c.query.sequence)}x"
                    f"{len(c.target.sequence)}): {format_score(c.score)} vs reference {float(c.reference)!r}")

        verdict = "OK" if self.worst_relative <= tolerance else "FAILED"
        return "\n".join([
            f"checked {len(self.checks)} of {self.total_pairs} pairs ({self.eligible_pairs} within "
            f"--max-cells {self.max_cells}): backend {self.backend} against the reference loop in float64"
            + (f", {self.gaps}" if self.gaps else ""),
            f"largest absolute difference {by_abs.absolute:.3g}: {name(by_abs)}",
            f"largest relative difference {by_rel.relative:.3g}: {name(by_rel)}",
            f"{verdict}: tolerance {tolerance:g} on |score - reference| / max(1, |reference|)",
        ])


def sample_pairs(pairs: Iterable, k: int, seed: int, max_cells: int | None = None):
    """k pairs drawn uniformly in one pass (reservoir sampling) among those of at most max_cells cells,
    in input order; and the count of all pairs and of those eligible."""
    rng = random.Random(seed)
    reservoir: list[tuple[int, tuple]] = []
    total = eligible = 0
    for total, pair in enumerate(pairs, 1):
        if max_cells is not None and len(pair[0].sequence) * len(pair[1].sequence) > max_cells:
            continue
        eligible += 1
        if len(reservoir) < k:
            reservoir.append((total, pair))
        elif (slot := rng.randrange(eligible)) < k:
            reservoir[slot] = (total, pair)
    return sorted(reservoir, key=lambda item: item[0]), total, eligible


def verify_pairs(pairs: Iterable, settings: Settings, sample: int, seed: int, max_cells: int,
                 progress) -> Report:
    """Score a sample with settings.backend and with the reference, both with settings' gaps (affine
    ones against the affine loop); progress(total) gives a bar over the reference loop's steps (one per
    cell)."""
    chosen, total, eligible = sample_pairs(pairs, sample, seed, max_cells)
    if not chosen:
        raise SwcliError(f"none of the {total} pairs has at most {max_cells} cells (qlen x tlen), the "
                         "limit for the reference loop; raise --max-cells")
    chunk = [pair for _, pair in chosen]
    scores = score_chunk(chunk, settings, settings.matrix.tensor(device=settings.device), Stats())
    # One pair per batch: the loop's cost is its padded M x N steps, and sampled sizes differ widely.
    reference = dataclasses.replace(settings, backend="reference", max_cells=1)
    batches = encode_chunk(chunk, reference)
    with progress(sum(b.cells for b in batches)) as bar:  # one pair per batch: no padded steps
        expected = score_batches(batches, len(chunk), reference, settings.matrix.tensor(dtype=torch.float64),
                                 Stats(), lambda b: bar.update(b.cells))
    checks = [Check(number, q, t, s, r) for (number, (q, t)), s, r in zip(chosen, scores, expected)]
    return Report(settings.backend, total, eligible, max_cells, checks, settings.gaps.describe())
