"""python -m swcli: the same as the swcli console script."""

import sys

from swcli.cli import main  # light: main installs the signal handler before the heavy imports

if __name__ == "__main__":
    sys.exit(main())
