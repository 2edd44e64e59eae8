"""Files that ship beside the code: kernels/ and data/ in a checkout, swcli.kernels / swcli.data when installed."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def packaged_file(folder: str, filename: str) -> Path:
    """Path of <folder>/<filename>: from the source checkout if there, else from the installed package."""
    checkout = Path(__file__).resolve().parent.parent / folder / filename
    if checkout.is_file():
        return checkout
    try:
        installed = resources.files(f"swcli.{folder}").joinpath(filename)
    except ModuleNotFoundError:  # a checkout has no swcli.<folder> package
        installed = None
    if installed is None or not installed.is_file():
        raise FileNotFoundError(f"{folder}/{filename} is missing from the swcli installation")
    return Path(str(installed))
