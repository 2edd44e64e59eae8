"""Files that ship beside the code: kernels/ and data/ in a checkout, swcli.kernels / swcli.data when installed."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def _packaged(folder: str, name: str, is_folder: bool) -> Path:
    checkout = Path(__file__).resolve().parent.parent / folder / name
    if checkout.is_dir() if is_folder else checkout.is_file():
        return checkout
    try:
        installed = resources.files(f"swcli.{folder}").joinpath(name)
    except ModuleNotFoundError:  # a checkout has no swcli.<folder> package
        installed = None
    if installed is None or not (installed.is_dir() if is_folder else installed.is_file()):
        raise FileNotFoundError(f"{folder}/{name} is missing from the swcli installation")
    return Path(str(installed))


def packaged_file(folder: str, filename: str) -> Path:
    """Path of <folder>/<filename>: from the source checkout if there, else from the installed package."""
    return _packaged(folder, filename, is_folder=False)


def packaged_folder(folder: str, name: str) -> Path:
    """Path of the folder <folder>/<name>: from the source checkout if there, else from the package."""
    return _packaged(folder, name, is_folder=True)
