"""Typed errors for bad input. The CLI prints their message as one line and exits 1."""


class SwcliError(ValueError):
    """Bad input data or settings, with a message that names the file, record and position."""


class FastaError(SwcliError):
    """A FASTA file that cannot be read or is malformed (empty, not FASTA, empty sequence...)."""


class AlphabetError(SwcliError):
    """A residue letter that the substitution matrix does not score."""


class PairingError(SwcliError):
    """Records that cannot be paired (unequal counts, an odd count in single-file mode)."""


class MatrixError(SwcliError):
    """An unknown matrix name or an unreadable matrix file."""


class DatabaseError(SwcliError):
    """A search database folder that is missing, incomplete or made for another alphabet."""


class TorchVersionError(SwcliError, ImportError):
    """A torch older than the op's torch.library registrations need: an ImportError for the library, one
    line for the CLI."""
