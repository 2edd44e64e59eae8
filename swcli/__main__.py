"""python -m swcli: the same as the swcli console script."""

from swcli.cli import main

if __name__ == "__main__":
    main()
