"""Learning through the op: fit a substitution matrix, the gap score and the temperature together.

soft_smith_waterman is differentiable in its (B, M, N) score matrix, in the gap score and in the
temperature. A score matrix built from a K x K substitution matrix by a gather,
W[query[:, :, None], target[:, None, :]], passes its gradient on to W; a gap or a temperature given as a
tensor that requires grad gets its own (d score / d gap is the expected number of gap positions of the
soft alignment). So all three can be fitted by gradient descent, like any other parameters; here they
are held by SoftSmithWaterman(learnable=True), which keeps the temperature positive by holding its log.

The data are real: windows of the 40 protein sequences of data/example.fasta, each paired with a
mutated copy of itself (substitutions and deletions, so that its best alignment is long and crosses
gaps) and with windows of other sequences (unrelated pairs). A hidden "teacher" scores them with
BLOSUM62, a linear gap of -4 and temperature 1; the student starts from a matrix of zeros, gap -1 and
temperature 3, and Adam fits all three to the teacher's scores (mean squared error). The loss falls by
orders of magnitude, the gap and the temperature come close to the teacher's, and the fitted matrix
correlates with BLOSUM62 (the scores of some residue pairs are barely constrained by these few hundred
pairs: those entries stay near where they started).

Runs on the CPU in about 20 seconds (2 cores): python3 docs/learning.py [--steps N] [--plot FILE.png]. The first
call of the CPU engine compiles it once (about a minute) and caches it. With matplotlib installed (it
is not a dependency of swcli) it also saves a plot of the loss and the learned gap and temperature,
learning.png by default.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import random

import torch
from Bio.Align import substitution_matrices
from Bio.SeqIO.FastaIO import SimpleFastaParser

from swcli import SoftSmithWaterman
from swcli._files import packaged_file

TEACHER_GAP = -4.0
TEACHER_TEMPERATURE = 1.0
WINDOW = 24  # residues per sequence window: short pairs keep a step fast
UNRELATED_PER_WINDOW = 5


def teacher_matrix() -> tuple[str, torch.Tensor]:
    """BLOSUM62 on the 20 standard amino acids: (alphabet, 20 x 20 float64)."""
    blosum = substitution_matrices.load("BLOSUM62")
    alphabet = "ACDEFGHIKLMNPQRSTVWY"
    return alphabet, torch.tensor([[blosum[a][b] for b in alphabet] for a in alphabet], dtype=torch.float64)


def mutate(sequence: str, alphabet: str, rng: random.Random) -> str:
    """A copy with about 30% of the letters substituted and 10% deleted."""
    letters = []
    for letter in sequence:
        roll = rng.random()
        if roll < 0.1:
            continue
        letters.append(rng.choice(alphabet) if roll < 0.4 else letter)
    return "".join(letters) or sequence[:1]


def make_pairs(alphabet: str, seed: int = 0):
    """Padded codes and lengths of the pairs: (query (B, M), target (B, N), query_lengths, target_lengths)."""
    rng = random.Random(seed)
    with open(packaged_file("data", "example.fasta")) as handle:
        sequences = ["".join(c for c in s if c in alphabet) for _, s in SimpleFastaParser(handle)]
    windows = []
    for sequence in sequences:
        start = rng.randrange(max(1, len(sequence) - WINDOW + 1))
        windows.append(sequence[start:start + WINDOW])
    pairs = []
    for k, window in enumerate(windows):
        pairs.append((window, mutate(window, alphabet, rng)))
        others = [w for j, w in enumerate(windows) if j != k]
        pairs += [(window, other) for other in rng.sample(others, UNRELATED_PER_WINDOW)]
    code = {letter: k for k, letter in enumerate(alphabet)}
    as_codes = [torch.tensor([code[c] for c in s]) for s in (q for q, _ in pairs)], [
        torch.tensor([code[c] for c in s]) for s in (t for _, t in pairs)]
    pad = torch.nn.utils.rnn.pad_sequence  # padding is never read: the lengths mask it out
    queries, targets = as_codes
    return (pad(queries, batch_first=True), pad(targets, batch_first=True),
            torch.tensor([len(q) for q in queries]), torch.tensor([len(t) for t in targets]))


def fit(steps: int = 400, seed: int = 0, lr: float = 0.1, log_every: int = 0) -> dict:
    """Fit a symmetric matrix, the gap and the temperature to the teacher's scores. Returns a dict:
    matrix, gap, temperature (learned), teacher_matrix, history (per step: loss, gap, temperature)."""
    torch.manual_seed(seed)
    alphabet, teacher = teacher_matrix()
    query, target, query_lengths, target_lengths = make_pairs(alphabet, seed)

    def score_matrix(matrix):
        return matrix[query[:, :, None], target[:, None, :]]  # (B, M, N), differentiable in matrix

    teacher_align = SoftSmithWaterman(gap_open=TEACHER_GAP, temperature=TEACHER_TEMPERATURE, backend="cpu")
    with torch.no_grad():
        target_scores = teacher_align(score_matrix(teacher), query_lengths, target_lengths)

    # The student: the matrix is (W + W.T) / 2, symmetric by construction; gap and log(temperature) are
    # the module's parameters.
    W = torch.zeros(len(alphabet), len(alphabet), dtype=torch.float64, requires_grad=True)
    align = SoftSmithWaterman(gap_open=-1.0, temperature=3.0, backend="cpu", learnable=True).double()
    # The gap moves slowest from its start: it gets a larger step than the matrix and the temperature.
    optimizer = torch.optim.Adam([{"params": [W, align.log_temperature]}, {"params": [align.gap_open], "lr": 3 * lr}],
                                 lr=lr)
    history = {"loss": [], "gap": [], "temperature": []}
    for step in range(steps + 1):
        scores = align(score_matrix((W + W.T) / 2), query_lengths, target_lengths)
        loss = torch.mean((scores - target_scores) ** 2)
        history["loss"].append(loss.item())
        history["gap"].append(align.gap_open.item())
        history["temperature"].append(align.temperature.item())
        if log_every and step % log_every == 0:
            print(f"step {step:4d}  loss {loss.item():.3e}  gap {align.gap_open.item():6.3f}  "
                  f"temperature {align.temperature.item():.3f}")
        if step == steps:  # the last loss is measured, not stepped past
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {"matrix": ((W + W.T) / 2).detach(), "gap": align.gap_open.item(),
            "temperature": align.temperature.item(), "teacher_matrix": teacher, "alphabet": alphabet,
            "history": history}


def correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson correlation of the upper triangles (diagonal included) of two symmetric matrices."""
    rows, cols = torch.triu_indices(a.shape[0], a.shape[1])
    x, y = a[rows, cols], b[rows, cols]
    x, y = x - x.mean(), y - y.mean()
    return (x @ y / math.sqrt((x @ x) * (y @ y))).item()


def plot(result: dict, path: str) -> bool:
    """Save the loss and the learned gap and temperature per step as a PNG; False (and nothing written)
    without matplotlib, which swcli does not depend on."""
    if importlib.util.find_spec("matplotlib") is None:
        return False
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    history = result["history"]
    fig, (ax_loss, ax_gap, ax_t) = plt.subplots(1, 3, figsize=(12, 3.5))
    ax_loss.semilogy(history["loss"])
    ax_loss.set(title="loss (mean squared error)", xlabel="step")
    ax_gap.plot(history["gap"], label="learned")
    ax_gap.axhline(TEACHER_GAP, color="gray", linestyle="--", label="teacher")
    ax_gap.set(title="gap score", xlabel="step")
    ax_gap.legend()
    ax_t.plot(history["temperature"], label="learned")
    ax_t.axhline(TEACHER_TEMPERATURE, color="gray", linestyle="--", label="teacher")
    ax_t.set(title="temperature", xlabel="step")
    ax_t.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--plot", default="learning.png", help="where to save the plot (needs matplotlib)")
    arguments = parser.parse_args()
    result = fit(steps=arguments.steps, log_every=25)
    losses = result["history"]["loss"]
    print(f"loss {losses[0]:.3e} -> {losses[-1]:.3e}; gap {result['gap']:.3f} (teacher {TEACHER_GAP}); "
          f"temperature {result['temperature']:.3f} (teacher {TEACHER_TEMPERATURE}); correlation of the "
          f"matrix with BLOSUM62 {correlation(result['matrix'], result['teacher_matrix']):.3f}")
    if plot(result, arguments.plot):
        print(f"plot saved to {arguments.plot}")
    else:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
